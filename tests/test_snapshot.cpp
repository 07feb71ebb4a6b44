// Snapshot files in one process: bitwise round trips of every dtype and shape, meta, damage
// detection, find-latest, rotation, and that no failure ever touches the previous snapshot.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "distributed/errors.h"
#include "framework/checksum.h"
#include "framework/data/file_seal.h"
#include "framework/data/h5.h"
#include "framework/snapshot.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

distributed::ProcessContext& context() { return *test::g_context; }

// Deterministic bytes: a function of (seed, index) only.
uint8_t pattern_byte(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

// A tensor whose bytes are all pattern bytes (random bit patterns: NaN payloads, denormals,
// negative zeros included); bool tensors hold 0 and 1.
torch::Tensor pattern_tensor(torch::ScalarType dtype, const std::vector<int64_t>& shape,
                             uint64_t seed) {
  int64_t numel = 1;
  for (const int64_t n : shape) numel *= n;
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  torch::Tensor raw = torch::empty({bytes}, torch::kUInt8);
  for (int64_t i = 0; i < bytes; ++i) raw.data_ptr<uint8_t>()[i] = pattern_byte(seed, i);
  if (dtype == torch::kBool) return (raw % 2).to(torch::kBool).reshape(shape);
  return raw.view(dtype).reshape(shape).clone();
}

// Same dtype, same shape and the same bytes.
::testing::AssertionResult same_bits(const torch::Tensor& got, const torch::Tensor& expected) {
  if (got.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << got.scalar_type() << " vs "
                                         << expected.scalar_type();
  if (got.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << got.sizes() << " vs " << expected.sizes();
  const torch::Tensor a = got.contiguous(), b = expected.contiguous();
  int64_t wrong = 0;
  const auto* pa = static_cast<const uint8_t*>(a.data_ptr());
  const auto* pb = static_cast<const uint8_t*>(b.data_ptr());
  for (size_t i = 0; i < a.nbytes(); ++i) wrong += pa[i] != pb[i];
  if (wrong != 0)
    return ::testing::AssertionFailure() << wrong << " of " << a.nbytes() << " bytes differ";
  return ::testing::AssertionSuccess();
}

SnapshotMeta test_meta(int64_t step) {
  SnapshotMeta meta;
  meta.step = step;
  meta.model = "nerf-hash";
  meta.config_toml = "[run]\nname = \"snapshot-test\"\n[train]\nsteps = 1000\n";
  meta.dataset_fingerprint = "scene.h5:0123456789abcdef";
  return meta;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tessera_snapshot_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp " + pattern);
    path_ = pattern;
  }
  ~TempDir() { test::remove_tree(path_); }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

// A committed snapshot at `path` with one replicated parameter of `floats` float32 values.
void write_small(const std::string& path, int64_t step, int64_t floats = 64,
                 bool parallel = false) {
  SnapshotWriterOptions options;
  options.parallel = parallel;
  SnapshotWriter writer(context(), path, test_meta(step), options);
  writer.write_replicated("params/w", pattern_tensor(torch::kFloat32, {floats}, step));
  writer.write_replicated("state/step_scalar", torch::tensor(step));
  writer.commit();
}

// Flips one bit of `path` at byte `offset`.
void flip_bit(const std::string& path, int64_t offset, int bit = 3) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  file.seekg(offset);
  char byte = 0;
  file.read(&byte, 1);
  byte = static_cast<char>(byte ^ (1 << bit));
  file.seekp(offset);
  file.write(&byte, 1);
}

// Where the bytes of contiguous dataset `name` start in the file (HDF5's addresses count from
// its superblock, which follows the seal's block).
int64_t data_offset(const std::string& path, const std::string& name) {
  data::h5::Id file = data::h5::open_file_read_only(path);
  data::h5::Id dataset = data::h5::open_dataset(file.get(), name);
  const haddr_t offset = H5Dget_offset(dataset.get());
  EXPECT_NE(offset, HADDR_UNDEF);
  return static_cast<int64_t>(data::seal::kBlockBytes + offset);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- Checksum ----

TEST(SnapshotChecksum, PartialSumsOverAnySplitEqualTheWhole) {
  const torch::Tensor data = pattern_tensor(torch::kUInt8, {1000}, 7);
  const auto* bytes = data.data_ptr<uint8_t>();
  const uint64_t whole = checksum(bytes, 1000);
  for (const size_t a : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{13}, size_t{999}})
    for (const size_t b : {a, a + 1, a + 5, size_t{1000}}) {
      if (b > 1000) continue;
      const uint64_t sum = checksum_partial(bytes, a, 0) +
                           checksum_partial(bytes + a, b - a, a) +
                           checksum_partial(bytes + b, 1000 - b, b);
      EXPECT_EQ(checksum_finish(sum, 1000), whole) << "split at " << a << ", " << b;
    }
}

TEST(SnapshotChecksum, EverySingleBitFlipChangesIt) {
  torch::Tensor data = pattern_tensor(torch::kUInt8, {67}, 3);
  auto* bytes = data.data_ptr<uint8_t>();
  const uint64_t original = checksum(bytes, 67);
  for (int i = 0; i < 67; ++i)
    for (int bit = 0; bit < 8; ++bit) {
      bytes[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(checksum(bytes, 67), original) << "byte " << i << " bit " << bit;
      bytes[i] ^= static_cast<uint8_t>(1 << bit);
    }
  // Length counts: zero bytes of different lengths differ, and swapping two words is seen.
  const std::vector<uint8_t> zeros(16, 0);
  EXPECT_NE(checksum(zeros.data(), 8), checksum(zeros.data(), 16));
  std::vector<uint8_t> swapped(bytes, bytes + 16);
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(checksum(swapped.data(), 16), checksum(bytes, 16));
}

// ---- Names ----

TEST(SnapshotPath, EightDigitsAndParsing) {
  EXPECT_EQ(snapshot_path("runs/x/snapshots", 1200), "runs/x/snapshots/step-00001200.h5");
  EXPECT_EQ(snapshot_path("d", 123456789), "d/step-123456789.h5");
  EXPECT_EQ(snapshot_step("a/b/step-00001200.h5"), std::optional<int64_t>(1200));
  EXPECT_EQ(snapshot_step("step-00001200.h5.tmp"), std::nullopt);
  EXPECT_EQ(snapshot_step("step-x.h5"), std::nullopt);
  EXPECT_THROW(snapshot_path("d", -1), std::invalid_argument);
  EXPECT_EQ(snapshot_optimizer("mlp.0.weight", "exp_avg"), "optimizer/mlp.0.weight/exp_avg");
}

// ---- Round trips ----

class SnapshotRoundTrip : public ::testing::TestWithParam<bool> {};  // param: parallel HDF5

TEST_P(SnapshotRoundTrip, EveryDtypeAndShapeBitwise) {
  TempDir dir;
  const std::string path = snapshot_path(dir.path(), 42);
  const std::vector<torch::ScalarType> dtypes = {torch::kFloat32, torch::kFloat64, torch::kInt64,
                                                 torch::kInt32,   torch::kUInt8,   torch::kBool};
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 3},
                                                    {0, 4}, {2, 3, 4}, {1, 1, 1, 5}};
  std::map<std::string, torch::Tensor> written;
  SnapshotWriterOptions options;
  options.parallel = GetParam();
  {
    SnapshotWriter writer(context(), path, test_meta(42), options);
    uint64_t seed = 0;
    for (const torch::ScalarType dtype : dtypes)
      for (size_t s = 0; s < shapes.size(); ++s) {
        const std::string name = "params/" + std::string(c10::toString(dtype)) + "/shape" +
                                 std::to_string(s);
        written[name] = pattern_tensor(dtype, shapes[s], ++seed);
        if (s % 2 == 0 || shapes[s].empty()) writer.write_replicated(name, written[name]);
        else writer.write_sharded(name, written[name]);  // one rank: the whole tensor
      }
    EXPECT_EQ(writer.parallel(), GetParam());
    writer.commit();
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(validate_snapshot(path), "");
  const SnapshotReader reader(path);
  EXPECT_EQ(reader.names("params").size(), written.size());
  for (const auto& [name, expected] : written) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(reader.has(name));
    const torch::Tensor got = reader.read(name);
    EXPECT_TRUE(same_bits(got, expected));
    EXPECT_EQ(reader.shape(name), expected.sizes().vec());
    EXPECT_EQ(reader.dtype(name), expected.scalar_type());
    const torch::Tensor stored =
        expected.scalar_type() == torch::kBool ? expected.to(torch::kUInt8) : expected;
    EXPECT_EQ(reader.stored_checksum(name), checksum(stored.data_ptr(), stored.nbytes()));
    if (expected.dim() > 0 && expected.size(0) > 1) {
      EXPECT_TRUE(same_bits(reader.read_rows(name, 1, expected.size(0) - 1),
                            expected.slice(0, 1)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SnapshotRoundTrip, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "parallel" : "gathered"; });

TEST(Snapshot, MetaNestedNamesAndListing) {
  TempDir dir;
  const std::string path = snapshot_path(dir.path(), 7);
  SnapshotMeta meta = test_meta(7);
  meta.config_toml += std::string(100000, '#') + "\n";  // a long config survives intact
  meta.world_size = 99;                                   // the writer records the real one
  {
    SnapshotWriter writer(context(), path, meta);
    writer.write_replicated("/params/encoding/levels/0/table", torch::ones({4, 2}));
    writer.write_replicated(snapshot_param("mlp.0.weight"), torch::ones({3}));
    writer.write_replicated(snapshot_optimizer("mlp.0.weight", "exp_avg"), torch::zeros({3}));
    writer.write_replicated(snapshot_optimizer("mlp.0.weight", "step"), torch::tensor(int64_t{7}));
    writer.write_replicated(snapshot_state("sampler/rate"), torch::tensor(0.25));
    // Bad names and clashes are rejected and the writer stays usable.
    EXPECT_THROW(writer.write_replicated("params//x", torch::ones({1})), std::invalid_argument);
    EXPECT_THROW(writer.write_replicated("params/../x", torch::ones({1})), std::invalid_argument);
    EXPECT_THROW(writer.write_replicated("", torch::ones({1})), std::invalid_argument);
    EXPECT_THROW(writer.write_replicated("params/mlp.0.weight", torch::ones({3})),
                 std::invalid_argument);  // written twice
    EXPECT_THROW(writer.write_replicated("params/mlp.0.weight/x", torch::ones({3})),
                 std::invalid_argument);  // below a dataset
    EXPECT_THROW(writer.write_replicated("params/encoding", torch::ones({3})),
                 std::invalid_argument);  // a group
    EXPECT_THROW(writer.write_replicated("params/half", torch::ones({3}, torch::kFloat16)),
                 std::invalid_argument);
    EXPECT_THROW(writer.write_sharded("params/scalar", torch::tensor(1.0)), std::invalid_argument);
    writer.commit();
    EXPECT_THROW(writer.write_replicated("params/late", torch::ones({1})), std::logic_error);
  }
  const SnapshotReader reader(path);
  EXPECT_EQ(reader.meta().step, 7);
  EXPECT_EQ(reader.meta().model, meta.model);
  EXPECT_EQ(reader.meta().config_toml, meta.config_toml);
  EXPECT_EQ(reader.meta().dataset_fingerprint, meta.dataset_fingerprint);
  EXPECT_EQ(reader.meta().tessera_version, TESSERA_VERSION);
  EXPECT_EQ(reader.meta().world_size, 1);
  EXPECT_EQ(reader.names("params"),
            (std::vector<std::string>{"encoding/levels/0/table", "mlp.0.weight"}));
  EXPECT_EQ(reader.names("/optimizer/mlp.0.weight/"),
            (std::vector<std::string>{"exp_avg", "step"}));
  EXPECT_EQ(reader.names().size(), 5u);
  EXPECT_TRUE(reader.names("nothing").empty());
  EXPECT_TRUE(reader.has("state/sampler/rate"));
  EXPECT_FALSE(reader.has("state/sampler"));  // a group, not a dataset
  EXPECT_EQ(reader.read("optimizer/mlp.0.weight/step").item<int64_t>(), 7);
  EXPECT_EQ(reader.read("state/sampler/rate").item<double>(), 0.25);
  try {
    reader.read("params/missing");
    ADD_FAILURE() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), path)) << e.what();
    EXPECT_TRUE(contains(e.what(), "no dataset \"params/missing\"")) << e.what();
  }
  EXPECT_THROW(reader.read_rows("params/mlp.0.weight", 2, 2), UserError);
  EXPECT_THROW(reader.read_rows("state/sampler/rate", 0, 1), UserError);
  EXPECT_EQ(reader.read_rows("params/mlp.0.weight", 3, 0).sizes().vec(), std::vector<int64_t>{0});
}

// ---- Bad input ----

TEST(Snapshot, BadFilesAreUserErrorsThatSayWhatIsWrong) {
  TempDir dir;
  auto message_of = [](const std::string& path) -> std::string {
    try {
      SnapshotReader reader(path);
    } catch (const UserError& e) {
      return e.what();
    }
    return "no UserError";
  };
  EXPECT_TRUE(contains(message_of(dir / "none.h5"), "no such file"));
  std::ofstream(dir / "text.h5") << "not hdf5";
  EXPECT_TRUE(contains(message_of(dir / "text.h5"), "not a Tessera file"));
  {
    // HDF5 of another program (or an unsealed version-1 snapshot): refused before HDF5 reads it.
    const hid_t id = H5Fcreate((dir / "plain.h5").c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(id, 0);
    data::h5::Id file(id, H5Fclose);
    data::h5::write_string_attribute(file.get(), "format", kSnapshotFormat);
    data::h5::write_int_attribute(file.get(), "version", 1);
  }
  const std::string plain = message_of(dir / "plain.h5");
  EXPECT_TRUE(contains(plain, "an HDF5 file without a Tessera seal")) << plain;
  // The files below are sealed, so that the reader's own checks are reached.
  {
    data::h5::Id file = data::h5::create_file(dir / "scene.h5");
    data::h5::write_string_attribute(file.get(), "format", "tessera-scene");
  }
  data::seal::seal(dir / "scene.h5");
  EXPECT_TRUE(contains(message_of(dir / "scene.h5"), "its format is \"tessera-scene\""));
  {
    data::h5::Id file = data::h5::create_file(dir / "future.h5");
    data::h5::write_string_attribute(file.get(), "format", kSnapshotFormat);
    data::h5::write_int_attribute(file.get(), "version", kSnapshotVersion + 1);
  }
  data::seal::seal(dir / "future.h5");
  const std::string future = message_of(dir / "future.h5");
  EXPECT_TRUE(contains(future, "version " + std::to_string(kSnapshotVersion + 1)) &&
              contains(future, "update Tessera"))
      << future;
  {
    data::h5::Id file = data::h5::create_file(dir / "partial.h5");
    data::h5::write_string_attribute(file.get(), "format", kSnapshotFormat);
    data::h5::write_int_attribute(file.get(), "version", kSnapshotVersion);
  }
  data::seal::seal(dir / "partial.h5");
  EXPECT_TRUE(contains(message_of(dir / "partial.h5"), "is missing"));
  EXPECT_FALSE(validate_snapshot(dir / "partial.h5").empty());
}

// ---- Damage ----

TEST(Snapshot, TruncationIsDetected) {
  TempDir dir;
  const std::string good = dir / "good.h5";
  write_small(good, 1, 20000);
  ASSERT_EQ(validate_snapshot(good), "");
  const auto size = static_cast<int64_t>(fs::file_size(good));
  for (const int64_t keep : {size - 1, size - 4096, size / 2, int64_t{100}, int64_t{0}}) {
    const std::string cut = dir / ("cut" + std::to_string(keep) + ".h5");
    fs::copy_file(good, cut);
    fs::resize_file(cut, static_cast<uintmax_t>(keep));
    const std::string problem = validate_snapshot(cut);
    EXPECT_FALSE(problem.empty()) << "truncated to " << keep << " of " << size << " bytes";
    EXPECT_TRUE(contains(problem, cut)) << problem;
  }
}

TEST(Snapshot, BitFlipsInDataAndAttributesAreDetected) {
  TempDir dir;
  const std::string good = dir / "good.h5";
  write_small(good, 1, 5000);
  const std::string flipped = dir / "flipped.h5";
  fs::copy_file(good, flipped);
  flip_bit(flipped, data_offset(flipped, "params/w") + 1234);
  // The seal refuses the whole file before HDF5 reads it.
  const std::string sealed_problem = validate_snapshot(flipped);
  EXPECT_TRUE(contains(sealed_problem, flipped + ": damaged: its checksum is"))
      << sealed_problem;
  EXPECT_THROW(SnapshotReader{flipped}, UserError);

  // Sealed again (damage before the seal was written, as a writer's bug would leave it): the
  // dataset's own checksum still finds it, and only that dataset is refused.
  data::seal::seal(flipped);
  const std::string problem = validate_snapshot(flipped);
  EXPECT_TRUE(contains(problem, "\"params/w\" is damaged")) << problem;
  EXPECT_THROW(SnapshotReader(flipped).read("params/w"), UserError);
  EXPECT_NO_THROW(SnapshotReader(flipped).read("state/step_scalar"));

  // One bit of the stored config text, sealed again: the meta checksum finds it.
  const std::string text = test::read_file(good);
  const size_t at = text.find("snapshot-test");
  ASSERT_NE(at, std::string::npos);
  const std::string config_flip = dir / "config_flip.h5";
  fs::copy_file(good, config_flip);
  flip_bit(config_flip, static_cast<int64_t>(at) + 2, 0);
  EXPECT_TRUE(contains(validate_snapshot(config_flip), "damaged: its checksum is"));
  data::seal::seal(config_flip);
  const std::string meta_problem = validate_snapshot(config_flip);
  EXPECT_TRUE(contains(meta_problem, "root attributes")) << meta_problem;
}

TEST(Snapshot, TheSameStateWritesTheSameBytes) {
  // No object times in the file (h5::create_with): two snapshots of one state, written a second
  // apart, are identical, seal included.
  TempDir dir;
  write_small(dir / "a.h5", 7);
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  write_small(dir / "b.h5", 7);
  const std::string a = test::read_file(dir / "a.h5"), b = test::read_file(dir / "b.h5");
  EXPECT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == b) << "two snapshots of one state differ";
}

TEST(Snapshot, ADamagedGroupIsAUserErrorNamingTheFile) {
  // A sealed snapshot whose "params" group cannot be opened (its object header's version byte
  // flipped, then sealed again, as a writer's bug would leave it): HDF5 still opens the file and
  // reads the root attributes, but fails while listing the datasets. The reader turns HDF5's
  // internal error into a UserError naming the file, never exit 1.
  TempDir dir;
  const std::string damaged = dir / "damaged.h5";
  write_small(damaged, 1);
  haddr_t header = HADDR_UNDEF;
  {
    data::h5::Id file = data::h5::open_file_read_only(damaged);
    H5O_info_t info;
    ASSERT_GE(H5Oget_info_by_name2(file.get(), "params", &info, H5O_INFO_BASIC, H5P_DEFAULT), 0);
    header = info.addr;
  }
  ASSERT_NE(header, HADDR_UNDEF);
  flip_bit(damaged, static_cast<int64_t>(data::seal::kBlockBytes + header), 2);
  data::seal::seal(damaged);
  std::string message = "no UserError";
  try {
    SnapshotReader reader(damaged);
  } catch (const UserError& e) {
    message = e.what();
  }
  EXPECT_TRUE(contains(message, damaged + ": cannot read its metadata (the file is damaged)"))
      << message;
  const std::string problem = validate_snapshot(damaged);
  EXPECT_TRUE(contains(problem, "cannot read its metadata")) << problem;
}

// ---- Finding, rotation ----

TEST(Snapshot, FindLatestSkipsADamagedNewestOneWithAWarning) {
  TempDir dir;
  EXPECT_EQ(find_latest_snapshot(dir / "missing"), std::nullopt);
  EXPECT_EQ(find_latest_snapshot(dir.path()), std::nullopt);
  for (const int64_t step : {10, 20, 300}) write_small(snapshot_path(dir.path(), step), step);
  std::ofstream(snapshot_path(dir.path(), 400) + ".tmp") << "a writer died here";
  std::ofstream(dir / "notes.txt") << "not a snapshot";
  EXPECT_EQ(find_latest_snapshot(dir.path()), snapshot_path(dir.path(), 300));

  flip_bit(snapshot_path(dir.path(), 300), data_offset(snapshot_path(dir.path(), 300), "params/w"));
  std::vector<std::string> warnings;
  const auto latest =
      find_latest_snapshot(dir.path(), [&](const std::string& w) { warnings.push_back(w); });
  EXPECT_EQ(latest, snapshot_path(dir.path(), 20));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(contains(warnings[0], "step-00000300.h5") && contains(warnings[0], "damaged"))
      << warnings[0];
  ASSERT_TRUE(latest);
  EXPECT_EQ(SnapshotReader(*latest).meta().step, 20);

  // Every one damaged: none.
  for (const int64_t step : {10, 20}) fs::resize_file(snapshot_path(dir.path(), step), 10);
  warnings.clear();
  EXPECT_EQ(find_latest_snapshot(dir.path(), [&](const std::string& w) { warnings.push_back(w); }),
            std::nullopt);
  EXPECT_EQ(warnings.size(), 3u);
}

TEST(Snapshot, RotationKeepsTheNewestAndRemovesStaleTemporaries) {
  TempDir dir;
  for (int64_t step = 1; step <= 5; ++step) write_small(snapshot_path(dir.path(), step * 100), step);
  const std::string stale = snapshot_path(dir.path(), 600) + ".tmp";
  std::ofstream(stale) << "partial";
  std::ofstream(dir / "keep.tmp") << "someone else's";

  EXPECT_EQ(rotate_snapshots(dir.path(), 0), std::vector<std::string>{stale});  // keeps all
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(dir / "keep.tmp"));
  for (int64_t step = 1; step <= 5; ++step) EXPECT_TRUE(fs::exists(snapshot_path(dir.path(), step * 100)));

  const std::vector<std::string> removed = rotate_snapshots(dir.path(), 2);
  EXPECT_EQ(removed.size(), 3u);
  for (int64_t step = 1; step <= 5; ++step)
    EXPECT_EQ(fs::exists(snapshot_path(dir.path(), step * 100)), step >= 4) << step;
  EXPECT_EQ(rotate_snapshots(dir.path(), 1),
            std::vector<std::string>{snapshot_path(dir.path(), 400)});
  EXPECT_TRUE(fs::exists(snapshot_path(dir.path(), 500)));
  EXPECT_TRUE(rotate_snapshots(dir.path(), 1).empty());
  EXPECT_THROW(rotate_snapshots(dir.path(), -1), std::invalid_argument);
}

// ---- Failures never touch the previous snapshot ----

TEST(Snapshot, AnUncommittedWriterLeavesNothingAndNeverTouchesTheFinalFile) {
  TempDir dir;
  const std::string path = snapshot_path(dir.path(), 5);
  write_small(path, 5);
  const std::string before = test::read_file(path);
  for (const bool parallel : {true, false}) {
    SnapshotWriterOptions options;
    options.parallel = parallel;
    SnapshotWriter writer(context(), path, test_meta(6), options);
    writer.write_replicated("params/w", torch::ones({1000}));
    EXPECT_TRUE(fs::exists(path + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_EQ(validate_snapshot(path), "");
}

class SnapshotFailure : public ::testing::TestWithParam<bool> {};  // param: parallel HDF5

TEST_P(SnapshotFailure, InjectedWriteFailureKeepsThePreviousSnapshot) {
  TempDir dir;
  const std::string path = snapshot_path(dir.path(), 5);
  write_small(path, 5);
  const std::string before = test::read_file(path);
  SnapshotWriterOptions options;
  options.parallel = GetParam();
  options.inject_failure_after_bytes = 1000;
  SnapshotWriter writer(context(), path, test_meta(6), options);
  writer.write_replicated("params/a", torch::ones({200}));  // 800 bytes: still fine
  try {
    writer.write_replicated("params/b", torch::ones({200}));
    ADD_FAILURE() << "expected SnapshotWriteError";
  } catch (const SnapshotWriteError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, path)) << message;
    EXPECT_TRUE(contains(message, "injected write failure")) << message;
    EXPECT_TRUE(contains(message, "params/b")) << message;
  }
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_THROW(writer.write_replicated("params/c", torch::ones({1})), std::logic_error);
  EXPECT_THROW(writer.commit(), std::logic_error);
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_EQ(validate_snapshot(path), "");
  EXPECT_EQ(SnapshotReader(path).meta().step, 5);
}

TEST_P(SnapshotFailure, InjectedCommitFailureKeepsThePreviousSnapshot) {
  TempDir dir;
  const std::string path = snapshot_path(dir.path(), 5);
  write_small(path, 5);
  const std::string before = test::read_file(path);
  SnapshotWriterOptions options;
  options.parallel = GetParam();
  options.inject_failure_at_commit = true;
  SnapshotWriter writer(context(), path, test_meta(6), options);
  writer.write_replicated("params/w", torch::ones({10}));
  EXPECT_THROW(writer.commit(), SnapshotWriteError);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(test::read_file(path), before);
}

// A real full disk: a 256 KiB tmpfs holds the previous snapshot, the next one does not fit.
TEST_P(SnapshotFailure, RealFullDiskKeepsThePreviousSnapshot) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  TempDir dir;
  const std::string mount_point = dir / "small";
  fs::create_directory(mount_point);
  if (::mount("tmpfs", mount_point.c_str(), "tmpfs", 0, "size=256k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno)
                 << "); the injected failures cover the same path";
  struct Unmount {
    std::string path;
    ~Unmount() { ::umount(path.c_str()); }
  } unmount{mount_point};

  const std::string path = snapshot_path(mount_point, 1);
  write_small(path, 1, 1000, GetParam());
  const std::string before = test::read_file(path);
  const std::string next = snapshot_path(mount_point, 2);
  SnapshotWriterOptions options;
  options.parallel = GetParam();
  try {
    SnapshotWriter writer(context(), next, test_meta(2), options);
    writer.write_replicated("params/big", torch::ones({256 * 1024}));  // 1 MiB
    writer.commit();
    ADD_FAILURE() << "a 1 MiB snapshot fit into a 256 KiB tmpfs";
  } catch (const SnapshotWriteError& e) {
    const std::string message = e.what();
    EXPECT_TRUE(contains(message, next)) << message;
    EXPECT_TRUE(contains(message, "No space left on device") ||
                contains(message, "MPI_ERR_NO_SPACE"))
        << message;
    std::printf("full disk (%s): %s\n", GetParam() ? "parallel" : "gathered", message.c_str());
  }
  EXPECT_FALSE(fs::exists(next + ".tmp"));
  EXPECT_FALSE(fs::exists(next));
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "HDF5 objects left open";
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_FILE), 0) << "HDF5 files left open";
  EXPECT_EQ(test::read_file(path), before);
  EXPECT_EQ(validate_snapshot(path), "");
  EXPECT_EQ(find_latest_snapshot(mount_point), path);
  EXPECT_TRUE(same_bits(SnapshotReader(path).read("params/w"),
                        pattern_tensor(torch::kFloat32, {1000}, 1)));
}

INSTANTIATE_TEST_SUITE_P(Modes, SnapshotFailure, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "parallel" : "gathered"; });

}  // namespace
}  // namespace tessera
