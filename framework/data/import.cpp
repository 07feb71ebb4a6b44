// The common path of `tessera convert`: detect the source format, check every image against its
// camera, downscale, derive bounds and near/far, then stream the images into a SceneWriter.
#include <ATen/Parallel.h>
#include <stb/stb_image.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/data/image_io.h"
#include "framework/data/import.h"
#include "framework/data/scene_layout.h"
#include "kernels/cpu/parallel.h"

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

std::string size_text(int width, int height) {
  return std::to_string(width) + "x" + std::to_string(height);
}

std::string factor_text(double factor) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.6g", factor);
  return buffer;
}

// The integer K >= 2 for which an image of `full` x `full_h` box-downscaled by K has size
// `small` x `small_h`, each axis floored or rounded (half up); 0 when there is none. For tiny
// images several K may fit: the one whose 1/K is nearest both ratios wins.
int integer_downscale(int full, int full_h, int small, int small_h) {
  if (small < 1 || small_h < 1 || small >= full || small_h >= full_h) return 0;
  const auto fits = [](int64_t from, int64_t to, int64_t k) {
    return to == from / k || to == (2 * from + k) / (2 * k);
  };
  // floor(W / K) = w or round(W / K) = w needs W / (w + 1) < K <= W / (w - 1/2).
  const int64_t first = std::max<int64_t>(2, full / (int64_t{small} + 1) + 1);
  const int64_t last = 2 * int64_t{full} / (2 * int64_t{small} - 1);
  const double sx = static_cast<double>(small) / full, sy = static_cast<double>(small_h) / full_h;
  int best = 0;
  double best_error = 0;
  for (int64_t k = first; k <= last; ++k) {
    if (!fits(full, small, k) || !fits(full_h, small_h, k)) continue;
    const double error = std::abs(1.0 / k - sx) + std::abs(1.0 / k - sy);
    if (best == 0 || error < best_error) best = static_cast<int>(k), best_error = error;
  }
  return best;
}

// --images-scaled: `camera` (as its file gives it) rescaled to the size of its image. Pixel
// edges at integers (docs/datasets.md): a K-fold box downscale maps u to u / K exactly, so a copy
// of size floor or round (W / K) x (H / K) scales by exactly 1/K; any other size by w / W and
// h / H per axis, unless those differ by more than one pixel's worth (1/W + 1/H: each size may be
// one pixel off the exact W s, H s): that is an aspect change, not a rescale. Distortion acts on
// normalized coordinates and is kept.
Camera scale_to_image(const Camera& camera, const ImageInfo& info, const std::string& image,
                      const std::string& source) {
  const int full_w = camera.width, full_h = camera.height, w = info.width, h = info.height;
  const double sx = static_cast<double>(w) / full_w, sy = static_cast<double>(h) / full_h;
  // Each coordinate becomes value * num / den: exactly value / K on the integer path.
  double num_x = w, den_x = full_w, num_y = h, den_y = full_h;
  if (const int k = integer_downscale(full_w, full_h, w, h)) {
    num_x = num_y = 1;
    den_x = den_y = k;
  } else if (std::abs(sx - sy) > 1.0 / full_w + 1.0 / full_h) {
    throw UserError("image " + image + " is " + size_text(w, h) + " but its camera in " + source +
                    " says " + size_text(full_w, full_h) + ": --images-scaled would scale x by " +
                    factor_text(sx) + " and y by " + factor_text(sy) + ", an aspect change, not "
                    "a rescale (the two may differ by one pixel's worth, " +
                    factor_text(1.0 / full_w + 1.0 / full_h) + ")");
  }
  Camera scaled = camera;
  scaled.width = w;
  scaled.height = h;
  scaled.fx = camera.fx * num_x / den_x;
  scaled.cx = camera.cx * num_x / den_x;
  scaled.fy = camera.fy * num_y / den_y;
  scaled.cy = camera.cy * num_y / den_y;
  return scaled;
}

}  // namespace

ImageInfo probe_image(const std::string& path) {
  std::error_code error;  // a name from a dataset file may be one the OS refuses (too long...)
  if (!fs::exists(path, error))
    throw UserError("image " + path + " does not exist" + (error ? " (" + error.message() + ")" : ""));
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
  size_t rescaled = 0;  // cameras scaled to their image by --images-scaled
  for (size_t i = 0; i < parsed.cameras.size(); ++i) {
    const std::string& image = parsed.image_paths[i];
    const std::string origin = parsed.path + " (image " + image + ")";
    const ImageInfo info = probe_image(image);
    Camera full = parsed.cameras[i];  // at the size of its image
    if (info.width != full.width || info.height != full.height) {
      if (!options.images_scaled)
        throw UserError("image " + image + " is " + size_text(info.width, info.height) +
                        " but its camera in " + parsed.path + " says " +
                        size_text(full.width, full.height) + "; if the images were resized (a "
                        "downscaled copy such as images_4/), give --images-scaled to scale the "
                        "intrinsics to them");
      validate_camera(full, i, origin);
      full = scale_to_image(full, info, image, parsed.path);
      ++rescaled;
    }
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
    validate_camera(camera, i, origin);
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
  if (parsed.format == SourceFormat::Blender) {  // canonical already: fixed bounds, near, far
    meta.scene_bounds = parsed.bounds.value_or(bounds_from_cameras(scene.cameras));
    meta.scene_extent = meta.scene_bounds;
    const auto [near, far] = near_far_from_bounds(meta.scene_bounds, scene.cameras);
    meta.near = parsed.near.value_or(near);
    meta.far = parsed.far.value_or(far);
  } else {  // real captures: normalized once here, the transform recorded
    const Normalization n =
        normalization_for(scene.cameras, scene.points_xyz, parsed.ngp,
                          /*bounded=*/scene.has_alpha, options.normalize, parsed.recorded_transform);
    if (!(std::isfinite(n.scale) && n.scale > 0))
      throw UserError(parsed.path + ": the cameras and points are too far apart to normalize (the "
                      "scale to the canonical box comes out as " + std::to_string(n.scale) +
                      "); check the poses and points for huge coordinates");
    const bool finite = std::isfinite(n.near) && std::isfinite(n.far) &&
                        std::all_of(n.extent.begin(), n.extent.end(),
                                    [](double v) { return std::isfinite(v); });
    if (options.normalize && !finite)
      throw UserError(parsed.path + ": the cameras and points are too far apart to normalize (the "
                      "box that holds them or its near/far comes out non-finite); check the poses "
                      "and points for huge coordinates");
    apply_normalization(n, scene.cameras, scene.points_xyz);
    record_normalization(n, meta);
  }
  meta.background = {1.0, 1.0, 1.0};  // white, as the NeRF-synthetic scenes are composited
  meta.source = parsed.label + ":" + absolute(parsed.path);
  if (!parsed.details.empty()) meta.source += " " + parsed.details;
  if (!options.normalize) meta.source += " keep-coordinates";
  scene.points_xyz = scene.points_xyz.to(torch::kFloat32).contiguous();  // stored as float32
  if (rescaled > 0) meta.source += " images-scaled";
  if (k > 1) meta.source += " downscale=" + std::to_string(k);
  // What SceneWriter would refuse is refused here, naming the source: poses or points too far
  // apart for doubles give non-finite bounds or poses after normalization.
  const std::string origin = parsed.path + " (as imported)";
  layout::validate_meta(meta, origin);
  for (size_t i = 0; i < scene.cameras.size(); ++i) validate_camera(scene.cameras[i], i, origin);
  return scene;
}

void write_scene(const ImportedScene& scene, const std::string& out_path, const Progress& progress) {
  SceneWriter writer(out_path, scene.meta, scene.cameras, scene.has_alpha);
  const size_t total = scene.cameras.size();
  const size_t batch = static_cast<size_t>(std::max(1, at::get_num_threads() * kImagesPerThread));
  std::vector<LoadedImage> decoded(batch);
  for (size_t first = 0; first < total; first += batch) {
    const size_t count = std::min(batch, total - first);
    tessera::parallel_for(0, static_cast<int64_t>(count), 1, [&](int64_t begin, int64_t end) {
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
