// The seal of Tessera's HDF5 files (framework/data/file_seal.h): a sealed file opens, any damaged
// byte, a truncation or an extension is refused by name before HDF5 reads the file, an unsealed
// HDF5 file is named as such, and slices summed apart seal the same file as one pass.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "distributed/errors.h"
#include "framework/data/file_seal.h"
#include "framework/data/h5.h"
#include "tests/test_util.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

class SealTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(testing::TempDir()) / "tessera_seal_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

  // A small HDF5 file made by h5::create_file (room for the seal), not yet sealed.
  std::string make_file(const std::string& name) const {
    const std::string file = path(name);
    h5::Id id = h5::create_file(file);
    h5::write_string_attribute(id.get(), "format", "seal-test");
    h5::Id dataset = h5::create_dataset(id.get(), "values", h5::Type::I32, {64});
    std::vector<int32_t> values(64);
    for (int i = 0; i < 64; ++i) values[i] = i * i;
    h5::write(dataset.get(), h5::Type::I32, values.data());
    dataset.close();
    id.close();
    return file;
  }

  // The UserError message of seal::verify(file), or "" when it passes.
  static std::string refusal(const std::string& file) {
    try {
      seal::verify(file);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }

  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << bytes;
    ASSERT_TRUE(out.good()) << file;
  }

  std::string dir_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(SealTest, ASealedFileVerifiesAndHdf5ReadsItBehindTheBlock) {
  const std::string file = make_file("a.h5");
  seal::seal(file);
  EXPECT_EQ(refusal(file), "");
  const std::string bytes = test::read_file(file);
  EXPECT_EQ(bytes.compare(0, 15, "tessera-seal 1\n"), 0);
  EXPECT_TRUE(contains(bytes.substr(0, 512), "\nbody-bytes " + std::to_string(bytes.size() - 512) +
                                                 "\n"));
  EXPECT_EQ(bytes.compare(512, 4, "\x89HDF"), 0) << "HDF5's superblock follows the block";
  // Read back through Tessera and through the plain HDF5 API, as h5py would.
  h5::Id opened = h5::open_file_read_only(file);
  EXPECT_EQ(h5::read_string_attribute(opened.get(), "format"), "seal-test");
  const hid_t plain = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(plain, 0);
  H5Fclose(plain);
  // Sealing twice writes the same block.
  seal::seal(file);
  EXPECT_EQ(test::read_file(file), bytes);
}

TEST_F(SealTest, EveryDamagedByteIsRefusedNamingTheFile) {
  const std::string file = make_file("good.h5");
  seal::seal(file);
  const std::string good = test::read_file(file);
  const std::string damaged = path("damaged.h5");
  int refused = 0;
  for (size_t at = 0; at < good.size(); ++at) {
    std::string bytes = good;
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << (at % 8)));
    write_bytes(damaged, bytes);
    const std::string message = refusal(damaged);
    EXPECT_EQ(message.rfind(damaged + ": ", 0), 0u) << "byte " << at << ": '" << message << "'";
    if (at >= seal::kBlockBytes) {
      EXPECT_TRUE(contains(message, "damaged: its checksum is")) << "byte " << at << ": " << message;
    }
    refused += !message.empty();
  }
  EXPECT_EQ(refused, static_cast<int>(good.size()));
}

TEST_F(SealTest, TruncatedExtendedAndForeignFilesAreNamed) {
  const std::string file = make_file("good.h5");
  seal::seal(file);
  const std::string good = test::read_file(file);
  const std::string total = std::to_string(good.size());

  const std::string cut = path("cut.h5");
  write_bytes(cut, good.substr(0, good.size() - 1));
  EXPECT_EQ(refusal(cut), cut + ": truncated: its seal says " + total + " bytes, the file has " +
                              std::to_string(good.size() - 1) + " (copy it again)");
  write_bytes(cut, good.substr(0, 100));
  EXPECT_EQ(refusal(cut),
            cut + ": 100 bytes: not a Tessera file (truncated, or not a file Tessera wrote?)");
  write_bytes(cut, good.substr(seal::kBlockBytes, 100));  // the start of HDF5's part alone
  EXPECT_TRUE(contains(refusal(cut), cut + ": an HDF5 file without a Tessera seal")) << refusal(cut);
  const std::string longer = path("longer.h5");
  write_bytes(longer, good + "x");
  EXPECT_TRUE(contains(refusal(longer), longer + ": longer than it was written")) << refusal(longer);

  // An HDF5 file that is not sealed (another program's, or an unsealed older version).
  const std::string plain = path("plain.h5");
  const hid_t id = H5Fcreate(plain.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(id, 0);
  H5Fclose(id);
  EXPECT_TRUE(contains(refusal(plain), plain + ": an HDF5 file without a Tessera seal"))
      << refusal(plain);
  EXPECT_THROW(h5::open_file_read_only(plain), UserError);

  const std::string text = path("text.h5");
  write_bytes(text, std::string(600, 'x'));
  EXPECT_EQ(refusal(text), text + ": not a Tessera file (it does not start with a Tessera seal; "
                                  "not HDF5, or damaged?)");
  std::string newer = good;
  newer[13] = '2';
  write_bytes(text, newer);
  EXPECT_EQ(refusal(text), text + ": sealed by a newer Tessera (seal version 2, this build reads "
                                  "version 1); update Tessera (or the file is damaged)");
  // A seal that parses but is not written as Tessera writes it (a leading zero).
  std::string padded = good;
  const size_t digits = padded.find("body-bytes ") + 11;
  padded.insert(digits, "0");
  padded.erase(seal::kBlockBytes - 1, 1);  // still 512 bytes of block
  write_bytes(text, padded);
  EXPECT_EQ(refusal(text), text + ": its seal (the first 512 bytes) is damaged");

  EXPECT_EQ(refusal(path("none.h5")), path("none.h5") + ": no such file");
  EXPECT_EQ(refusal(dir_), dir_ + ": is a directory, not a Tessera file");
}

TEST_F(SealTest, SlicesSummedApartSealTheSameFile) {
  const std::string file = make_file("parts.h5");
  seal::seal(file);
  const std::string whole = test::read_file(file);
  const uint64_t bytes = seal::body_bytes(file);
  ASSERT_EQ(bytes, whole.size() - seal::kBlockBytes);
  // Three uneven slices, boundaries inside 8-byte words, as ranks of a parallel writer take.
  const uint64_t a = bytes / 3 + 1, b = 2 * bytes / 3 + 5;
  const uint64_t sum =
      seal::body_sum(file, 0, a) + seal::body_sum(file, a, b) + seal::body_sum(file, b, bytes);
  std::ofstream(file, std::ios::in | std::ios::out | std::ios::binary).write(
      std::string(seal::kBlockBytes, '\0').data(), seal::kBlockBytes);  // the seal wiped
  EXPECT_NE(refusal(file), "");
  seal::write(file, sum, bytes);
  EXPECT_EQ(test::read_file(file), whole);
  EXPECT_EQ(refusal(file), "");
}

}  // namespace
}  // namespace tessera::data
