// SceneReader: opens a tessera-scene file read-only, validates format, version, layout and every
// camera, and reads one image at a time (a hyperslab of one chunk, or one per-image dataset).
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/data/fingerprint.h"
#include "framework/data/h5.h"
#include "framework/data/scene.h"
#include "framework/data/scene_layout.h"

namespace tessera::data {

namespace {

std::vector<int64_t> as_shape(const std::vector<hsize_t>& dims) {
  return std::vector<int64_t>(dims.begin(), dims.end());
}

// One image store: /images/rgb or /images/alpha, uniform or per image.
struct ImageStore {
  h5::Id object;      // the [C, H, W(, K)] dataset, or the group of per-image datasets
  bool uniform = false;
  int64_t channels = 0;  // 3 for rgb, 0 (no channel dimension) for alpha
};

}  // namespace

struct SceneReader::Impl {
  std::string path;
  SceneMeta meta;
  std::vector<Camera> cameras;
  int version = 0;
  h5::Id file;
  ImageStore rgb;
  ImageStore alpha;  // object invalid without alpha
  bool has_points = false;

  [[noreturn]] void fail(const std::string& what) const { throw UserError(path + ": " + what); }

  // Opens dataset `name`, checking that it exists with the element type and the shape given
  // (-1 in `shape`: any size, returned in the result).
  h5::Id dataset(const std::string& name, h5::Type type, std::vector<int64_t>& shape) const {
    const h5::Kind kind = h5::kind_of(file.get(), name);
    if (kind != h5::Kind::Dataset)
      fail("dataset /" + name + (kind == h5::Kind::Missing ? " is missing" : " is not a dataset"));
    h5::Id opened = h5::open_dataset(file.get(), name);
    if (!h5::has_type(opened.get(), type))
      fail("dataset /" + name + " is " + h5::describe_type(opened.get()) + ", must be " +
           h5::type_name(type));
    const std::vector<int64_t> found = as_shape(h5::dims(opened.get()));
    bool match = found.size() == shape.size();
    for (size_t i = 0; match && i < shape.size(); ++i)
      match = shape[i] < 0 || shape[i] == found[i];
    if (!match) {
      std::string expected = "[";
      for (size_t i = 0; i < shape.size(); ++i)
        expected += (i ? ", " : "") + (shape[i] < 0 ? std::string("any") : std::to_string(shape[i]));
      fail("dataset /" + name + " has shape " + layout::shape_string(found) + ", expected " +
           expected + "]");
    }
    shape = found;
    return opened;
  }

  std::vector<double> float_attribute(const char* name, size_t count) const {
    if (!h5::has_attribute(file.get(), name)) fail(std::string("root attribute '") + name + "' is missing");
    const h5::AttributeInfo info = h5::attribute_info(file.get(), name);
    if (info.type_class != H5T_FLOAT || info.count != static_cast<hssize_t>(count))
      fail(std::string("root attribute '") + name + "' must be " + std::to_string(count) +
           " f64 value(s)");
    return h5::read_doubles_attribute(file.get(), name);
  }

  void read_header() {
    const std::string kind = std::string("not a ") + kSceneFormat + " file";
    if (!h5::has_attribute(file.get(), layout::kFormatAttr))
      fail(kind + " (no root attribute 'format')");
    const auto format = h5::read_string_attribute(file.get(), layout::kFormatAttr);
    if (!format) fail(kind + " (root attribute 'format' is not a string)");
    if (*format != kSceneFormat) fail(kind + " (its format is \"" + *format + "\")");
    if (!h5::has_attribute(file.get(), layout::kVersionAttr))
      fail("root attribute 'version' is missing");
    const h5::AttributeInfo info = h5::attribute_info(file.get(), layout::kVersionAttr);
    if (info.type_class != H5T_INTEGER || info.count != 1)
      fail("root attribute 'version' must be one integer");
    const int64_t found = h5::read_int_attribute(file.get(), layout::kVersionAttr)[0];
    if (found > kSceneVersion)
      fail("written as " + std::string(kSceneFormat) + " version " + std::to_string(found) +
           ", this build reads version " + std::to_string(kSceneVersion) + "; update Tessera");
    if (found < 1) fail("version " + std::to_string(found) + " is not a valid version");
    version = static_cast<int>(found);

    const std::vector<double> bounds = float_attribute(layout::kBoundsAttr, 6);
    std::copy(bounds.begin(), bounds.end(), meta.scene_bounds.begin());
    meta.near = float_attribute(layout::kNearAttr, 1)[0];
    meta.far = float_attribute(layout::kFarAttr, 1)[0];
    const std::vector<double> background = float_attribute(layout::kBackgroundAttr, 3);
    std::copy(background.begin(), background.end(), meta.background.begin());
    const auto source = h5::read_string_attribute(file.get(), layout::kSourceAttr);
    if (!source) fail("root attribute 'source' is missing or not a string");
    meta.source = *source;
    meta.scene_extent = meta.scene_bounds;  // files without the optional attributes
    if (h5::has_attribute(file.get(), layout::kExtentAttr)) {
      const std::vector<double> extent = float_attribute(layout::kExtentAttr, 6);
      std::copy(extent.begin(), extent.end(), meta.scene_extent.begin());
    }
    if (h5::has_attribute(file.get(), layout::kCaptureScaleAttr))
      meta.capture_scale = float_attribute(layout::kCaptureScaleAttr, 1)[0];
    if (h5::has_attribute(file.get(), layout::kCaptureOffsetAttr)) {
      const std::vector<double> offset = float_attribute(layout::kCaptureOffsetAttr, 3);
      std::copy(offset.begin(), offset.end(), meta.capture_offset.begin());
    }
    layout::validate_meta(meta, path);
  }

  void read_cameras() {
    std::vector<int64_t> shape = {-1, 4};
    h5::Id intrinsics_set = dataset(layout::kIntrinsics, h5::Type::F64, shape);
    const int64_t count = shape[0];
    if (count == 0) fail("the scene has no cameras");
    std::vector<int64_t> distortion_shape = {count, 4}, size_shape = {count, 2},
                         pose_shape = {count, 4, 4}, split_shape = {count};
    h5::Id distortion_set = dataset(layout::kDistortion, h5::Type::F64, distortion_shape);
    h5::Id size_set = dataset(layout::kSize, h5::Type::I32, size_shape);
    h5::Id pose_set = dataset(layout::kCameraToWorld, h5::Type::F64, pose_shape);
    h5::Id split_set = dataset(layout::kSplit, h5::Type::U8, split_shape);
    const size_t n = static_cast<size_t>(count);
    std::vector<double> intrinsics(n * 4), distortion(n * 4), poses(n * 16);
    std::vector<int32_t> sizes(n * 2);
    std::vector<uint8_t> splits(n);
    h5::read(intrinsics_set.get(), h5::Type::F64, intrinsics.data());
    h5::read(distortion_set.get(), h5::Type::F64, distortion.data());
    h5::read(size_set.get(), h5::Type::I32, sizes.data());
    h5::read(pose_set.get(), h5::Type::F64, poses.data());
    h5::read(split_set.get(), h5::Type::U8, splits.data());
    cameras.resize(n);
    for (size_t i = 0; i < n; ++i) {
      Camera& c = cameras[i];
      c.fx = intrinsics[i * 4], c.fy = intrinsics[i * 4 + 1];
      c.cx = intrinsics[i * 4 + 2], c.cy = intrinsics[i * 4 + 3];
      c.k1 = distortion[i * 4], c.k2 = distortion[i * 4 + 1];
      c.p1 = distortion[i * 4 + 2], c.p2 = distortion[i * 4 + 3];
      c.width = sizes[i * 2], c.height = sizes[i * 2 + 1];
      std::copy(poses.begin() + i * 16, poses.begin() + (i + 1) * 16, c.camera_to_world.begin());
      c.split = static_cast<Split>(splits[i]);
      validate_camera(c, i, path);
    }
  }

  // The expected shape of image `index` in `store` ([H, W, 3] or [H, W]).
  std::vector<int64_t> image_shape(const ImageStore& store, size_t index) const {
    std::vector<int64_t> shape = {cameras[index].height, cameras[index].width};
    if (store.channels > 0) shape.push_back(store.channels);
    return shape;
  }

  ImageStore open_store(const std::string& name, int64_t channels) const {
    ImageStore store;
    store.channels = channels;
    const h5::Kind kind = h5::kind_of(file.get(), name);
    if (kind == h5::Kind::Dataset) {
      store.uniform = true;
      std::vector<int64_t> shape = image_shape(store, 0);
      shape.insert(shape.begin(), static_cast<int64_t>(cameras.size()));
      store.object = dataset(name, h5::Type::U8, shape);  // every image the size of camera 0
      for (size_t i = 1; i < cameras.size(); ++i)
        if (image_shape(store, i) != image_shape(store, 0))
          fail("camera " + std::to_string(i) + " is " + std::to_string(cameras[i].width) + "x" +
               std::to_string(cameras[i].height) + " but /" + name + " holds " +
               std::to_string(cameras[0].width) + "x" + std::to_string(cameras[0].height) +
               " images (cameras of different sizes need per-image datasets)");
    } else if (kind == h5::Kind::Group) {
      for (size_t i = 0; i < cameras.size(); ++i) {
        std::vector<int64_t> shape = image_shape(store, i);
        dataset(name + "/" + layout::image_name(i), h5::Type::U8, shape);
      }
      store.object = h5::open_group(file.get(), name);
    } else {
      fail("/" + name + (kind == h5::Kind::Missing ? " is missing" : " is neither a dataset nor a group"));
    }
    return store;
  }

  // A points dataset, whole (its shape was checked when the scene was opened).
  torch::Tensor read_points(const char* name, h5::Type type, torch::ScalarType dtype) const {
    try {
      h5::Id dataset = h5::open_dataset(file.get(), name);
      torch::Tensor points = torch::empty(as_shape(h5::dims(dataset.get())), dtype);
      h5::read(dataset.get(), type, points.data_ptr());
      return points;
    } catch (const UserError&) {
      throw;
    } catch (const std::runtime_error& e) {
      fail(std::string("cannot read /") + name + " (is the file damaged? convert it again): " + e.what());
    }
  }

  torch::Tensor read(const ImageStore& store, size_t index, const char* what) const {
    if (index >= cameras.size())
      throw std::out_of_range(path + ": " + what + " " + std::to_string(index) +
                              " is out of range (the scene has " + std::to_string(cameras.size()) +
                              " cameras)");
    const std::vector<int64_t> shape = image_shape(store, index);
    torch::Tensor image = torch::empty(shape, torch::kUInt8);
    try {
      if (store.uniform) {
        // Only the chunk of this image is read and decompressed: one image per chunk.
        std::vector<hsize_t> start(shape.size() + 1, 0), count(shape.begin(), shape.end());
        start[0] = index;
        count.insert(count.begin(), 1);
        h5::read_block(store.object.get(), h5::Type::U8, start, count, image.data_ptr());
      } else {
        h5::Id dataset = h5::open_dataset(store.object.get(), layout::image_name(index));
        h5::read(dataset.get(), h5::Type::U8, image.data_ptr());
      }
    } catch (const UserError&) {
      throw;
    } catch (const std::runtime_error& e) {
      fail(std::string("cannot read ") + what + " " + std::to_string(index) +
           " (is the file damaged? convert it again): " + e.what());
    }
    return image;
  }
};

SceneReader::SceneReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  Impl& r = *impl_;
  r.path = path;
  r.file = h5::open_file_read_only(path);
  try {
    r.read_header();
    r.read_cameras();
    r.rgb = r.open_store(layout::kRgb, 3);
    if (h5::kind_of(r.file.get(), layout::kAlpha) != h5::Kind::Missing)
      r.alpha = r.open_store(layout::kAlpha, 0);
    if (h5::kind_of(r.file.get(), layout::kPoints) != h5::Kind::Missing) {
      std::vector<int64_t> xyz_shape = {-1, 3};
      r.dataset(layout::kPointsXyz, h5::Type::F32, xyz_shape);
      std::vector<int64_t> rgb_shape = {xyz_shape[0], 3};
      r.dataset(layout::kPointsRgb, h5::Type::U8, rgb_shape);
      r.has_points = true;
    }
  } catch (const UserError&) {
    throw;
  } catch (const std::runtime_error& e) {
    // HDF5 opened the file but could not read its metadata: damaged past the superblock.
    r.fail(std::string("cannot read the dataset's metadata (damaged file?): ") + e.what());
  }
}

SceneReader::~SceneReader() = default;

const std::string& SceneReader::path() const { return impl_->path; }
const SceneMeta& SceneReader::meta() const { return impl_->meta; }
const std::vector<Camera>& SceneReader::cameras() const { return impl_->cameras; }
int SceneReader::version() const { return impl_->version; }
bool SceneReader::has_alpha() const { return impl_->alpha.object.valid(); }
bool SceneReader::has_points() const { return impl_->has_points; }
bool SceneReader::uniform_size() const { return impl_->rgb.uniform; }

torch::Tensor SceneReader::read_image(size_t index) const {
  return impl_->read(impl_->rgb, index, "image");
}

torch::Tensor SceneReader::read_image_over_background(size_t index) const {
  torch::Tensor rgb = read_image(index).to(torch::kFloat32) / 255.0f;
  if (!has_alpha()) return rgb;
  const torch::Tensor a = read_alpha(index).to(torch::kFloat32).unsqueeze(2) / 255.0f;
  const auto& bg = meta().background;
  const torch::Tensor b = torch::tensor({static_cast<float>(bg[0]), static_cast<float>(bg[1]),
                                         static_cast<float>(bg[2])});
  return rgb * a + b * (1.0f - a);
}

torch::Tensor SceneReader::read_alpha(size_t index) const {
  if (!has_alpha()) throw std::logic_error(impl_->path + ": read_alpha on a scene without alpha");
  return impl_->read(impl_->alpha, index, "alpha");
}

torch::Tensor SceneReader::read_points_xyz() const {
  if (!impl_->has_points) return torch::empty({0, 3}, torch::kFloat32);
  return impl_->read_points(layout::kPointsXyz, h5::Type::F32, torch::kFloat32);
}

torch::Tensor SceneReader::read_points_rgb() const {
  if (!impl_->has_points) return torch::empty({0, 3}, torch::kUInt8);
  return impl_->read_points(layout::kPointsRgb, h5::Type::U8, torch::kUInt8);
}

std::vector<size_t> SceneReader::indices(Split split) const {
  std::vector<size_t> result;
  for (size_t i = 0; i < impl_->cameras.size(); ++i)
    if (impl_->cameras[i].split == split) result.push_back(i);
  return result;
}

std::string SceneReader::fingerprint() const {
  std::ostringstream text;
  text.precision(17);
  const auto& m = meta();
  for (double b : m.scene_bounds) text << b << ',';
  text << m.near << ',' << m.far << ';';
  for (const auto& c : cameras()) {
    text << c.fx << ',' << c.fy << ',' << c.cx << ',' << c.cy << ',' << c.width << ','
         << c.height << ',' << static_cast<int>(c.split);
    for (double v : c.camera_to_world) text << ',' << v;
    text << ';';
  }
  return fingerprint_hex(text.str());
}

std::string SceneReader::summary() const { return std::to_string(cameras().size()) + " cameras"; }

}  // namespace tessera::data
