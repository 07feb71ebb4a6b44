// Sharded reading of one tessera-scene file under mpiexec -n 3: rank 0 writes it, every rank
// reads only its slice of images by hyperslab and all ranks must agree on the cameras.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/data/scene.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kPathBytes = 4096;  // PATH_MAX on Linux: room for any temp dir path

int rank() { return test::g_context->rank(); }
int size() { return test::g_context->size(); }
MPI_Comm world() { return test::g_context->world(); }

// Camera i: size depends on `mixed` (then three sizes), pose a rotation about z by 0.2 i.
Camera camera_for(size_t i, bool mixed) {
  Camera c;
  c.width = mixed ? 10 + 3 * static_cast<int32_t>(i % 3) : 16;
  c.height = mixed ? 6 + static_cast<int32_t>(i % 3) : 9;
  c.fx = 50 + i, c.fy = 51 + i, c.cx = c.width / 2.0, c.cy = c.height / 2.0;
  const double t = 0.2 * i;
  c.camera_to_world = {std::cos(t), -std::sin(t), 0, 0.1 * i, std::sin(t), std::cos(t), 0, 0,
                       0,           0,            1, 3,       0,           0,           0, 1};
  c.split = static_cast<Split>(i % 3);
  return c;
}

// Image i: values that differ per image, row, column and channel.
torch::Tensor image_for(const Camera& c, size_t i) {
  return ((torch::arange(int64_t{c.height} * c.width * 3, torch::kInt64) * 5 +
           static_cast<int64_t>(i) * 17) % 253)
      .to(torch::kUInt8)
      .reshape({c.height, c.width, 3});
}

int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected) {
  if (got.sizes() != expected.sizes()) return std::max(got.numel(), expected.numel());
  return (got != expected).sum().item<int64_t>();
}

// Logs the number of wrong elements of one check and fails when it is not zero.
void report(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected) {
  const int64_t wrong = count_wrong(got, expected);
  if (wrong != 0)
    std::fprintf(stderr, "[rank %d] %s: %lld wrong of %lld elements\n", rank(), what.c_str(),
                 static_cast<long long>(wrong), static_cast<long long>(expected.numel()));
  EXPECT_EQ(wrong, 0) << what << ": shapes " << got.sizes() << " vs " << expected.sizes();
}

// Every camera as 25 doubles: intrinsics, distortion, size, pose, split.
torch::Tensor pack(const std::vector<Camera>& cameras) {
  std::vector<double> values;
  for (const Camera& c : cameras) {
    values.insert(values.end(), {c.fx, c.fy, c.cx, c.cy, c.k1, c.k2, c.p1, c.p2,
                                 static_cast<double>(c.width), static_cast<double>(c.height)});
    values.insert(values.end(), c.camera_to_world.begin(), c.camera_to_world.end());
    values.push_back(static_cast<double>(c.split));
  }
  return torch::tensor(values, torch::kFloat64).reshape({static_cast<int64_t>(cameras.size()), -1});
}

// Rank 0 writes the scene into a fresh temp dir; every rank gets the path, or "" when writing
// failed there (then no rank waits on a file that will never come).
std::string shared_scene(const std::vector<Camera>& cameras, const std::string& name) {
  char buffer[kPathBytes] = {0};
  if (rank() == 0) {
    try {
      std::string dir = (fs::path(testing::TempDir()) / "tessera_sharded_XXXXXX").string();
      if (!mkdtemp(dir.data())) throw std::runtime_error("mkdtemp " + dir);
      const std::string path = (fs::path(dir) / name).string();
      SceneMeta meta;
      meta.scene_bounds = {-2, -2, -2, 2, 2, 2};
      meta.near = 0.1, meta.far = 8;
      meta.source = "test:sharded";
      SceneWriter writer(path, meta, cameras, false);
      for (size_t i = 0; i < cameras.size(); ++i) writer.write_image(i, image_for(cameras[i], i));
      writer.commit();
      std::snprintf(buffer, sizeof(buffer), "%s", path.c_str());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank 0 could not write the scene: " << e.what();
    }
  }
  MPI_CHECK(MPI_Bcast(buffer, static_cast<int>(kPathBytes), MPI_CHAR, 0, world()));
  return buffer;
}

class ShardedSceneTest : public testing::TestWithParam<bool> {};  // param: mixed sizes

TEST_P(ShardedSceneTest, EachRankReadsItsSliceAndAllAgreeOnCameras) {
  const bool mixed = GetParam();
  constexpr size_t kImages = 10;  // not a multiple of 3: slices of 3, 3 and 4 images
  std::vector<Camera> cameras;
  for (size_t i = 0; i < kImages; ++i) cameras.push_back(camera_for(i, mixed));
  const std::string path = shared_scene(cameras, mixed ? "mixed.h5" : "uniform.h5");
  ASSERT_FALSE(path.empty()) << "rank 0 failed to write the scene";
  {
    const SceneReader scene(path);
    EXPECT_EQ(scene.uniform_size(), !mixed);
    const size_t begin = rank() * kImages / size(), end = (rank() + 1) * kImages / size();
    for (size_t i = begin; i < end; ++i)
      report("image " + std::to_string(i), scene.read_image(i), image_for(cameras[i], i));

    const torch::Tensor mine = pack(scene.cameras());
    report("cameras vs expected", mine, pack(cameras));
    torch::Tensor low = mine.clone(), high = mine.clone();
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, low.data_ptr<double>(), static_cast<int>(low.numel()),
                            MPI_DOUBLE, MPI_MIN, world()));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, high.data_ptr<double>(), static_cast<int>(high.numel()),
                            MPI_DOUBLE, MPI_MAX, world()));
    report("cameras: min over ranks", low, mine);
    report("cameras: max over ranks", high, mine);
  }
  // Everyone has closed the file before rank 0 removes it.
  MPI_CHECK(MPI_Barrier(world()));
  if (rank() == 0) test::remove_tree(fs::path(path).parent_path().string());
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardedSceneTest, testing::Values(false, true),
                         [](const auto& info) { return info.param ? "MixedSizes" : "UniformSize"; });

}  // namespace
}  // namespace tessera::data
