// Tests of the tessera-scene v2 format: round trips, the layout on disk (raw HDF5 API), reading
// one image only, bad files, writer misuse, and `tessera info` through the real binary.
#include <hdf5.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <algorithm>

#include <gtest/gtest.h>

#include "distributed/errors.h"
#include "framework/data/file_seal.h"
#include "framework/data/scene.h"
#include "framework/data/shapes.h"
#include "tests/test_util.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

// ---- Deterministic scenes ---------------------------------------------------------------------

// A proper rotation (Rodrigues, axis (1, 2, 3)) and a translation that differ per camera.
Camera make_camera(size_t i, int32_t width, int32_t height, bool distorted) {
  Camera c;
  c.fx = 100.0 + 7.5 * i, c.fy = c.fx * 1.01, c.cx = width / 2.0 + 0.25 * i, c.cy = height / 2.0;
  if (distorted) c.k1 = 0.01 * (i + 1), c.k2 = -0.001 * i, c.p1 = 1e-4 * i, c.p2 = -2e-4;
  c.width = width, c.height = height;
  const double n = std::sqrt(14.0), a[3] = {1 / n, 2 / n, 3 / n}, t = 0.3 * (i + 1);
  const double s = std::sin(t), k = 1 - std::cos(t);
  const double r[9] = {1 - k * (a[1] * a[1] + a[2] * a[2]), -s * a[2] + k * a[0] * a[1],
                       s * a[1] + k * a[0] * a[2],           s * a[2] + k * a[0] * a[1],
                       1 - k * (a[0] * a[0] + a[2] * a[2]), -s * a[0] + k * a[1] * a[2],
                       -s * a[1] + k * a[0] * a[2],          s * a[0] + k * a[1] * a[2],
                       1 - k * (a[0] * a[0] + a[1] * a[1])};
  for (int row = 0; row < 3; ++row)
    for (int col = 0; col < 3; ++col) c.camera_to_world[row * 4 + col] = r[row * 3 + col];
  c.camera_to_world[3] = 1.0 * i, c.camera_to_world[7] = -0.5 * i, c.camera_to_world[11] = 4 + 0.1 * i;
  c.split = i % 5 == 3 ? Split::Val : i % 5 == 4 ? Split::Test : Split::Train;
  return c;
}

// Values mod 251 (a prime) so that neighbouring images and channels differ.
torch::Tensor pattern(size_t i, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return ((torch::arange(n, torch::kInt64) * 7 + static_cast<int64_t>(i) * 31) % 251)
      .to(torch::kUInt8)
      .reshape(shape);
}
torch::Tensor rgb_for(const Camera& c, size_t i) { return pattern(i, {c.height, c.width, 3}); }
torch::Tensor alpha_for(const Camera& c, size_t i) { return pattern(i + 1000, {c.height, c.width}); }

SceneMeta make_meta() {
  SceneMeta meta;
  meta.scene_bounds = {-1, -2, -3, 1, 2, 3};
  meta.near = 0.5, meta.far = 6.25;
  meta.background = {0.25, 0.5, 1};
  meta.source = "test:round-trip";
  return meta;
}

constexpr int64_t kPointCount = 50;
torch::Tensor points_xyz() { return torch::arange(kPointCount * 3, torch::kFloat32).reshape({-1, 3}) * 0.25f; }
torch::Tensor points_rgb() { return pattern(7, {kPointCount, 3}); }

// `sizes`: (width, height) per camera.
std::vector<Camera> make_cameras(const std::vector<std::pair<int, int>>& sizes, bool distorted) {
  std::vector<Camera> cameras;
  for (size_t i = 0; i < sizes.size(); ++i)
    cameras.push_back(make_camera(i, sizes[i].first, sizes[i].second, distorted));
  return cameras;
}
std::vector<Camera> uniform_cameras(size_t count) {
  return make_cameras(std::vector<std::pair<int, int>>(count, {12, 8}), true);
}
std::vector<Camera> mixed_cameras() {
  return make_cameras({{12, 8}, {7, 5}, {12, 8}, {16, 3}, {7, 5}, {9, 9}}, false);
}

// Writes every image (in reverse order: any order is allowed), alpha and points when asked.
void write_scene(const std::string& path, const std::vector<Camera>& cameras, bool alpha,
                 bool points, const SceneMeta& meta = make_meta()) {
  SceneWriter writer(path, meta, cameras, alpha);
  for (size_t i = cameras.size(); i-- > 0;)
    writer.write_image(i, rgb_for(cameras[i], i), alpha ? alpha_for(cameras[i], i) : torch::Tensor());
  if (points) writer.write_points(points_xyz(), points_rgb());
  writer.commit();
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// Runs `f`, expecting a UserError whose message contains every one of `needles`.
void expect_user_error(const std::function<void()>& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no UserError thrown; expected one mentioning " << needles[0];
  } catch (const UserError& e) {
    for (const auto& needle : needles)
      EXPECT_TRUE(contains(e.what(), needle)) << "message: " << e.what() << "\nmissing: " << needle;
  }
}

// ---- Raw HDF5 helpers (independent of the code under test but for the seal) --------------------

// A file opened or created with the HDF5 API, as another program would. One opened for writing,
// or created (with room for the seal, as Tessera's writers make them), is sealed again when
// closed, so that the reader's own checks are reached instead of the seal's.
struct RawFile {
  hid_t id;
  std::string path;
  bool reseal;
  RawFile(const std::string& path, unsigned flags)
      : id(H5Fopen(path.c_str(), flags, H5P_DEFAULT)), path(path), reseal(flags & H5F_ACC_RDWR) {}
  static RawFile create(const std::string& path) {
    const hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    H5Pset_userblock(fcpl, seal::kBlockBytes);
    RawFile file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT), path);
    H5Pclose(fcpl);
    return file;
  }
  RawFile(RawFile&& other) noexcept : id(other.id), path(other.path), reseal(other.reseal) {
    other.id = -1;
    other.reseal = false;
  }
  ~RawFile() {
    if (id >= 0) H5Fclose(id);
    try {
      if (reseal) seal::seal(path);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "sealing " << path << " again: " << e.what();
    }
  }

 private:
  RawFile(hid_t created, const std::string& path) : id(created), path(path), reseal(true) {}
};

void raw_set_string(hid_t object, const char* name, const char* value) {
  if (H5Aexists(object, name) > 0) H5Adelete(object, name);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, H5T_VARIABLE);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(object, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, type, &value);
  H5Aclose(attr), H5Sclose(space), H5Tclose(type);
}

// Reads dataset `name` as doubles, lets `change` edit them, writes them back.
void patch(const std::string& path, const char* name, const std::function<void(std::vector<double>&)>& change) {
  RawFile file(path, H5F_ACC_RDWR);
  ASSERT_GE(file.id, 0);
  const hid_t dataset = H5Dopen2(file.id, name, H5P_DEFAULT);
  ASSERT_GE(dataset, 0) << name;
  const hid_t space = H5Dget_space(dataset);
  std::vector<double> values(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  ASSERT_GE(H5Dread(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  change(values);
  ASSERT_GE(H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
  H5Sclose(space), H5Dclose(dataset);
}

struct DatasetLayout {
  bool found = false;
  hid_t type = H5I_INVALID_HID;  // owned; compared with H5Tequal
  std::vector<hsize_t> dims, chunk;
  int deflate = -1;
};

DatasetLayout raw_layout(hid_t file, const std::string& name) {
  DatasetLayout out;
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (dataset < 0) return out;
  out.found = true;
  out.type = H5Dget_type(dataset);
  const hid_t space = H5Dget_space(dataset);
  out.dims.resize(static_cast<size_t>(H5Sget_simple_extent_ndims(space)));
  H5Sget_simple_extent_dims(space, out.dims.data(), nullptr);
  const hid_t dcpl = H5Dget_create_plist(dataset);
  if (H5Pget_layout(dcpl) == H5D_CHUNKED) {
    out.chunk.resize(out.dims.size());
    H5Pget_chunk(dcpl, static_cast<int>(out.chunk.size()), out.chunk.data());
  }
  for (int i = 0; i < H5Pget_nfilters(dcpl); ++i) {
    unsigned flags = 0, values[4] = {0}, config = 0;
    size_t count = 4;
    if (H5Pget_filter2(dcpl, i, &flags, &count, values, 0, nullptr, &config) == H5Z_FILTER_DEFLATE)
      out.deflate = static_cast<int>(values[0]);
  }
  H5Pclose(dcpl), H5Sclose(space), H5Dclose(dataset);
  return out;
}

void expect_layout(hid_t file, const std::string& name, hid_t type, std::vector<hsize_t> dims,
                   std::vector<hsize_t> chunk = {}, int deflate = -1) {
  DatasetLayout got = raw_layout(file, name);
  ASSERT_TRUE(got.found) << name;
  EXPECT_GT(H5Tequal(got.type, type), 0) << name << ": wrong element type";
  EXPECT_EQ(got.dims, dims) << name;
  EXPECT_EQ(got.chunk, chunk) << name;
  EXPECT_EQ(got.deflate, deflate) << name;
  H5Tclose(got.type);
}

// Overwrites the stored bytes of the chunk at `offset` of dataset `name` with 0xFF (no valid
// deflate stream starts with 0xFF, so decoding that chunk fails).
void corrupt_chunk(const std::string& path, const std::string& name, std::vector<hsize_t> offset) {
  haddr_t address = 0;
  hsize_t size = 0;
  {
    RawFile file(path, H5F_ACC_RDONLY);
    const hid_t dataset = H5Dopen2(file.id, name.c_str(), H5P_DEFAULT);
    ASSERT_GE(dataset, 0) << name;
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(dataset, offset.data(), &mask, &address, &size), 0);
    H5Dclose(dataset);
  }
  ASSERT_GT(size, 0u);
  std::fstream out(path, std::ios::in | std::ios::out | std::ios::binary);
  // HDF5's addresses count from its superblock, which follows the seal's block.
  out.seekp(static_cast<std::streamoff>(seal::kBlockBytes + address));
  const std::string junk(size, '\xff');
  out.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  ASSERT_TRUE(out.good());
  out.close();
  seal::seal(path);  // damage the seal cannot see: the per-image messages are under test
}

// ---- Fixture ----------------------------------------------------------------------------------

class SceneTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(testing::TempDir()) / "tessera_scene_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override { test::remove_tree(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string dir_;
};

void expect_same_cameras(const std::vector<Camera>& got, const std::vector<Camera>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Camera &a = got[i], &b = want[i];
    EXPECT_EQ(std::vector<double>({a.fx, a.fy, a.cx, a.cy, a.k1, a.k2, a.p1, a.p2}),
              std::vector<double>({b.fx, b.fy, b.cx, b.cy, b.k1, b.k2, b.p1, b.p2})) << "camera " << i;
    EXPECT_EQ(a.width, b.width) << i;
    EXPECT_EQ(a.height, b.height) << i;
    EXPECT_EQ(a.camera_to_world, b.camera_to_world) << i;
    EXPECT_EQ(a.split, b.split) << i;
  }
}

// ---- Round trips ------------------------------------------------------------------------------

TEST_F(SceneTest, RoundTripUniformSizeWithAlphaAndPoints) {
  const auto cameras = uniform_cameras(7);
  write_scene(path("s.h5"), cameras, true, true);
  EXPECT_EQ(files(), std::vector<std::string>{"s.h5"}) << "no temporary file may remain";
  const SceneReader scene(path("s.h5"));
  EXPECT_EQ(scene.path(), path("s.h5"));
  EXPECT_EQ(scene.version(), kSceneVersion);
  EXPECT_TRUE(scene.uniform_size());
  EXPECT_TRUE(scene.has_alpha());
  EXPECT_TRUE(scene.has_points());
  const SceneMeta want = make_meta();
  EXPECT_EQ(scene.meta().scene_bounds, want.scene_bounds);
  EXPECT_EQ(scene.meta().near, want.near);
  EXPECT_EQ(scene.meta().far, want.far);
  EXPECT_EQ(scene.meta().background, want.background);
  EXPECT_EQ(scene.meta().source, want.source);
  expect_same_cameras(scene.cameras(), cameras);
  for (size_t i = 0; i < cameras.size(); ++i) {
    EXPECT_TRUE(torch::equal(scene.read_image(i), rgb_for(cameras[i], i))) << "image " << i;
    EXPECT_TRUE(torch::equal(scene.read_alpha(i), alpha_for(cameras[i], i))) << "alpha " << i;
  }
  EXPECT_TRUE(torch::equal(scene.read_points_xyz(), points_xyz()));
  EXPECT_TRUE(torch::equal(scene.read_points_rgb(), points_rgb()));
  EXPECT_THROW(scene.read_image(cameras.size()), std::out_of_range);
}

TEST_F(SceneTest, RoundTripMixedSizesUsesPerImageDatasets) {
  const auto cameras = mixed_cameras();
  write_scene(path("m.h5"), cameras, true, false);
  const SceneReader scene(path("m.h5"));
  EXPECT_FALSE(scene.uniform_size());
  EXPECT_FALSE(scene.has_points());
  EXPECT_EQ(scene.read_points_xyz().sizes(), torch::IntArrayRef({0, 3}));
  expect_same_cameras(scene.cameras(), cameras);
  for (size_t i = 0; i < cameras.size(); ++i) {
    EXPECT_TRUE(torch::equal(scene.read_image(i), rgb_for(cameras[i], i))) << "image " << i;
    EXPECT_TRUE(torch::equal(scene.read_alpha(i), alpha_for(cameras[i], i))) << "alpha " << i;
  }
}

TEST_F(SceneTest, IndicesBySplitAndSplitNames) {
  write_scene(path("s.h5"), uniform_cameras(11), false, false);
  const SceneReader scene(path("s.h5"));
  EXPECT_FALSE(scene.has_alpha());
  EXPECT_THROW(scene.read_alpha(0), std::logic_error);
  EXPECT_EQ(scene.indices(Split::Train), (std::vector<size_t>{0, 1, 2, 5, 6, 7, 10}));
  EXPECT_EQ(scene.indices(Split::Val), (std::vector<size_t>{3, 8}));
  EXPECT_EQ(scene.indices(Split::Test), (std::vector<size_t>{4, 9}));
  EXPECT_STREQ(to_string(Split::Train), "train");
  EXPECT_STREQ(to_string(Split::Val), "val");
  EXPECT_STREQ(to_string(Split::Test), "test");
}

// ---- Reading one image only -------------------------------------------------------------------

// Every chunk but image 5's is destroyed: image 5 still reads back exactly, so reading it touched
// no other image's chunk (a whole-dataset read would have to decode them); image 3 fails cleanly.
TEST_F(SceneTest, ReadImageDecodesOnlyItsOwnChunk) {
  const auto uniform = uniform_cameras(8);
  const auto mixed = mixed_cameras();
  write_scene(path("u.h5"), uniform, true, false);
  write_scene(path("m.h5"), mixed, false, false);
  for (size_t i = 0; i < uniform.size(); ++i)
    if (i != 5) corrupt_chunk(path("u.h5"), "images/rgb", {i, 0, 0, 0});
  for (size_t i = 0; i < mixed.size(); ++i)
    if (i != 5) corrupt_chunk(path("m.h5"), "images/rgb/0000000" + std::to_string(i), {0, 0, 0});
  const SceneReader u(path("u.h5")), m(path("m.h5"));
  EXPECT_TRUE(torch::equal(u.read_image(5), rgb_for(uniform[5], 5)));
  EXPECT_TRUE(torch::equal(m.read_image(5), rgb_for(mixed[5], 5)));
  EXPECT_TRUE(torch::equal(u.read_alpha(3), alpha_for(uniform[3], 3))) << "alpha is stored apart";
  expect_user_error([&] { u.read_image(3); }, {path("u.h5"), "cannot read image 3"});
  expect_user_error([&] { m.read_image(3); }, {path("m.h5"), "cannot read image 3"});
}

// A damaged points chunk (found by the scene fuzz target): a UserError naming the file and the
// dataset, not HDF5's internal error; the images still read.
TEST_F(SceneTest, DamagedPointsAreAUserErrorNamingTheDataset) {
  const auto cameras = uniform_cameras(2);
  write_scene(path("p.h5"), cameras, false, true);
  corrupt_chunk(path("p.h5"), "points/xyz", {0, 0});
  corrupt_chunk(path("p.h5"), "points/rgb", {0, 0});
  const SceneReader scene(path("p.h5"));
  EXPECT_TRUE(torch::equal(scene.read_image(1), rgb_for(cameras[1], 1)));
  expect_user_error([&] { scene.read_points_xyz(); }, {path("p.h5"), "cannot read /points/xyz"});
  expect_user_error([&] { scene.read_points_rgb(); }, {path("p.h5"), "cannot read /points/rgb"});
}

// ---- Layout on disk ---------------------------------------------------------------------------

TEST_F(SceneTest, UniformLayoutOnDisk) {
  write_scene(path("s.h5"), uniform_cameras(4), true, true);
  RawFile file(path("s.h5"), H5F_ACC_RDONLY);
  ASSERT_GE(file.id, 0);
  auto attribute = [&](const char* name, H5T_class_t type_class, size_t size, hssize_t count) {
    ASSERT_GT(H5Aexists(file.id, name), 0) << name;
    const hid_t attr = H5Aopen(file.id, name, H5P_DEFAULT);
    const hid_t type = H5Aget_type(attr), space = H5Aget_space(attr);
    EXPECT_EQ(H5Tget_class(type), type_class) << name;
    if (size) {
      EXPECT_EQ(H5Tget_size(type), size) << name;
    }
    if (type_class == H5T_STRING) {
      EXPECT_GT(H5Tis_variable_str(type), 0) << name;
    }
    EXPECT_EQ(H5Sget_simple_extent_npoints(space), count) << name;
    EXPECT_EQ(H5Sget_simple_extent_type(space), count == 1 ? H5S_SCALAR : H5S_SIMPLE) << name;
    H5Sclose(space), H5Tclose(type), H5Aclose(attr);
  };
  attribute("format", H5T_STRING, 0, 1);
  attribute("version", H5T_INTEGER, 4, 1);
  attribute("scene_bounds", H5T_FLOAT, 8, 6);
  attribute("near", H5T_FLOAT, 8, 1);
  attribute("far", H5T_FLOAT, 8, 1);
  attribute("background", H5T_FLOAT, 8, 3);
  attribute("source", H5T_STRING, 0, 1);
  int32_t version = 0;
  const hid_t attr = H5Aopen(file.id, "version", H5P_DEFAULT);
  H5Aread(attr, H5T_NATIVE_INT32, &version);
  H5Aclose(attr);
  EXPECT_EQ(version, 2);
  expect_layout(file.id, "cameras/intrinsics", H5T_IEEE_F64LE, {4, 4});
  expect_layout(file.id, "cameras/distortion", H5T_IEEE_F64LE, {4, 4});
  expect_layout(file.id, "cameras/size", H5T_STD_I32LE, {4, 2});
  expect_layout(file.id, "cameras/camera_to_world", H5T_IEEE_F64LE, {4, 4, 4});
  expect_layout(file.id, "cameras/split", H5T_STD_U8LE, {4});
  expect_layout(file.id, "images/rgb", H5T_STD_U8LE, {4, 8, 12, 3}, {1, 8, 12, 3}, 4);
  expect_layout(file.id, "images/alpha", H5T_STD_U8LE, {4, 8, 12}, {1, 8, 12}, 4);
  expect_layout(file.id, "points/xyz", H5T_IEEE_F32LE, {kPointCount, 3}, {kPointCount, 3}, 4);
  expect_layout(file.id, "points/rgb", H5T_STD_U8LE, {kPointCount, 3}, {kPointCount, 3}, 4);
}

TEST_F(SceneTest, MixedLayoutOnDisk) {
  const auto cameras = mixed_cameras();
  write_scene(path("m.h5"), cameras, true, false);
  RawFile file(path("m.h5"), H5F_ACC_RDONLY);
  for (size_t i = 0; i < cameras.size(); ++i) {
    const hsize_t h = cameras[i].height, w = cameras[i].width;
    char name[32];
    std::snprintf(name, sizeof(name), "%08zu", i);
    expect_layout(file.id, std::string("images/rgb/") + name, H5T_STD_U8LE, {h, w, 3}, {h, w, 3}, 4);
    expect_layout(file.id, std::string("images/alpha/") + name, H5T_STD_U8LE, {h, w}, {h, w}, 4);
  }
  EXPECT_LE(H5Lexists(file.id, "points", H5P_DEFAULT), 0);
}

TEST_F(SceneTest, H5dumpShowsHeaderAndAttributes) {
  if (std::system("command -v h5dump >/dev/null 2>&1") != 0) GTEST_SKIP() << "h5dump not found";
  write_scene(path("s.h5"), uniform_cameras(3), false, false);
  const std::string out = path("dump.txt");
  ASSERT_EQ(std::system(("h5dump -A '" + path("s.h5") + "' >'" + out + "' 2>&1").c_str()), 0);
  const std::string dump = test::read_file(out);
  for (const char* needle : {"\"tessera-scene\"", "ATTRIBUTE \"version\"", "DATASET \"rgb\"",
                             "( 3, 8, 12, 3 )", "DATASET \"camera_to_world\"", "( 3, 4, 4 )"})
    EXPECT_TRUE(contains(dump, needle)) << needle << "\n" << dump;
}

// ---- Bad files --------------------------------------------------------------------------------

TEST_F(SceneTest, RejectsFilesThatAreNotReadableScenes) {
  const std::string missing = path("missing.h5"), text = path("text.h5"), half = path("half.h5");
  expect_user_error([&] { SceneReader r(missing); }, {missing, "no such file"});
  std::ofstream(text) << "not an HDF5 file\n";
  expect_user_error([&] { SceneReader r(text); },
                    {text + ": 17 bytes: not a Tessera file (truncated, or not a file Tessera "
                            "wrote?)"});
  write_scene(path("s.h5"), uniform_cameras(4), true, true);
  const std::string bytes = test::read_file(path("s.h5"));
  std::ofstream(half, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  expect_user_error([&] { SceneReader r(half); },
                    {half + ": truncated: its seal says " + std::to_string(bytes.size()) +
                     " bytes, the file has " + std::to_string(bytes.size() / 2)});

  const std::string other = path("other.h5");
  raw_set_string(RawFile::create(other).id, "format", "something-else");
  expect_user_error([&] { SceneReader r(other); }, {other, "\"something-else\""});
}

TEST_F(SceneTest, RejectsANewerVersion) {
  write_scene(path("s.h5"), uniform_cameras(2), false, false);
  {
    RawFile file(path("s.h5"), H5F_ACC_RDWR);
    const int32_t newer = kSceneVersion + 1;
    const hid_t attr = H5Aopen(file.id, "version", H5P_DEFAULT);
    H5Awrite(attr, H5T_NATIVE_INT32, &newer);
    H5Aclose(attr);
  }
  expect_user_error([&] { SceneReader r(path("s.h5")); },
                    {path("s.h5") + ": written as tessera-scene version " +
                     std::to_string(kSceneVersion + 1) + ", this build reads version " +
                     std::to_string(kSceneVersion) + "; update Tessera"});
}

TEST_F(SceneTest, RejectsBadCamerasAndLayoutNamingTheCamera) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* dataset;
    std::function<void(std::vector<double>&)> change;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"cameras/camera_to_world", [&](auto& v) { v[2 * 16 + 1] = nan; }, {"camera 2", "nan"}},
      {"cameras/camera_to_world", [](auto& v) { for (int k : {0, 1, 2}) v[16 + k] *= 1.1; },
       {"camera 1", "not orthonormal"}},
      {"cameras/intrinsics", [](auto& v) { v[3 * 4] = 0; }, {"camera 3", "fx = 0"}},
      {"cameras/intrinsics", [](auto& v) { v[1] = -5; }, {"camera 0", "fy = -5"}},
      {"cameras/size", [](auto& v) { v[2 * 2] = 0; }, {"camera 2", "size 0x8"}},
      {"cameras/split", [](auto& v) { v[1] = 7; }, {"camera 1", "split 7"}},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const std::string file = path("bad" + std::to_string(k) + ".h5");
    write_scene(file, uniform_cameras(5), false, false);
    patch(file, cases[k].dataset, cases[k].change);
    std::vector<std::string> needles = cases[k].needles;
    needles.push_back(file + ": camera ");
    SCOPED_TRACE(cases[k].needles[1]);
    expect_user_error([&] { SceneReader r(file); }, needles);
  }
}

TEST_F(SceneTest, RejectsMissingOrMistypedDatasets) {
  const std::string missing = path("missing.h5"), typed = path("typed.h5");
  write_scene(missing, uniform_cameras(3), false, false);
  {
    RawFile file(missing, H5F_ACC_RDWR);
    H5Ldelete(file.id, "cameras/distortion", H5P_DEFAULT);
  }
  expect_user_error([&] { SceneReader r(missing); }, {missing, "/cameras/distortion is missing"});
  write_scene(typed, uniform_cameras(3), false, false);
  {
    RawFile file(typed, H5F_ACC_RDWR);
    H5Ldelete(file.id, "cameras/split", H5P_DEFAULT);
    const hsize_t dims[1] = {3};
    const int32_t values[3] = {0, 1, 2};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const hid_t d = H5Dcreate2(file.id, "cameras/split", H5T_STD_I32LE, space, H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, values);
    H5Dclose(d), H5Sclose(space);
  }
  expect_user_error([&] { SceneReader r(typed); }, {typed, "/cameras/split is i32, must be u8"});
}

TEST(ValidateCamera, RejectsEachUnusableValue) {
  const Camera good = make_camera(0, 12, 8, true);
  EXPECT_NO_THROW(validate_camera(good, 0, "origin"));
  const std::vector<std::pair<std::function<void(Camera&)>, std::string>> cases = {
      {[](Camera& c) { c.camera_to_world[5] = std::nan(""); }, "camera_to_world[1][1] is nan"},
      {[](Camera& c) { c.k2 = INFINITY; }, "k2 is inf"},
      {[](Camera& c) { c.fx = -1; }, "fx = -1"},
      {[](Camera& c) { c.height = 0; }, "size 12x0"},
      {[](Camera& c) { c.camera_to_world[0] *= 2; }, "not orthonormal"},
      {[](Camera& c) { for (int r = 0; r < 3; ++r) c.camera_to_world[r * 4] *= -1; }, "reflection"},
      {[](Camera& c) { c.camera_to_world[14] = 1; }, "last row"},
      {[](Camera& c) { c.split = static_cast<Split>(3); }, "split 3"},
  };
  for (const auto& [change, needle] : cases) {
    Camera c = good;
    change(c);
    expect_user_error([&] { validate_camera(c, 9, "origin.json"); }, {"origin.json: camera 9: ", needle});
  }
}

// ---- Writer misuse ----------------------------------------------------------------------------

TEST_F(SceneTest, WriterRejectsWrongImagesAndLeavesNoFile) {
  const auto cameras = uniform_cameras(3);
  const std::string target = path("s.h5");
  {
    SceneWriter writer(target, make_meta(), cameras, true);
    EXPECT_FALSE(fs::exists(target)) << "only the temporary name exists while writing";
    EXPECT_EQ(files(), std::vector<std::string>{"s.h5.tmp-" + std::to_string(getpid())});
    expect_user_error([&] { writer.write_image(1, pattern(1, {12, 8, 3}), alpha_for(cameras[1], 1)); },
                      {target, "image 1", "[12, 8, 3] uint8", "[8, 12, 3] uint8"});
    expect_user_error([&] { writer.write_image(0, rgb_for(cameras[0], 0).to(torch::kFloat32),
                                               alpha_for(cameras[0], 0)); },
                      {"image 0", "float32"});
    expect_user_error([&] { writer.write_image(0, rgb_for(cameras[0], 0)); }, {"no alpha given"});
    expect_user_error([&] { writer.write_image(3, rgb_for(cameras[0], 3), alpha_for(cameras[0], 3)); },
                      {"image index 3 is out of range"});
    writer.write_image(0, rgb_for(cameras[0], 0), alpha_for(cameras[0], 0));
    expect_user_error([&] { writer.write_image(0, rgb_for(cameras[0], 0), alpha_for(cameras[0], 0)); },
                      {"image 0 was already written"});
    expect_user_error([&] { writer.write_points(points_xyz(), pattern(0, {kPointCount - 1, 3})); },
                      {"points rgb"});
    expect_user_error([&] { writer.commit(); }, {target, "2 of 3 images were not written (1, 2)"});
  }
  EXPECT_TRUE(files().empty()) << "neither the file nor its temporary may remain";
  std::vector<Camera> bad = cameras;
  bad[2].camera_to_world[6] = std::nan("");
  expect_user_error([&] { SceneWriter w(target, make_meta(), bad, false); }, {target, "camera 2"});
  SceneMeta meta = make_meta();
  meta.far = meta.near;
  expect_user_error([&] { SceneWriter w(target, meta, cameras, false); }, {target, "near < far"});
  EXPECT_TRUE(files().empty());
}

TEST_F(SceneTest, UncommittedWriterLeavesAnExistingFileUntouched) {
  const std::string target = path("s.h5");
  const auto cameras = uniform_cameras(4);
  write_scene(target, cameras, false, true);
  const std::string before = test::read_file(target);
  {
    SceneMeta other = make_meta();
    other.source = "replacement";
    SceneWriter writer(target, other, mixed_cameras(), false);
    writer.write_image(0, rgb_for(mixed_cameras()[0], 0));
  }
  EXPECT_EQ(files(), std::vector<std::string>{"s.h5"});
  EXPECT_EQ(test::read_file(target), before);
  const SceneReader scene(target);
  EXPECT_EQ(scene.meta().source, "test:round-trip");
  expect_same_cameras(scene.cameras(), cameras);
}

// ---- `tessera info` ---------------------------------------------------------------------------

struct InfoResult {
  int code = -1;
  std::string out, err;
};

class InfoTest : public SceneTest {
 protected:
  InfoResult info(const std::string& file) {
    const char* binary = std::getenv("TESSERA_BINARY");
    if (!binary || !*binary) {
      ADD_FAILURE() << "TESSERA_BINARY is not set; run through CTest (ctest -R test_scene)";
      return {};
    }
    const std::string command = std::string("'") + binary + "' info '" + file + "' >'" +
                                path("out.txt") + "' 2>'" + path("err.txt") + "' </dev/null";
    const int status = std::system(command.c_str());
    InfoResult run;
    run.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    run.out = test::read_file(path("out.txt"));
    run.err = test::read_file(path("err.txt"));
    return run;
  }
};

TEST_F(InfoTest, SummarisesAUniformScene) {
  write_scene(path("s.h5"), uniform_cameras(7), true, true);
  const InfoResult r = info(path("s.h5"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* needle :
       {"s.h5: tessera-scene version 2", "source:       test:round-trip", "file size:",
        "cameras:      7 (train 5, val 1, test 1)", "image size:   12x8 (all cameras",
        "fx:           100 .. 145 px", "distortion:   present (7 of 7 cameras)",
        "scene bounds: [-1, -2, -3] .. [1, 2, 3]", "near / far:   0.5 / 6.25",
        "background:   (0.25, 0.5, 1)", "alpha:        yes", "points:       50"})
    EXPECT_TRUE(contains(r.out, needle)) << "missing: " << needle << "\n" << r.out;
}

TEST_F(InfoTest, ListsDistinctSizes) {
  write_scene(path("m.h5"), mixed_cameras(), false, false);
  const InfoResult r = info(path("m.h5"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  for (const char* needle : {"image sizes:  4 distinct: ", "12x8 (2)", "7x5 (2)", "16x3 (1)",
                             "9x9 (1)", "distortion:   none", "alpha:        no", "points:       none"})
    EXPECT_TRUE(contains(r.out, needle)) << "missing: " << needle << "\n" << r.out;
}

// Every dataset a family can open: point-diffusion's shape sets too.
TEST_F(InfoTest, SummarisesAShapeSet) {
  shapes::write_generated_shapes({30, 64, 7}, path("shapes.h5"));
  const shapes::ShapesReader reader(path("shapes.h5"));
  std::map<int32_t, int64_t> kinds;  // in the format's kind order
  for (int64_t i = 0; i < reader.count(); ++i) ++kinds[static_cast<int32_t>(reader.kind(i))];
  std::string kinds_line = "kinds:        ";
  for (const auto& [kind, n] : kinds)
    kinds_line += (kinds_line.back() == ' ' ? "" : ", ") +
                  std::string(shapes::to_string(static_cast<shapes::Kind>(kind))) + " " +
                  std::to_string(n);
  const InfoResult r = info(path("shapes.h5"));
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const std::string counts = "shapes:       30 (train " +
                             std::to_string(reader.indices(Split::Train).size()) + ", val " +
                             std::to_string(reader.indices(Split::Val).size()) + ", test " +
                             std::to_string(reader.indices(Split::Test).size()) + ")";
  for (const std::string& needle :
       {std::string("shapes.h5: tessera-shapes version 2"), std::string("file size:"), counts,
        std::string("points:       64 per shape"), kinds_line})
    EXPECT_TRUE(contains(r.out, needle)) << "missing: " << needle << "\n" << r.out;
}

TEST_F(InfoTest, RefusesOtherFilesWithExitCode2) {
  for (const auto& [format, needle] :
       std::vector<std::pair<const char*, const char*>>{
           {"something-else", "not a Tessera file (root attribute format = \"something-else\")"},
           // A snapshot's format with nothing else: refused as damaged, not described.
           {"tessera-snapshot", "root attribute 'version' is missing"}}) {
    const std::string file = path(std::string(format) + ".h5");
    raw_set_string(RawFile::create(file).id, "format", format);
    const InfoResult r = info(file);
    EXPECT_EQ(r.code, 2) << r.out << r.err;
    EXPECT_TRUE(contains(r.err, needle)) << r.err;
  }
  const InfoResult missing = info(path("missing.h5"));
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "missing.h5: no such file")) << missing.err;
  std::ofstream(path("text.h5")) << "text";
  const InfoResult text = info(path("text.h5"));
  EXPECT_EQ(text.code, 2);
  EXPECT_TRUE(contains(text.err, "not a Tessera file")) << text.err;
}

}  // namespace
}  // namespace tessera::data
