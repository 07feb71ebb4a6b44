// The common path of `tessera convert`: detect the source format, check every image against its
// camera, downscale, derive bounds and near/far, then stream the images into a SceneWriter.
#include <ATen/Parallel.h>
#include <stb/stb_image.h>

#include <algorithm>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/data/import.h"

namespace tessera::data {

namespace fs = std::filesystem;

namespace {

// Images decoded at once per worker thread: enough to keep the threads busy, few enough that a
// batch of large images stays small next to RAM.
constexpr int kImagesPerThread = 2;
// Where COLMAP models are looked for under INPUT, in this order (COLMAP's and nerfstudio's
// layouts first).
constexpr const char* kColmapFolders[] = {"sparse/0", "sparse", "."};

struct Located {
  SourceFormat format;
  std::string path;  // Blender: folder; Transforms: the json file; COLMAP: the model folder
};

bool has_colmap_model(const fs::path& dir) {
  return (fs::exists(dir / "cameras.bin") && fs::exists(dir / "images.bin")) ||
         (fs::exists(dir / "cameras.txt") && fs::exists(dir / "images.txt"));
}

Located locate(const std::string& input) {
  const fs::path in(input);
  if (!fs::exists(in)) throw UserError(input + " does not exist");
  if (fs::is_regular_file(in)) {
    const std::string name = in.filename().string();
    if (name.rfind("transforms_", 0) == 0 && in.extension() == ".json" &&
        fs::exists(in.parent_path() / "transforms_train.json"))
      return {SourceFormat::Blender, in.parent_path().string()};
    if (in.extension() == ".json") return {SourceFormat::Transforms, input};
    const std::string hint = in.extension() == ".h5"
                                 ? " (to export a tessera-scene file, use --to nerfstudio DIR)"
                                 : "";
    throw UserError(input + " is not a dataset Tessera can import: give a folder, or a "
                    "transforms.json (nerfstudio/instant-ngp) file" + hint);
  }
  if (fs::exists(in / "transforms_train.json")) return {SourceFormat::Blender, input};
  if (fs::exists(in / "transforms.json"))
    return {SourceFormat::Transforms, (in / "transforms.json").string()};
  for (const char* sub : kColmapFolders)
    if (has_colmap_model(in / sub))
      return {SourceFormat::Colmap, (in / sub).lexically_normal().string()};
  throw UserError("no dataset recognized in " + input + ": looked for transforms_train.json "
                  "(Blender/NeRF-synthetic), transforms.json (nerfstudio/instant-ngp) and a "
                  "COLMAP model (cameras.bin + images.bin, or cameras.txt + images.txt) in " +
                  input + "/sparse/0, " + input + "/sparse and " + input);
}

std::string absolute(const std::string& path) {
  std::error_code ignored;
  const fs::path full = fs::absolute(path, ignored);
  return full.empty() ? path : full.lexically_normal().string();
}

// Box downscale of straight (not premultiplied) color weighted by alpha, so that the color of
// transparent pixels does not bleed into the edges; plain box mean where a block is all clear.
torch::Tensor downscale_under_alpha(const torch::Tensor& rgb, const torch::Tensor& alpha, int k) {
  const int64_t h = rgb.size(0) / k, w = rgb.size(1) / k;
  const torch::Tensor a = alpha.slice(0, 0, h * k).slice(1, 0, w * k).to(torch::kInt64);
  const torch::Tensor c = rgb.slice(0, 0, h * k).slice(1, 0, w * k).to(torch::kInt64);
  const torch::Tensor weighted = (c * a.unsqueeze(2)).reshape({h, k, w, k, 3}).sum({1, 3});
  const torch::Tensor weight = a.reshape({h, k, w, k}).sum({1, 3}).unsqueeze(2);
  const torch::Tensor mean = torch::div(weighted + weight / 2, weight.clamp_min(1), "floor");
  return torch::where(weight > 0, mean, downscale(rgb, k).to(torch::kInt64))
      .to(torch::kUInt8)
      .contiguous();
}

}  // namespace

ImageInfo probe_image(const std::string& path) {
  if (!fs::exists(path)) throw UserError("image " + path + " does not exist");
  ImageInfo info;
  if (!stbi_info(path.c_str(), &info.width, &info.height, &info.channels)) {
    const char* reason = stbi_failure_reason();
    throw UserError("image " + path + " is not a readable PNG or JPEG (" +
                    (reason ? reason : "cannot open") + ")");
  }
  return info;
}

SourceFormat detect_format(const std::string& input) { return locate(input).format; }

ImportedScene read_source(const std::string& input, const ImportOptions& options) {
  if (options.downscale < 1) throw UserError("--downscale must be an integer >= 1");
  if (options.split_every < 2) throw UserError("--split-every must be an integer >= 2");
  const Located found = locate(input);
  if (!options.images_dir.empty() && found.format != SourceFormat::Colmap)
    throw UserError("--images applies to COLMAP models only, but " + input + " is " +
                    to_string(found.format));
  switch (found.format) {
    case SourceFormat::Blender: return finish_import(parse_blender(found.path), options);
    case SourceFormat::Transforms:
      return finish_import(parse_transforms(found.path, options.split_every), options);
    case SourceFormat::Colmap: {
      const std::string images = absolute(
          options.images_dir.empty() ? (fs::path(input) / "images").string() : options.images_dir);
      if (!fs::is_directory(images))
        throw UserError("COLMAP images folder " + images + " does not exist; give it with "
                        "--images DIR");
      return finish_import(parse_colmap(found.path, images, options.split_every), options);
    }
  }
  throw std::logic_error("read_source: unknown format");
}

ImportedScene finish_import(ParsedSource parsed, const ImportOptions& options) {
  const int k = options.downscale;
  if (k < 1) throw UserError("--downscale must be an integer >= 1");
  ImportedScene scene;
  scene.format = parsed.format;
  scene.downscale = k;
  scene.image_paths = parsed.image_paths;
  for (size_t i = 0; i < parsed.cameras.size(); ++i) {
    const Camera& full = parsed.cameras[i];
    const std::string& image = parsed.image_paths[i];
    const ImageInfo info = probe_image(image);
    if (info.width != full.width || info.height != full.height)
      throw UserError("image " + image + " is " + std::to_string(info.width) + "x" +
                      std::to_string(info.height) + " but its camera in " + parsed.path +
                      " says " + std::to_string(full.width) + "x" + std::to_string(full.height));
    scene.has_alpha = scene.has_alpha || info.has_alpha();
    // Pixel (i, j) covers [i, i+1) x [j, j+1), its center at +0.5 (nerfstudio, COLMAP, Blender):
    // then output pixel i covers input pixels [K i, K i + K) and every coordinate scales by 1/K.
    Camera camera = full;
    camera.width = full.width / k;
    camera.height = full.height / k;
    if (camera.width == 0 || camera.height == 0)
      throw UserError("image " + image + " (" + std::to_string(full.width) + "x" +
                      std::to_string(full.height) + ") is smaller than --downscale " +
                      std::to_string(k));
    camera.fx /= k;
    camera.fy /= k;
    camera.cx /= k;
    camera.cy /= k;
    validate_camera(camera, i, parsed.path + " (image " + image + ")");
    scene.cameras.push_back(camera);
  }
  if (scene.cameras.empty()) throw UserError(parsed.path + ": no cameras");
  if (std::none_of(scene.cameras.begin(), scene.cameras.end(),
                   [](const Camera& c) { return c.split == Split::Train; }))
    throw UserError(parsed.path + ": no camera is in the train split (" +
                    std::to_string(scene.cameras.size()) + " cameras)");

  scene.points_xyz = parsed.points_xyz.defined() ? parsed.points_xyz
                                                 : torch::zeros({0, 3}, torch::kFloat32);
  scene.points_rgb = parsed.points_rgb.defined() ? parsed.points_rgb
                                                 : torch::zeros({0, 3}, torch::kUInt8);
  SceneMeta& meta = scene.meta;
  if (parsed.bounds) meta.scene_bounds = *parsed.bounds;
  else if (scene.points_xyz.size(0) > 0) meta.scene_bounds = bounds_from_points(scene.points_xyz);
  else meta.scene_bounds = bounds_from_cameras(scene.cameras);
  const auto [near, far] = near_far_from_bounds(meta.scene_bounds, scene.cameras);
  meta.near = parsed.near.value_or(near);
  meta.far = parsed.far.value_or(far);
  meta.background = {1.0, 1.0, 1.0};  // white, as the NeRF-synthetic scenes are composited
  meta.source = parsed.label + ":" + absolute(parsed.path);
  if (!parsed.details.empty()) meta.source += " " + parsed.details;
  if (k > 1) meta.source += " downscale=" + std::to_string(k);
  return scene;
}

void write_scene(const ImportedScene& scene, const std::string& out_path, const Progress& progress) {
  SceneWriter writer(out_path, scene.meta, scene.cameras, scene.has_alpha);
  const size_t total = scene.cameras.size();
  const size_t batch = static_cast<size_t>(std::max(1, at::get_num_threads() * kImagesPerThread));
  std::vector<LoadedImage> decoded(batch);
  for (size_t first = 0; first < total; first += batch) {
    const size_t count = std::min(batch, total - first);
    at::parallel_for(0, static_cast<int64_t>(count), 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const size_t i = first + static_cast<size_t>(j);
        LoadedImage image = read_image_file(scene.image_paths[i]);
        const int k = scene.downscale;
        if (image.rgb.size(1) / k != scene.cameras[i].width ||
            image.rgb.size(0) / k != scene.cameras[i].height)
          throw UserError("image " + scene.image_paths[i] + " changed size while converting");
        if (scene.has_alpha && !image.alpha.defined())
          image.alpha = torch::full({image.rgb.size(0), image.rgb.size(1)}, 255, torch::kUInt8);
        if (k > 1) {
          image.rgb = image.alpha.defined() ? downscale_under_alpha(image.rgb, image.alpha, k)
                                            : downscale(image.rgb, k);
          if (image.alpha.defined()) image.alpha = downscale(image.alpha, k);
        }
        decoded[static_cast<size_t>(j)] = std::move(image);
      }
    });
    for (size_t j = 0; j < count; ++j) {
      writer.write_image(first + j, decoded[j].rgb, decoded[j].alpha);
      decoded[j] = LoadedImage{};
      if (progress) progress(first + j + 1, total);
    }
  }
  if (scene.points_xyz.size(0) > 0) writer.write_points(scene.points_xyz, scene.points_rgb);
  writer.commit();
}

}  // namespace tessera::data
