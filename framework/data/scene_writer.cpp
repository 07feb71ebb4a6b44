// SceneWriter: writes a tessera-scene v2 file under a temporary name in the target directory and
// seals it and renames it into place on commit(), so readers never see a half-written dataset.
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/data/file_seal.h"
#include "framework/data/h5.h"
#include "framework/data/scene.h"
#include "framework/data/scene_layout.h"

namespace tessera::data {

namespace {

std::string dtype_name(const torch::Tensor& t) {
  if (!t.defined()) return "undefined";
  switch (t.scalar_type()) {
    case torch::kUInt8: return "uint8";
    case torch::kFloat32: return "float32";
    case torch::kFloat64: return "float64";
    case torch::kInt32: return "int32";
    case torch::kInt64: return "int64";
    default: return c10::toString(t.scalar_type());
  }
}

std::string describe(const torch::Tensor& t) {
  if (!t.defined()) return "no tensor";
  return layout::shape_string(t.sizes().vec()) + " " + dtype_name(t);
}

bool has_shape(const torch::Tensor& t, torch::ScalarType dtype, const std::vector<int64_t>& shape) {
  return t.defined() && t.scalar_type() == dtype && t.sizes().vec() == shape;
}

}  // namespace

struct SceneWriter::Impl {
  std::string path;
  std::string temp_path;
  std::vector<Camera> cameras;
  bool with_alpha = false;
  bool uniform = false;  // one [C, H, W, 3] dataset; else per-image datasets in a group
  h5::Id file;
  h5::Id rgb;    // dataset (uniform) or group
  h5::Id alpha;  // dataset (uniform) or group; invalid without alpha
  std::vector<bool> written;
  bool points_written = false;
  bool committed = false;

  ~Impl() {
    alpha.reset();
    rgb.reset();
    file.reset();
    if (!committed && !temp_path.empty()) {
      std::error_code ignored;
      std::filesystem::remove(temp_path, ignored);
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw UserError(path + ": " + what); }

  void write_cameras() {
    const size_t count = cameras.size();
    std::vector<double> intrinsics, distortion, camera_to_world;
    std::vector<int32_t> size;
    std::vector<uint8_t> split;
    for (const Camera& c : cameras) {
      intrinsics.insert(intrinsics.end(), {c.fx, c.fy, c.cx, c.cy});
      distortion.insert(distortion.end(), {c.k1, c.k2, c.p1, c.p2});
      size.insert(size.end(), {c.width, c.height});
      camera_to_world.insert(camera_to_world.end(), c.camera_to_world.begin(),
                             c.camera_to_world.end());
      split.push_back(static_cast<uint8_t>(c.split));
    }
    h5::create_group(file.get(), layout::kCameras);
    auto put = [&](const char* name, h5::Type type, std::vector<hsize_t> dims, const void* data) {
      h5::write(h5::create_dataset(file.get(), name, type, dims).get(), type, data);
    };
    put(layout::kIntrinsics, h5::Type::F64, {count, 4}, intrinsics.data());
    put(layout::kDistortion, h5::Type::F64, {count, 4}, distortion.data());
    put(layout::kSize, h5::Type::I32, {count, 2}, size.data());
    put(layout::kCameraToWorld, h5::Type::F64, {count, 4, 4}, camera_to_world.data());
    put(layout::kSplit, h5::Type::U8, {count}, split.data());
  }

  // The uniform dataset [C, H, W(, channels)] chunked one image per chunk, or an empty group.
  h5::Id create_image_store(const char* name, hsize_t channels) {
    if (!uniform) return h5::create_group(file.get(), name);
    std::vector<hsize_t> dims = {cameras.size(), static_cast<hsize_t>(cameras[0].height),
                                 static_cast<hsize_t>(cameras[0].width)};
    if (channels > 0) dims.push_back(channels);
    std::vector<hsize_t> chunk = dims;
    chunk[0] = 1;
    return h5::create_dataset(file.get(), name, h5::Type::U8, dims, chunk, layout::kDeflateLevel);
  }

  // Writes one image ([H, W] or [H, W, 3] uint8, contiguous on the CPU) into `store`.
  void put_image(const h5::Id& store, size_t index, const torch::Tensor& image) {
    std::vector<hsize_t> dims(image.sizes().begin(), image.sizes().end());
    if (uniform) {
      std::vector<hsize_t> start(dims.size() + 1, 0), count = dims;
      start[0] = index;
      count.insert(count.begin(), 1);
      h5::write_block(store.get(), h5::Type::U8, start, count, image.data_ptr());
    } else {
      h5::Id dataset = h5::create_dataset(store.get(), layout::image_name(index), h5::Type::U8,
                                          dims, dims, layout::kDeflateLevel);
      h5::write(dataset.get(), h5::Type::U8, image.data_ptr());
    }
  }
};

SceneWriter::SceneWriter(const std::string& path, const SceneMeta& given,
                         const std::vector<Camera>& cameras, bool with_alpha)
    : impl_(std::make_unique<Impl>()) {
  Impl& w = *impl_;
  SceneMeta meta = given;
  if (meta.scene_extent == std::array<double, 6>{}) meta.scene_extent = meta.scene_bounds;  // unset
  w.path = path;
  w.cameras = cameras;
  w.with_alpha = with_alpha;
  if (cameras.empty()) w.fail("a scene needs at least one camera");
  layout::validate_meta(meta, path);
  for (size_t i = 0; i < cameras.size(); ++i) validate_camera(cameras[i], i, path);
  w.uniform = true;
  for (const Camera& c : cameras)
    w.uniform = w.uniform && c.width == cameras[0].width && c.height == cameras[0].height;
  w.written.assign(cameras.size(), false);

  // Same directory as `path`, so that the final rename stays on one filesystem (atomic).
  w.temp_path = path + ".tmp-" + std::to_string(::getpid());
  w.file = h5::create_file(w.temp_path);
  const hid_t root = w.file.get();
  h5::write_string_attribute(root, layout::kFormatAttr, kSceneFormat);
  h5::write_int_attribute(root, layout::kVersionAttr, kSceneVersion);
  h5::write_doubles_attribute(root, layout::kBoundsAttr,
                              {meta.scene_bounds.begin(), meta.scene_bounds.end()});
  h5::write_double_attribute(root, layout::kNearAttr, meta.near);
  h5::write_double_attribute(root, layout::kFarAttr, meta.far);
  h5::write_doubles_attribute(root, layout::kBackgroundAttr,
                              {meta.background.begin(), meta.background.end()});
  h5::write_string_attribute(root, layout::kSourceAttr, meta.source);
  h5::write_doubles_attribute(root, layout::kExtentAttr,
                              {meta.scene_extent.begin(), meta.scene_extent.end()});
  h5::write_double_attribute(root, layout::kCaptureScaleAttr, meta.capture_scale);
  h5::write_doubles_attribute(root, layout::kCaptureOffsetAttr,
                              {meta.capture_offset.begin(), meta.capture_offset.end()});
  w.write_cameras();
  h5::create_group(root, layout::kImages);
  w.rgb = w.create_image_store(layout::kRgb, 3);
  if (with_alpha) w.alpha = w.create_image_store(layout::kAlpha, 0);
}

SceneWriter::~SceneWriter() = default;

void SceneWriter::write_image(size_t index, const torch::Tensor& rgb, const torch::Tensor& alpha) {
  Impl& w = *impl_;
  if (w.committed) throw std::logic_error(w.path + ": SceneWriter::write_image after commit()");
  if (index >= w.cameras.size())
    w.fail("image index " + std::to_string(index) + " is out of range (the scene has " +
           std::to_string(w.cameras.size()) + " cameras)");
  const std::string which = "image " + std::to_string(index);
  if (w.written[index]) w.fail(which + " was already written (each image is written once)");
  const Camera& camera = w.cameras[index];
  const std::vector<int64_t> hw = {camera.height, camera.width};
  const std::vector<int64_t> rgb_shape = {camera.height, camera.width, 3};
  if (!has_shape(rgb, torch::kUInt8, rgb_shape))
    w.fail(which + ": rgb is " + describe(rgb) + " but camera " + std::to_string(index) + " (" +
           std::to_string(camera.width) + "x" + std::to_string(camera.height) + ") needs " +
           layout::shape_string(rgb_shape) + " uint8 (height, width, RGB)");
  if (w.with_alpha != alpha.defined())
    w.fail(which + (w.with_alpha ? ": no alpha given, but the writer was created with alpha"
                                 : ": alpha given, but the writer was created without alpha"));
  if (alpha.defined() && !has_shape(alpha, torch::kUInt8, hw))
    w.fail(which + ": alpha is " + describe(alpha) + " but camera " + std::to_string(index) +
           " needs " + layout::shape_string(hw) + " uint8 (height, width)");
  w.put_image(w.rgb, index, rgb.to(torch::kCPU).contiguous());
  if (alpha.defined()) w.put_image(w.alpha, index, alpha.to(torch::kCPU).contiguous());
  w.written[index] = true;
}

void SceneWriter::write_points(const torch::Tensor& xyz, const torch::Tensor& rgb) {
  Impl& w = *impl_;
  if (w.committed) throw std::logic_error(w.path + ": SceneWriter::write_points after commit()");
  if (w.points_written) w.fail("points were already written (at most once)");
  if (!xyz.defined() || xyz.scalar_type() != torch::kFloat32 || xyz.dim() != 2 ||
      xyz.size(1) != 3)
    w.fail("points xyz is " + describe(xyz) + ", needs [P, 3] float32");
  const int64_t count = xyz.size(0);
  if (!has_shape(rgb, torch::kUInt8, {count, 3}))
    w.fail("points rgb is " + describe(rgb) + ", needs " + layout::shape_string({count, 3}) +
           " uint8 (one colour per point)");
  const torch::Tensor xyz_cpu = xyz.to(torch::kCPU).contiguous();
  if (!torch::isfinite(xyz_cpu).all().item<bool>()) w.fail("points xyz has non-finite values");
  w.points_written = true;
  if (count == 0) return;  // no points: /points is not written (has_points() is false)
  const hsize_t rows = static_cast<hsize_t>(count);
  const std::vector<hsize_t> dims = {rows, 3}, chunk = {std::min(rows, layout::kPointsChunkRows), 3};
  h5::create_group(w.file.get(), layout::kPoints);
  h5::write(h5::create_dataset(w.file.get(), layout::kPointsXyz, h5::Type::F32, dims, chunk,
                               layout::kDeflateLevel).get(),
            h5::Type::F32, xyz_cpu.data_ptr());
  h5::write(h5::create_dataset(w.file.get(), layout::kPointsRgb, h5::Type::U8, dims, chunk,
                               layout::kDeflateLevel).get(),
            h5::Type::U8, rgb.to(torch::kCPU).contiguous().data_ptr());
}

void SceneWriter::commit() {
  Impl& w = *impl_;
  if (w.committed) throw std::logic_error(w.path + ": SceneWriter::commit() called twice");
  std::vector<size_t> missing;
  for (size_t i = 0; i < w.written.size(); ++i)
    if (!w.written[i]) missing.push_back(i);
  if (!missing.empty()) {
    constexpr size_t kListed = 10;  // enough to see a pattern, short enough to read
    std::string list;
    for (size_t i = 0; i < missing.size() && i < kListed; ++i)
      list += (i ? ", " : "") + std::to_string(missing[i]);
    if (missing.size() > kListed) list += ", ...";
    w.fail("cannot commit: " + std::to_string(missing.size()) + " of " +
           std::to_string(w.written.size()) + " images were not written (" + list + ")");
  }
  w.alpha.close();
  w.rgb.close();
  h5::flush(w.file.get());
  w.file.close();
  seal::seal(w.temp_path);
  std::filesystem::rename(w.temp_path, w.path);
  w.committed = true;
}

}  // namespace tessera::data
