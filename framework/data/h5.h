// Small RAII wrappers over the HDF5 C API for Tessera's files (datasets, later snapshots):
// identifiers that close themselves, typed attributes, and datasets read whole or by hyperslab.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessera::data::h5 {

// An HDF5 identifier that closes itself with the function its creator chose (H5Fclose, ...).
class Id {
 public:
  using Closer = herr_t (*)(hid_t);
  Id() = default;
  Id(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  ~Id() { reset(); }
  Id(Id&& other) noexcept : id_(other.id_), closer_(other.closer_) { other.id_ = H5I_INVALID_HID; }
  Id& operator=(Id&& other) noexcept;
  Id(const Id&) = delete;
  Id& operator=(const Id&) = delete;

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();  // closes now, ignoring a failure (destructors must not throw)
  void close();  // closes now and throws when HDF5 reports a failure (e.g. a final flush)
  // Gives up ownership without closing and returns the identifier (for a caller that must keep a
  // file whose close failed, to retry it).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// While alive, HDF5 prints no error stack and the first failure's stack is kept, so that a caller
// can name the cause ("No space left on device") in its own message. Nests with QuietErrors.
class ErrorCapture {
 public:
  ErrorCapture();
  ~ErrorCapture();
  ErrorCapture(const ErrorCapture&) = delete;
  ErrorCapture& operator=(const ErrorCapture&) = delete;

  // The innermost cause of the first failure since construction or clear(): the operating
  // system's or MPI's error text when HDF5 reports one, else HDF5's innermost description; ""
  // when nothing failed.
  const std::string& cause() const { return cause_; }
  // Every line of that failure's stack, innermost first.
  const std::string& stack() const { return stack_; }
  void clear();

 private:
  static herr_t record(hid_t stack, void* self);
  H5E_auto2_t function_ = nullptr;
  void* data_ = nullptr;
  std::string cause_;
  std::string stack_;
};

// While alive, HDF5 prints no error stack. For calls whose failure is expected and turned into
// a UserError (opening a file that is not HDF5, creating a file in a missing directory).
class QuietErrors {
 public:
  QuietErrors();
  ~QuietErrors();
  QuietErrors(const QuietErrors&) = delete;
  QuietErrors& operator=(const QuietErrors&) = delete;

 private:
  H5E_auto2_t function_ = nullptr;
  void* data_ = nullptr;
};

// Element types of Tessera files. On disk they are little-endian (H5T_STD_U8LE, H5T_STD_I32LE,
// H5T_IEEE_F32LE, H5T_IEEE_F64LE, H5T_STD_I64LE); in memory they are the native types.
enum class Type { U8, I32, F32, F64, I64 };
const char* type_name(Type type);  // "u8", "i32", "f32", "f64", "i64"
// The HDF5 type ids of `type` on disk (little-endian) and in memory (native); library constants.
hid_t stored_type_id(Type type);
hid_t native_type_id(Type type);
// True when `dataset`'s stored element type is `type` (class, size and signedness).
bool has_type(hid_t dataset, Type type);
// The stored element type of `dataset` in words, for error messages ("f32", "string", ...).
std::string describe_type(hid_t dataset);

// ---- Files ----
// Creates (truncating) `path`, with room for a seal before HDF5's part (framework/data/
// file_seal.h): the writer seals it once closed. Throws UserError when it cannot be created.
Id create_file(const std::string& path);
// Checks `path`'s seal (seal::verify: the whole file is read once), then opens it read-only with
// the default (serial) driver, so each rank may open it on its own. Throws UserError "PATH: ..."
// naming a missing, unsealed, truncated or damaged file.
Id open_file_read_only(const std::string& path);
void flush(hid_t file);
#ifdef H5_HAVE_PARALLEL
// Creates (truncating) `path` collectively over `comm` with the MPI-IO driver, with collective
// metadata reads and writes, and room for a seal as create_file. Every rank of `comm` must call it. Throws UserError when it cannot be
// created.
Id create_file_mpio(const std::string& path, MPI_Comm comm);
#endif

// ---- Groups and links ----
enum class Kind { Missing, Group, Dataset, Other };
// What `path` ("cameras/intrinsics") names below `loc`; Missing when any component is absent.
Kind kind_of(hid_t loc, const std::string& path);
Id create_group(hid_t loc, const std::string& name);
Id open_group(hid_t loc, const std::string& name);

// ---- Datasets ----
// `chunk` empty: contiguous storage; otherwise chunked with these dims, and deflate-compressed
// when `deflate_level` > 0.
Id create_dataset(hid_t loc, const std::string& name, Type type, const std::vector<hsize_t>& dims,
                  const std::vector<hsize_t>& chunk = {}, int deflate_level = 0);
Id open_dataset(hid_t loc, const std::string& name);
std::vector<hsize_t> dims(hid_t dataset);
std::vector<hsize_t> chunk_dims(hid_t dataset);  // empty when not chunked
int deflate_level(hid_t dataset);                // -1 when the deflate filter is not applied
// Whole dataset from / into a contiguous buffer of its element count.
void write(hid_t dataset, Type type, const void* data);
void read(hid_t dataset, Type type, void* data);
// The block at `start` of `count` elements per dimension, from / into a contiguous buffer.
// Only the chunks that the block overlaps are read.
void write_block(hid_t dataset, Type type, const std::vector<hsize_t>& start,
                 const std::vector<hsize_t>& count, const void* data);
void read_block(hid_t dataset, Type type, const std::vector<hsize_t>& start,
                const std::vector<hsize_t>& count, void* data);
// write_block with a transfer property list (collective MPI-IO). A `count` with a zero selects
// nothing, so that a rank without data still takes part in a collective write.
void write_block(hid_t dataset, Type type, const std::vector<hsize_t>& start,
                 const std::vector<hsize_t>& count, const void* data, hid_t transfer);

// ---- Attributes (on a file, group or dataset) ----
bool has_attribute(hid_t object, const std::string& name);
// Variable-length UTF-8 scalar string.
void write_string_attribute(hid_t object, const std::string& name, const std::string& value);
void write_int_attribute(hid_t object, const std::string& name, int32_t value);        // i32 scalar
void write_double_attribute(hid_t object, const std::string& name, double value);      // f64 scalar
void write_doubles_attribute(hid_t object, const std::string& name,
                             const std::vector<double>& values);                       // f64 [n]
void write_int64_attribute(hid_t object, const std::string& name, int64_t value);      // i64 scalar
void write_uint64_attribute(hid_t object, const std::string& name, uint64_t value);    // u64 scalar

// What an attribute holds, so that readers can check it before reading.
struct AttributeInfo {
  H5T_class_t type_class = H5T_NO_CLASS;  // H5T_STRING, H5T_INTEGER, H5T_FLOAT, ...
  hssize_t count = 0;                     // number of elements (1 for a scalar)
};
AttributeInfo attribute_info(hid_t object, const std::string& name);
// A string attribute, fixed- or variable-length; nullopt when absent or not a string.
std::optional<std::string> read_string_attribute(hid_t object, const std::string& name);
// Every element converted to int64 / double (the caller checks attribute_info first).
std::vector<int64_t> read_int_attribute(hid_t object, const std::string& name);
std::vector<double> read_doubles_attribute(hid_t object, const std::string& name);
// A scalar unsigned 64-bit integer attribute read without conversion; nullopt when absent or
// not a scalar 8-byte unsigned integer.
std::optional<uint64_t> read_uint64_attribute(hid_t object, const std::string& name);

}  // namespace tessera::data::h5
