// Bodies of the HDF5 wrappers in h5.h. Unexpected failures throw through H5_CHECK; failures that
// bad input causes (a missing file, a file that is not HDF5) become UserError, printed quietly.
#include "framework/data/h5.h"

#include "distributed/errors.h"
#include "framework/data/file_seal.h"

namespace tessera::data::h5 {

namespace {

hid_t file_type(Type type) {
  switch (type) {
    case Type::U8: return H5T_STD_U8LE;
    case Type::I32: return H5T_STD_I32LE;
    case Type::F32: return H5T_IEEE_F32LE;
    case Type::F64: return H5T_IEEE_F64LE;
    case Type::I64: return H5T_STD_I64LE;
  }
  return H5I_INVALID_HID;
}

hid_t memory_type(Type type) {
  switch (type) {
    case Type::U8: return H5T_NATIVE_UINT8;
    case Type::I32: return H5T_NATIVE_INT32;
    case Type::F32: return H5T_NATIVE_FLOAT;
    case Type::F64: return H5T_NATIVE_DOUBLE;
    case Type::I64: return H5T_NATIVE_INT64;
  }
  return H5I_INVALID_HID;
}

Id simple_space(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return Id(H5_CHECK(H5Screate(H5S_SCALAR)), H5Sclose);
  return Id(H5_CHECK(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr)),
            H5Sclose);
}

// A file access property list that tolerates filesystems without file locks (NFS, Lustre).
Id file_access() {
  Id fapl(H5_CHECK(H5Pcreate(H5P_FILE_ACCESS)), H5Pclose);
#if H5_VERSION_GE(1, 10, 7)
  H5_CHECK(H5Pset_file_locking(fapl.get(), /*use_file_locking=*/true,
                               /*ignore_when_disabled=*/true));
#endif
  return fapl;
}

Id selected_space(hid_t dataset, const std::vector<hsize_t>& start,
                  const std::vector<hsize_t>& count) {
  Id space(H5_CHECK(H5Dget_space(dataset)), H5Sclose);
  H5_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(),
                               nullptr));
  return space;
}

}  // namespace

// ---- Id, QuietErrors ----

Id& Id::operator=(Id&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    closer_ = other.closer_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Id::reset() {
  if (valid() && closer_) closer_(id_);
  id_ = H5I_INVALID_HID;
}

void Id::close() {
  if (!valid()) return;
  const hid_t id = id_;
  id_ = H5I_INVALID_HID;
  H5_CHECK(closer_(id));
}

QuietErrors::QuietErrors() {
  H5Eget_auto2(H5E_DEFAULT, &function_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

QuietErrors::~QuietErrors() { H5Eset_auto2(H5E_DEFAULT, function_, data_); }

namespace {
// One stack entry as text, collected innermost first by ErrorCapture::record.
struct StackText {
  std::vector<std::string> lines;
  std::string os_cause;  // "No space left on device", from a driver's "error message = '...'"
  std::string mpi_cause;  // the text of an "MPI Error String" entry
  std::string innermost;  // the innermost description and its minor message
};

herr_t collect_entry(unsigned /*n*/, const H5E_error2_t* entry, void* data) {
  auto& text = *static_cast<StackText*>(data);
  const std::string description = entry->desc ? entry->desc : "";
  char minor[256] = {0};
  H5Eget_msg(entry->min_num, nullptr, minor, sizeof(minor));
  text.lines.push_back(std::string(entry->func_name ? entry->func_name : "?") + ": " +
                       description + " (" + minor + ")");
  if (text.innermost.empty()) text.innermost = description + " (" + minor + ")";
  // The sec2 driver reports a failed system call as "..., errno = 28, error message = 'No space
  // left on device', ...".
  constexpr const char* kMarker = "error message = '";
  const size_t at = description.find(kMarker);
  if (text.os_cause.empty() && at != std::string::npos) {
    const size_t begin = at + std::string(kMarker).size();
    text.os_cause = description.substr(begin, description.find('\'', begin) - begin);
  }
  if (text.mpi_cause.empty() && std::string(minor) == "MPI Error String")
    text.mpi_cause = description;
  return 0;
}
}  // namespace

ErrorCapture::ErrorCapture() {
  H5Eget_auto2(H5E_DEFAULT, &function_, &data_);
  H5Eset_auto2(H5E_DEFAULT, &ErrorCapture::record, this);
}

ErrorCapture::~ErrorCapture() { H5Eset_auto2(H5E_DEFAULT, function_, data_); }

void ErrorCapture::clear() {
  cause_.clear();
  stack_.clear();
}

herr_t ErrorCapture::record(hid_t stack, void* self_data) {
  auto& self = *static_cast<ErrorCapture*>(self_data);
  if (!self.cause_.empty()) return 0;  // keep the first failure: later ones are its echoes
  StackText text;
  H5Ewalk2(stack, H5E_WALK_UPWARD, collect_entry, &text);
  for (const std::string& line : text.lines) self.stack_ += line + "\n";
  if (!text.os_cause.empty()) self.cause_ = text.os_cause;
  else if (!text.mpi_cause.empty()) self.cause_ = text.mpi_cause;
  else if (!text.innermost.empty()) self.cause_ = text.innermost;
  else self.cause_ = "HDF5 reported an error without details";
  return 0;
}

// ---- Types ----

const char* type_name(Type type) {
  switch (type) {
    case Type::U8: return "u8";
    case Type::I32: return "i32";
    case Type::F32: return "f32";
    case Type::F64: return "f64";
    case Type::I64: return "i64";
  }
  return "?";
}

hid_t stored_type_id(Type type) { return file_type(type); }
hid_t native_type_id(Type type) { return memory_type(type); }

bool has_type(hid_t dataset, Type type) {
  Id stored(H5_CHECK(H5Dget_type(dataset)), H5Tclose);
  const H5T_class_t type_class = H5Tget_class(stored.get());
  const size_t size = H5Tget_size(stored.get());
  switch (type) {
    case Type::U8:
      return type_class == H5T_INTEGER && size == 1 && H5Tget_sign(stored.get()) == H5T_SGN_NONE;
    case Type::I32:
      return type_class == H5T_INTEGER && size == 4 && H5Tget_sign(stored.get()) == H5T_SGN_2;
    case Type::F32: return type_class == H5T_FLOAT && size == 4;
    case Type::F64: return type_class == H5T_FLOAT && size == 8;
    case Type::I64:
      return type_class == H5T_INTEGER && size == 8 && H5Tget_sign(stored.get()) == H5T_SGN_2;
  }
  return false;
}

std::string describe_type(hid_t dataset) {
  Id stored(H5_CHECK(H5Dget_type(dataset)), H5Tclose);
  const std::string bits = std::to_string(8 * H5Tget_size(stored.get()));
  switch (H5Tget_class(stored.get())) {
    case H5T_INTEGER: return (H5Tget_sign(stored.get()) == H5T_SGN_NONE ? "u" : "i") + bits;
    case H5T_FLOAT: return "f" + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    default: return "another type";
  }
}

// ---- Files ----

namespace {

// H5Fcreate with `fapl`, closing SEMI: closing fails while objects are still open, so a
// successful close() means the file is complete on disk (the writer renames it right after).
// The file starts with a user block of seal::kBlockBytes for the writer's seal.
Id create_with(const std::string& path, Id fapl) {
  H5_CHECK(H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_SEMI));
  Id fcpl(H5_CHECK(H5Pcreate(H5P_FILE_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_userblock(fcpl.get(), seal::kBlockBytes));
  // No creation or modification times in any object (here the root group; groups and datasets
  // below): a file then holds only what was written, so the same data gives the same bytes and
  // the same seal on every run and every machine.
  H5_CHECK(H5Pset_obj_track_times(fcpl.get(), false));
  hid_t file = H5I_INVALID_HID;
  {
    QuietErrors quiet;
    file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
  }
  if (file < 0)
    throw UserError(path + ": cannot create the file (does the directory exist, is it writable?)");
  return Id(file, H5Fclose);
}

}  // namespace

Id create_file(const std::string& path) { return create_with(path, file_access()); }

Id open_file_read_only(const std::string& path) {
  seal::verify(path);
  Id fapl = file_access();
  hid_t file = H5I_INVALID_HID;
  {
    QuietErrors quiet;
    file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get());
  }
  if (file < 0) throw UserError(path + ": sealed, but not a readable HDF5 file");
  return Id(file, H5Fclose);
}

void flush(hid_t file) { H5_CHECK(H5Fflush(file, H5F_SCOPE_GLOBAL)); }

#ifdef H5_HAVE_PARALLEL
Id create_file_mpio(const std::string& path, MPI_Comm comm) {
  Id fapl = file_access();
  H5_CHECK(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL));
  // Metadata is read once and broadcast, and written collectively, instead of by every rank.
  H5_CHECK(H5Pset_all_coll_metadata_ops(fapl.get(), true));
  H5_CHECK(H5Pset_coll_metadata_write(fapl.get(), true));
  return create_with(path, std::move(fapl));
}
#endif

// ---- Groups and links ----

Kind kind_of(hid_t loc, const std::string& path) {
  // H5Lexists fails (instead of answering false) when an intermediate group is missing, so each
  // component is checked in turn; it also fails when a component is a dataset, not a group, and
  // H5Oopen fails on a dangling soft link: all of these are "missing" here.
  QuietErrors quiet;
  size_t end = 0;
  while (end != std::string::npos) {
    end = path.find('/', end + 1);
    const std::string prefix = path.substr(0, end);
    if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return Kind::Missing;
  }
  const hid_t object = H5Oopen(loc, path.c_str(), H5P_DEFAULT);
  if (object < 0) return Kind::Missing;
  Id opened(object, H5Oclose);
  switch (H5Iget_type(object)) {
    case H5I_GROUP: return Kind::Group;
    case H5I_DATASET: return Kind::Dataset;
    default: return Kind::Other;
  }
}

Id create_group(hid_t loc, const std::string& name) {
  Id gcpl(H5_CHECK(H5Pcreate(H5P_GROUP_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_obj_track_times(gcpl.get(), false));
  return Id(H5_CHECK(H5Gcreate2(loc, name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT)),
            H5Gclose);
}

Id open_group(hid_t loc, const std::string& name) {
  return Id(H5_CHECK(H5Gopen2(loc, name.c_str(), H5P_DEFAULT)), H5Gclose);
}

// ---- Datasets ----

Id create_dataset(hid_t loc, const std::string& name, Type type, const std::vector<hsize_t>& dims,
                  const std::vector<hsize_t>& chunk, int deflate_level) {
  Id space = simple_space(dims);
  Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
  H5_CHECK(H5Pset_obj_track_times(dcpl.get(), false));  // no times (create_with)
  if (!chunk.empty()) {
    H5_CHECK(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()));
    if (deflate_level > 0) H5_CHECK(H5Pset_deflate(dcpl.get(), static_cast<unsigned>(deflate_level)));
  }
  return Id(H5_CHECK(H5Dcreate2(loc, name.c_str(), file_type(type), space.get(), H5P_DEFAULT,
                                dcpl.get(), H5P_DEFAULT)),
            H5Dclose);
}

Id open_dataset(hid_t loc, const std::string& name) {
  return Id(H5_CHECK(H5Dopen2(loc, name.c_str(), H5P_DEFAULT)), H5Dclose);
}

std::vector<hsize_t> dims(hid_t dataset) {
  Id space(H5_CHECK(H5Dget_space(dataset)), H5Sclose);
  const int rank = H5_CHECK(H5Sget_simple_extent_ndims(space.get()));
  std::vector<hsize_t> result(static_cast<size_t>(rank));
  if (rank > 0) H5_CHECK(H5Sget_simple_extent_dims(space.get(), result.data(), nullptr));
  return result;
}

std::vector<hsize_t> chunk_dims(hid_t dataset) {
  Id dcpl(H5_CHECK(H5Dget_create_plist(dataset)), H5Pclose);
  if (H5Pget_layout(dcpl.get()) != H5D_CHUNKED) return {};
  std::vector<hsize_t> result(H5S_MAX_RANK);
  const int rank = H5_CHECK(H5Pget_chunk(dcpl.get(), H5S_MAX_RANK, result.data()));
  result.resize(static_cast<size_t>(rank));
  return result;
}

int deflate_level(hid_t dataset) {
  Id dcpl(H5_CHECK(H5Dget_create_plist(dataset)), H5Pclose);
  const int filters = H5_CHECK(H5Pget_nfilters(dcpl.get()));
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values_count = 1;
    unsigned values[1] = {0};
    const H5Z_filter_t filter = H5_CHECK(H5Pget_filter2(
        dcpl.get(), static_cast<unsigned>(i), &flags, &values_count, values, 0, nullptr, &config));
    if (filter == H5Z_FILTER_DEFLATE) return static_cast<int>(values[0]);
  }
  return -1;
}

void write(hid_t dataset, Type type, const void* data) {
  H5_CHECK(H5Dwrite(dataset, memory_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void read(hid_t dataset, Type type, void* data) {
  H5_CHECK(H5Dread(dataset, memory_type(type), H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
}

void write_block(hid_t dataset, Type type, const std::vector<hsize_t>& start,
                 const std::vector<hsize_t>& count, const void* data) {
  Id file_space = selected_space(dataset, start, count);
  Id memory_space = simple_space(count);
  H5_CHECK(H5Dwrite(dataset, memory_type(type), memory_space.get(), file_space.get(), H5P_DEFAULT,
                    data));
}

void write_block(hid_t dataset, Type type, const std::vector<hsize_t>& start,
                 const std::vector<hsize_t>& count, const void* data, hid_t transfer) {
  bool empty = false;
  for (const hsize_t n : count) empty = empty || n == 0;
  if (!empty) {
    Id file_space = selected_space(dataset, start, count);
    Id memory_space = simple_space(count);
    H5_CHECK(H5Dwrite(dataset, memory_type(type), memory_space.get(), file_space.get(), transfer,
                      data));
    return;
  }
  Id file_space(H5_CHECK(H5Dget_space(dataset)), H5Sclose);
  H5_CHECK(H5Sselect_none(file_space.get()));
  Id memory_space = simple_space({1});
  H5_CHECK(H5Sselect_none(memory_space.get()));
  const unsigned char unused = 0;
  H5_CHECK(H5Dwrite(dataset, memory_type(type), memory_space.get(), file_space.get(), transfer,
                    data ? data : &unused));
}

void read_block(hid_t dataset, Type type, const std::vector<hsize_t>& start,
                const std::vector<hsize_t>& count, void* data) {
  Id file_space = selected_space(dataset, start, count);
  Id memory_space = simple_space(count);
  H5_CHECK(H5Dread(dataset, memory_type(type), memory_space.get(), file_space.get(), H5P_DEFAULT,
                   data));
}

// ---- Attributes ----

bool has_attribute(hid_t object, const std::string& name) {
  return H5_CHECK(H5Aexists(object, name.c_str())) > 0;
}

namespace {
void write_attribute(hid_t object, const std::string& name, hid_t stored, hid_t memory,
                     const std::vector<hsize_t>& dims, const void* data) {
  Id space = simple_space(dims);
  Id attribute(H5_CHECK(H5Acreate2(object, name.c_str(), stored, space.get(), H5P_DEFAULT,
                                   H5P_DEFAULT)),
               H5Aclose);
  H5_CHECK(H5Awrite(attribute.get(), memory, data));
}

Id open_attribute(hid_t object, const std::string& name) {
  return Id(H5_CHECK(H5Aopen(object, name.c_str(), H5P_DEFAULT)), H5Aclose);
}

hssize_t element_count(hid_t attribute) {
  Id space(H5_CHECK(H5Aget_space(attribute)), H5Sclose);
  return H5_CHECK(H5Sget_simple_extent_npoints(space.get()));
}
}  // namespace

void write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  Id type(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_size(type.get(), H5T_VARIABLE));
  H5_CHECK(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  const char* text = value.c_str();
  write_attribute(object, name, type.get(), type.get(), {}, &text);
}

void write_int_attribute(hid_t object, const std::string& name, int32_t value) {
  write_attribute(object, name, H5T_STD_I32LE, H5T_NATIVE_INT32, {}, &value);
}

void write_double_attribute(hid_t object, const std::string& name, double value) {
  write_attribute(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {}, &value);
}

void write_doubles_attribute(hid_t object, const std::string& name,
                             const std::vector<double>& values) {
  write_attribute(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, {values.size()},
                  values.data());
}

void write_int64_attribute(hid_t object, const std::string& name, int64_t value) {
  write_attribute(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, {}, &value);
}

void write_uint64_attribute(hid_t object, const std::string& name, uint64_t value) {
  write_attribute(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, {}, &value);
}

AttributeInfo attribute_info(hid_t object, const std::string& name) {
  Id attribute = open_attribute(object, name);
  Id type(H5_CHECK(H5Aget_type(attribute.get())), H5Tclose);
  return {H5Tget_class(type.get()), element_count(attribute.get())};
}

std::optional<std::string> read_string_attribute(hid_t object, const std::string& name) {
  if (!has_attribute(object, name)) return std::nullopt;
  Id attribute = open_attribute(object, name);
  Id stored(H5_CHECK(H5Aget_type(attribute.get())), H5Tclose);
  if (H5Tget_class(stored.get()) != H5T_STRING || element_count(attribute.get()) != 1)
    return std::nullopt;
  Id memory(H5_CHECK(H5Tcopy(H5T_C_S1)), H5Tclose);
  H5_CHECK(H5Tset_cset(memory.get(), H5Tget_cset(stored.get())));
  if (H5_CHECK(H5Tis_variable_str(stored.get())) > 0) {
    H5_CHECK(H5Tset_size(memory.get(), H5T_VARIABLE));
    char* text = nullptr;
    H5_CHECK(H5Aread(attribute.get(), memory.get(), &text));
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  // Fixed length: one byte more than stored, NUL-terminated, whatever padding the file used.
  const size_t size = H5Tget_size(stored.get());
  H5_CHECK(H5Tset_size(memory.get(), size + 1));
  H5_CHECK(H5Tset_strpad(memory.get(), H5T_STR_NULLTERM));
  std::vector<char> buffer(size + 1, '\0');
  H5_CHECK(H5Aread(attribute.get(), memory.get(), buffer.data()));
  return std::string(buffer.data());
}

std::vector<int64_t> read_int_attribute(hid_t object, const std::string& name) {
  Id attribute = open_attribute(object, name);
  std::vector<int64_t> values(static_cast<size_t>(element_count(attribute.get())));
  H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_INT64, values.data()));
  return values;
}

std::vector<double> read_doubles_attribute(hid_t object, const std::string& name) {
  Id attribute = open_attribute(object, name);
  std::vector<double> values(static_cast<size_t>(element_count(attribute.get())));
  H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, values.data()));
  return values;
}

std::optional<uint64_t> read_uint64_attribute(hid_t object, const std::string& name) {
  if (!has_attribute(object, name)) return std::nullopt;
  Id attribute = open_attribute(object, name);
  Id stored(H5_CHECK(H5Aget_type(attribute.get())), H5Tclose);
  if (H5Tget_class(stored.get()) != H5T_INTEGER || H5Tget_size(stored.get()) != 8 ||
      H5Tget_sign(stored.get()) != H5T_SGN_NONE || element_count(attribute.get()) != 1)
    return std::nullopt;
  uint64_t value = 0;
  H5_CHECK(H5Aread(attribute.get(), H5T_NATIVE_UINT64, &value));
  return value;
}

}  // namespace tessera::data::h5
