// ModelRegistry: builds a Model from config.model.name; unknown names list the known ones.
#include <algorithm>
#include <cmath>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/scene.h"
#include "models/nerf/ray_model.h"

namespace tessera::models::nerf {

RayBatch narrow_rays(const RayBatch& rays, int64_t begin, int64_t count) {
  auto part = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, begin, count) : t; };
  RayBatch out = rays;
  out.origins = part(rays.origins);
  out.directions = part(rays.directions);
  out.near = part(rays.near);
  out.far = part(rays.far);
  out.target_rgb = part(rays.target_rgb);
  if (rays.background.defined() && rays.background.dim() == 2) out.background = part(rays.background);
  out.ray_ids = part(rays.ray_ids);
  return out;
}

ModelContext ModelContext::from_scene(const data::SceneReader& scene, torch::Device device) {
  const data::SceneMeta& meta = scene.meta();
  ModelContext context;
  context.scene_bounds = meta.scene_bounds;
  const auto& b = meta.scene_bounds;
  // The box of the camera centers, and each camera's pixel footprint at the box's center.
  bool first = true;
  std::vector<double> footprints;
  for (const data::Camera& camera : scene.cameras()) {
    double d2 = 0;
    for (int a = 0; a < 3; ++a) {
      const double c = camera.camera_to_world[4 * a + 3];
      context.camera_bounds[a] = first ? c : std::min(context.camera_bounds[a], c);
      context.camera_bounds[a + 3] = first ? c : std::max(context.camera_bounds[a + 3], c);
      const double d = c - 0.5 * (b[a] + b[a + 3]);
      d2 += d * d;
    }
    first = false;
    footprints.push_back(std::sqrt(d2) / std::sqrt(camera.fx * camera.fy));
    if (camera.split == data::Split::Train)
      context.train_pixels += int64_t{camera.width} * int64_t{camera.height};
  }
  if (!footprints.empty()) {
    std::nth_element(footprints.begin(), footprints.begin() + footprints.size() / 2, footprints.end());
    context.pixel_footprint = footprints[footprints.size() / 2];
  }
  context.scene_extent = meta.scene_extent;
  context.near = meta.near;
  context.far = meta.far;
  context.device = device;
  return context;
}

bool ModelContext::unbounded() const {
  if (scene_extent == std::array<double, 6>{}) return false;
  for (int a = 0; a < 3; ++a)
    if (scene_extent[a] < scene_bounds[a] || scene_extent[a + 3] > scene_bounds[a + 3]) return true;
  return false;
}

void ModelRegistry::add(const std::string& name, ModelFactory factory) {
  if (contains(name)) throw std::logic_error("model '" + name + "' registered twice");
  factories_.emplace_back(name, std::move(factory));
}

bool ModelRegistry::contains(const std::string& name) const {
  return std::any_of(factories_.begin(), factories_.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

std::vector<std::string> ModelRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& entry : factories_) out.push_back(entry.first);
  std::sort(out.begin(), out.end());
  return out;
}

void ModelRegistry::require(const std::string& name, const std::string& origin) const {
  if (contains(name)) return;
  std::string known;
  for (const std::string& entry : names()) known += (known.empty() ? "" : ", ") + entry;
  if (known.empty()) known = "none in this build yet";
  throw UserError(origin + ": unknown model.name '" + name + "' (known: " + known + ")");
}

std::unique_ptr<Model> ModelRegistry::create(const Config& config,
                                             const ModelContext& context) const {
  require(config.model.name, config.source_path);
  for (const auto& [name, factory] : factories_)
    if (name == config.model.name) return factory(config, context);
  return nullptr;  // unreachable: require() threw
}

}  // namespace tessera::models::nerf
