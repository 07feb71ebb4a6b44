// Sharded snapshot writes under mpiexec -n {1,2,3}: uneven and empty shards, parallel and gathered,
// read back bitwise; checksums that do not depend on the sharding; a failure on one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/checksum.h"
#include "framework/snapshot.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

distributed::ProcessContext& context() { return *test::g_context; }
int rank() { return context().rank(); }
int size() { return context().size(); }

// Byte i of dataset `seed`: a function of (seed, i) only, never of the rank count.
uint8_t pattern_byte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

// Rows [begin, end) of the global tensor [rows, *rest] of `dtype` for `seed`.
torch::Tensor global_rows(torch::ScalarType dtype, std::vector<int64_t> rest, uint64_t seed,
                          int64_t begin, int64_t end) {
  int64_t row_elements = 1;
  for (const int64_t n : rest) row_elements *= n;
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t row_bytes = row_elements * element;
  torch::Tensor raw = torch::empty({(end - begin) * row_bytes}, torch::kUInt8);
  for (int64_t i = 0; i < raw.numel(); ++i)
    raw.data_ptr<uint8_t>()[i] = pattern_byte(seed, static_cast<uint64_t>(begin * row_bytes + i));
  std::vector<int64_t> shape = {end - begin};
  shape.insert(shape.end(), rest.begin(), rest.end());
  if (dtype == torch::kBool) return (raw % 2).to(torch::kBool).reshape(shape);
  return raw.view(dtype).reshape(shape).clone();
}

int64_t wrong_bytes(const torch::Tensor& got, const torch::Tensor& expected) {
  if (got.scalar_type() != expected.scalar_type() || got.sizes() != expected.sizes())
    return std::max<int64_t>(expected.nbytes(), 1);
  const torch::Tensor a = got.contiguous(), b = expected.contiguous();
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(b.data_ptr());
  int64_t wrong = 0;
  for (size_t i = 0; i < a.nbytes(); ++i) wrong += pa[i] != pb[i];
  return wrong;
}

SnapshotMeta meta(int64_t step) {
  SnapshotMeta m;
  m.step = step;
  m.model = "gaussians";
  m.config_toml = "[model]\nname = \"gaussians\"\n";
  m.dataset_fingerprint = "fp";
  return m;
}

struct Case {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> rest;
};

// Odd row sizes (1, 3 and 5 bytes) put the rank boundaries inside checksum words.
const std::vector<Case> kCases = {
    {"params/means", torch::kFloat32, {3}},     {"params/opacity", torch::kFloat32, {}},
    {"params/rot", torch::kFloat64, {2, 2}},     {"state/ids", torch::kInt64, {}},
    {"state/counts", torch::kInt32, {5}},        {"state/mask", torch::kBool, {5}},
    {"state/bytes", torch::kUInt8, {}},          {"state/rgb", torch::kUInt8, {3}},
    {"state/empty_rows", torch::kFloat32, {0}},
};

// Row counts per rank. Layout 0: uneven, rank 1 holds none; layout 1: the same number of rows,
// all on the last rank.
std::vector<int64_t> row_counts(int layout) {
  std::vector<int64_t> rows(static_cast<size_t>(size()), 0);
  int64_t total = 0;
  for (int r = 0; r < size(); ++r) total += rows[r] = r == 1 ? 0 : 3 * r + 4;
  if (layout == 1) {
    std::fill(rows.begin(), rows.end(), 0);
    rows.back() = total;
  }
  return rows;
}

// The checksum of the global tensor computed in one piece, as the file must record it.
uint64_t whole_checksum(const Case& c, int64_t total_rows, uint64_t seed) {
  torch::Tensor all = global_rows(c.dtype, c.rest, seed, 0, total_rows);
  if (all.scalar_type() == torch::kBool) all = all.to(torch::kUInt8);
  return checksum(all.data_ptr(), all.nbytes());
}

// Writes every case sharded by `rows`, plus a replicated tensor, and commits.
void write_cases(const std::string& path, const std::vector<int64_t>& rows, bool parallel) {
  int64_t begin = 0;
  for (int r = 0; r < rank(); ++r) begin += rows[r];
  SnapshotWriterOptions options;
  options.parallel = parallel;
  SnapshotWriter writer(context(), path, meta(3), options);
  for (size_t i = 0; i < kCases.size(); ++i)
    writer.write_sharded(kCases[i].name, global_rows(kCases[i].dtype, kCases[i].rest, i,
                                                     begin, begin + rows[rank()]));
  writer.write_replicated("params/shared", global_rows(torch::kFloat32, {4}, 99, 0, 6));
  writer.commit();
}

class ShardedSnapshot : public ::testing::TestWithParam<bool> {};  // param: parallel HDF5

TEST_P(ShardedSnapshot, UnevenAndEmptyShardsReadBackAsTheConcatenation) {
  const std::string dir = test::make_shared_temp_dir("tessera_snapshot_sharded");
  for (const int layout : {0, 1}) {
    const std::vector<int64_t> rows = row_counts(layout);
    int64_t total = 0;
    for (const int64_t n : rows) total += n;
    const std::string path = snapshot_path(dir, 10 + layout);
    write_cases(path, rows, GetParam());
    ASSERT_EQ(validate_snapshot(path), "") << "rank " << rank();
    const SnapshotReader reader(path);
    EXPECT_EQ(reader.meta().world_size, size());
    for (size_t i = 0; i < kCases.size(); ++i) {
      const Case& c = kCases[i];
      SCOPED_TRACE(c.name + " layout " + std::to_string(layout) + " rank " + std::to_string(rank()));
      EXPECT_EQ(wrong_bytes(reader.read(c.name), global_rows(c.dtype, c.rest, i, 0, total)), 0);
      // The checksum does not depend on how the rows were split.
      EXPECT_EQ(reader.stored_checksum(c.name), whole_checksum(c, total, i));
      // Re-sharding: this rank's slice of an even split.
      const int64_t begin = rank() * total / size(), end = (rank() + 1) * total / size();
      EXPECT_EQ(wrong_bytes(reader.read_rows(c.name, begin, end - begin),
                            global_rows(c.dtype, c.rest, i, begin, end)),
                0);
    }
    EXPECT_EQ(wrong_bytes(reader.read("params/shared"), global_rows(torch::kFloat32, {4}, 99, 0, 6)),
              0);
  }
  // Both layouts hold identical datasets.
  const SnapshotReader a(snapshot_path(dir, 10)), b(snapshot_path(dir, 11));
  for (const Case& c : kCases) {
    EXPECT_EQ(a.shape(c.name), b.shape(c.name));
    EXPECT_EQ(a.stored_checksum(c.name), b.stored_checksum(c.name));
    EXPECT_EQ(wrong_bytes(a.read(c.name), b.read(c.name)), 0);
  }
  test::remove_shared_temp_dir(dir);
}

// The same global data written by 1, 2 or 3 ranks: fixed checksums, pinned here, that every run
// (np1, np2, np3) must reproduce. They also pin the checksum definition of docs/formats.md.
TEST_P(ShardedSnapshot, ChecksumsDoNotDependOnTheWorldSize) {
  const std::string dir = test::make_shared_temp_dir("tessera_snapshot_world");
  constexpr int64_t kRows = 17;
  std::vector<int64_t> rows(static_cast<size_t>(size()));
  for (int r = 0; r < size(); ++r) rows[r] = (r + 1) * kRows / size() - r * kRows / size();
  const std::string path = snapshot_path(dir, 1);
  {
    int64_t begin = 0;
    for (int r = 0; r < rank(); ++r) begin += rows[r];
    SnapshotWriterOptions options;
    options.parallel = GetParam();
    SnapshotWriter writer(context(), path, meta(1), options);
    writer.write_sharded("params/x", global_rows(torch::kFloat32, {3}, 5, begin, begin + rows[rank()]));
    writer.write_sharded("params/m", global_rows(torch::kUInt8, {}, 6, begin, begin + rows[rank()]));
    writer.commit();
  }
  const SnapshotReader reader(path);
  EXPECT_EQ(reader.stored_checksum("params/x"), 0x89904c88f5f507b5ull);
  EXPECT_EQ(reader.stored_checksum("params/m"), 0x5a4f9c0b5668700aull);
  EXPECT_EQ(reader.stored_checksum("params/x"), whole_checksum({"x", torch::kFloat32, {3}}, kRows, 5));
  EXPECT_EQ(reader.stored_checksum("params/m"), whole_checksum({"m", torch::kUInt8, {}}, kRows, 6));
  test::remove_shared_temp_dir(dir);
}

TEST_P(ShardedSnapshot, AFailureOnOneRankThrowsOnEveryRankAndKeepsThePreviousSnapshot) {
  const std::string dir = test::make_shared_temp_dir("tessera_snapshot_fail");
  const std::string path = snapshot_path(dir, 100);
  write_cases(path, row_counts(0), GetParam());
  const std::string before = rank() == 0 ? test::read_file(path) : "";
  const int victim = size() - 1;
  for (const bool at_commit : {false, true}) {
    SnapshotWriterOptions options;
    options.parallel = GetParam();
    options.inject_failure_rank = victim;
    options.inject_failure_after_bytes = at_commit ? -1 : 0;
    options.inject_failure_at_commit = at_commit;
    std::string message;
    try {
      SnapshotWriter writer(context(), path, meta(200), options);
      writer.write_replicated("params/shared", torch::ones({4}));
      writer.write_sharded("params/means", torch::ones({rank() + 1, 3}));
      writer.commit();
    } catch (const SnapshotWriteError& e) {
      message = e.what();
    }
    SCOPED_TRACE("rank " + std::to_string(rank()) + (at_commit ? " at commit" : " in a write"));
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(at_commit ? "injected commit failure" : "injected write failure"),
              std::string::npos)
        << message;
    if (size() > 1) {
      EXPECT_NE(message.find("rank " + std::to_string(victim)), std::string::npos) << message;
    }
    MPI_Barrier(context().world());
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    if (rank() == 0) {
      EXPECT_EQ(test::read_file(path), before);
    }
    EXPECT_EQ(validate_snapshot(path), "");
    EXPECT_EQ(SnapshotReader(path).meta().step, 3);
  }
  test::remove_shared_temp_dir(dir);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardedSnapshot, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "parallel" : "gathered"; });

// About 50 MB of float32 rows written in parallel and gathered; prints the times (no threshold:
// shared CI machines vary too much).
TEST(ShardedSnapshotTiming, ParallelVersusGathered) {
  const std::string dir = test::make_shared_temp_dir("tessera_snapshot_timing");
  constexpr int64_t kRows = 50 * 1000 * 1000 / (14 * 4);  // 3DGS-like rows of 14 floats
  const int64_t begin = rank() * kRows / size(), end = (rank() + 1) * kRows / size();
  const torch::Tensor mine =
      torch::arange(begin * 14, end * 14, torch::kInt64).to(torch::kFloat32).reshape({-1, 14});
  for (const bool parallel : {true, false}) {
    const std::string path = snapshot_path(dir, parallel ? 1 : 2);
    MPI_Barrier(context().world());
    const auto start = std::chrono::steady_clock::now();
    SnapshotWriterOptions options;
    options.parallel = parallel;
    SnapshotWriter writer(context(), path, meta(1), options);
    writer.write_sharded("params/gaussians", mine);
    writer.commit();
    const double write_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto read_start = std::chrono::steady_clock::now();
    const torch::Tensor slice = SnapshotReader(path).read_rows("params/gaussians", begin, end - begin);
    const double read_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();
    EXPECT_EQ(wrong_bytes(slice, mine), 0);
    double slowest[2] = {write_s, read_s};
    MPI_Allreduce(MPI_IN_PLACE, slowest, 2, MPI_DOUBLE, MPI_MAX, context().world());
    if (rank() == 0) {
      const double mb = static_cast<double>(fs::file_size(path)) / 1e6;
      const auto validate_start = std::chrono::steady_clock::now();
      EXPECT_EQ(validate_snapshot(path), "");
      const double validate_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - validate_start).count();
      std::printf("[timing] %d ranks, %s: %.1f MB written in %.3f s (%.0f MB/s), own rows read in "
                  "%.3f s, validated in %.3f s\n",
                  size(), parallel ? "parallel" : "gathered", mb, slowest[0], mb / slowest[0],
                  slowest[1], validate_s);
    }
  }
  test::remove_shared_temp_dir(dir);
}

}  // namespace
}  // namespace tessera
