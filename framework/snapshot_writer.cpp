// SnapshotWriter: writes a tessera-snapshot v2 file collectively, under a temporary name, and
// renames it into place on commit; every failure is agreed across ranks (docs/formats.md).
#include <fcntl.h>
#include <mpi.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "distributed/watchdog.h"
#include "framework/data/file_seal.h"
#include "framework/data/h5.h"
#include "framework/even_slice.h"
#include "framework/snapshot.h"
#include "framework/snapshot_layout.h"

namespace tessera {

namespace h5 = data::h5;
namespace layout = snapshot_layout;
namespace fs = std::filesystem;

namespace {

constexpr int kMaxDims = 8;  // more than any parameter or state tensor needs; fixes the descriptor

using distributed::broadcast_string;
using distributed::Failure;

// Collective: every rank passes its own error ("" when it succeeded) and learns the first one.
Failure agree(distributed::ProcessContext& context, const std::string& local, const std::string& what) {
  return distributed::agree_on_failure(context, local, "snapshot: agreeing after " + what);
}

// Runs `step`; returns "" or why it failed: the OS or MPI-IO cause when HDF5 reports one.
template <typename Step>
std::string attempt(Step&& step) {
  h5::ErrorCapture capture;
  try {
    step();
    return "";
  } catch (const std::exception& e) {
    return capture.cause().empty() ? std::string(e.what()) : capture.cause();
  }
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  if (rc != 0)
    throw std::runtime_error("fsync " + path + ": " + std::strerror(saved));
}

// HDF5's MPI-IO driver reports a failed write without the OS error (OpenMPI prints that to
// stderr). A full filesystem is by far the usual cause, so it is named when the folder has less
// room left than the write needed (or less than 1 MiB).
std::string with_space_diagnosis(const std::string& cause, const std::string& file,
                                 int64_t needed) {
  constexpr int64_t kLowSpaceBytes = int64_t{1} << 20;
  if (cause.find("No space left") != std::string::npos) return cause;
  const fs::path parent = fs::path(file).parent_path();
  struct statvfs info;
  if (::statvfs(parent.empty() ? "." : parent.c_str(), &info) != 0) return cause;
  const auto free_bytes = static_cast<int64_t>(info.f_bavail) * static_cast<int64_t>(info.f_frsize);
  if (free_bytes >= std::max(needed, kLowSpaceBytes)) return cause;
  return cause + ": " + std::strerror(ENOSPC) + " (" + std::to_string(free_bytes) +
         " bytes free in " + (parent.empty() ? std::string(".") : parent.string()) + ")";
}

std::string shape_text(const int64_t* dims, int64_t ndim) {
  std::string text = "[";
  for (int64_t i = 0; i < ndim; ++i) text += (i ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

}  // namespace

struct SnapshotWriter::Impl {
  distributed::ProcessContext& context;
  std::string final_path;
  std::string temp_path;
  SnapshotMeta meta;
  SnapshotWriterOptions options;
  bool parallel = false;
  h5::Id file;  // every rank in parallel mode; rank 0 only when gathering
  std::set<std::string> datasets;
  std::set<std::string> groups;
  int64_t bytes_written = 0;
  int64_t contributed = 0;  // bytes of this rank's data so far, for the failure hook
  enum class State { Open, Committed, Failed } state = State::Open;
  // The whole write is watched, not only the agreements: collective MPI-IO and HDF5 calls (open,
  // parallel writes, close) with a rank or node lost would otherwise wait forever. Past
  // distributed.timeout_s the job ends with exit code 3.
  distributed::Watchdog::Scope watch;

  Impl(distributed::ProcessContext& c, const std::string& path)
      : context(c), watch(c.watchdog(), "snapshot: writing " + path) {}
  ~Impl() {
    if (state == State::Open) discard();  // collective in parallel mode: every rank destroys it
  }

  int rank() const { return context.rank(); }
  int size() const { return context.size(); }

  void remove_temp() const {
    std::error_code ignored;
    fs::remove(temp_path, ignored);
  }

  void check_open(const char* what) const {
    if (state == State::Committed)
      throw std::logic_error(final_path + ": SnapshotWriter::" + what + " after commit()");
    if (state == State::Failed)
      throw std::logic_error(final_path + ": SnapshotWriter::" + what +
                             " after a failed write (the snapshot was abandoned)");
  }

  // Closes the file; when HDF5 cannot (a final flush onto a full disk), the file stays open and
  // owned by `file`, so that discard() can retry.
  void close_file() {
    if (!file.valid()) return;
    const hid_t id = file.get();
    const herr_t rc = H5Fclose(id);
    if (rc >= 0 || H5Iis_valid(id) <= 0) file.release();
    if (rc < 0) throw std::runtime_error("closing the file failed");
  }

  // Gives up the temporary file (collective in parallel mode; never throws). Its space is given
  // back first: a close flushes HDF5's metadata, which fails for good on a full disk and would
  // leave the file open (and HDF5 crashing at exit).
  void discard() noexcept {
    h5::QuietErrors quiet;
    if (rank() == 0 && file.valid()) ::truncate(temp_path.c_str(), 0);
    if (parallel) MPI_Barrier(context.world());  // the truncation precedes every rank's close
    try {
      close_file();
    } catch (const std::exception&) {
      file.release();  // nothing more can be done; HDF5 closes it at exit
    }
    if (rank() == 0) remove_temp();
  }

  // Abandons the snapshot on every rank (all are here: `failure` was agreed) and throws.
  [[noreturn]] void fail(const Failure& failure, const std::string& during) {
    state = State::Failed;
    discard();
    std::string where = during;
    if (size() > 1) where += " on rank " + std::to_string(failure.rank);
    throw SnapshotWriteError(final_path + ": snapshot not written: " + failure.message + " (" +
                             where + "); the previous snapshot, if any, is untouched");
  }

  bool writes_metadata() const { return parallel || rank() == 0; }

  void write_root_attributes() {
    const hid_t root = file.get();
    h5::write_string_attribute(root, layout::kFormatAttr, kSnapshotFormat);
    h5::write_int_attribute(root, layout::kVersionAttr, kSnapshotVersion);
    h5::write_int64_attribute(root, layout::kStepAttr, meta.step);
    h5::write_string_attribute(root, layout::kModelAttr, meta.model);
    h5::write_string_attribute(root, layout::kConfigAttr, meta.config_toml);
    h5::write_int_attribute(root, layout::kWorldSizeAttr, meta.world_size);
    h5::write_string_attribute(root, layout::kFingerprintAttr, meta.dataset_fingerprint);
    h5::write_string_attribute(root, layout::kTesseraVersionAttr, meta.tessera_version);
    h5::write_string_attribute(root, layout::kChecksumKindAttr, layout::kChecksumKind);
    h5::write_uint64_attribute(root, layout::kMetaChecksumAttr, layout::meta_checksum(meta));
  }

  // Creates the parent groups of `path` that do not exist yet (collective in parallel mode).
  void create_parents(const std::string& path) {
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string group = path.substr(0, slash);
      if (groups.insert(group).second) h5::create_group(file.get(), group);
    }
  }

  h5::Id create_dataset(const std::string& path, h5::Type type, const std::vector<hsize_t>& dims) {
    create_parents(path);
    h5::Id space(H5_CHECK(dims.empty() ? H5Screate(H5S_SCALAR)
                                       : H5Screate_simple(static_cast<int>(dims.size()),
                                                          dims.data(), nullptr)),
                 H5Sclose);
    h5::Id dcpl(H5_CHECK(H5Pcreate(H5P_DATASET_CREATE)), H5Pclose);
    H5_CHECK(H5Pset_obj_track_times(dcpl.get(), false));  // no times (h5::create_with)
    // Every byte is written, so HDF5 need not fill the space first (parallel allocates early).
    H5_CHECK(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER));
    return h5::Id(H5_CHECK(H5Dcreate2(file.get(), path.c_str(), h5::stored_type_id(type),
                                      space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT)),
                  H5Dclose);
  }

  void write(const std::string& name, const torch::Tensor& tensor, bool sharded);

  // The dataset count, a flush and close (collective in parallel mode); rank 0 alone seals a
  // file it wrote alone. Returns "" or why it failed.
  std::string attempt_commit_close() {
    return attempt([&] {
      if (file.valid()) {
        h5::write_int64_attribute(file.get(), layout::kDatasetCountAttr,
                                  static_cast<int64_t>(datasets.size()));
        h5::flush(file.get());
        close_file();
      }
      if (!parallel && rank() == 0) data::seal::seal(temp_path);
    });
  }

  // Collective, parallel mode: the seal of a file every rank wrote, each rank reading an even
  // slice of it for the checksum; rank 0 writes the seal. "" or why it failed (agreed).
  // The size is rank 0's, so that the slices cover the file even where another node's view of
  // its size lags (a rank that cannot read its slice fails the commit).
  Failure seal_in_parallel() {
    uint64_t bytes = 0, sum = 0;
    std::string error = rank() == 0 ? attempt([&] { bytes = data::seal::body_bytes(temp_path); })
                                    : "";
    Failure failure = agree(context, error, "measuring " + temp_path);
    if (failure.failed()) return failure;
    {
      distributed::Watchdog::Scope watch(context.watchdog(), "snapshot: size of the file");
      MPI_CHECK(MPI_Bcast(&bytes, 1, MPI_UINT64_T, 0, context.world()));
    }
    error = attempt([&] {
      const auto [begin, end] = even_slice(static_cast<int64_t>(bytes), rank(), size());
      sum = data::seal::body_sum(temp_path, static_cast<uint64_t>(begin),
                                 static_cast<uint64_t>(end));
    });
    failure = agree(context, error, "reading " + temp_path + " for its seal");
    if (failure.failed()) return failure;
    {
      distributed::Watchdog::Scope watch(context.watchdog(), "snapshot: checksum of the file");
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, context.world()));
    }
    error = rank() == 0 ? attempt([&] { data::seal::write(temp_path, sum, bytes); }) : "";
    return agree(context, error, "sealing " + temp_path);
  }

  // Makes the sealed file durable; the test hook fails here.
  std::string attempt_sync() {
    return attempt([&] {
      if (rank() == 0) fsync_path(temp_path, /*directory=*/false);
      if (options.inject_failure_at_commit &&
          (options.inject_failure_rank < 0 || options.inject_failure_rank == rank()))
        throw std::runtime_error(
            "injected commit failure (SnapshotWriterOptions::inject_failure_at_commit)");
    });
  }
};

SnapshotWriter::SnapshotWriter(distributed::ProcessContext& context, const std::string& final_path,
                               const SnapshotMeta& meta, const SnapshotWriterOptions& options)
    : impl_(std::make_unique<Impl>(context, final_path)) {
  Impl& w = *impl_;
  w.final_path = final_path;
  w.temp_path = final_path + ".tmp";
  w.options = options;
#ifdef H5_HAVE_PARALLEL
  w.parallel = options.parallel;
#endif
  // Rank 0's meta is the one written; world size and version are the writer's own.
  w.meta = meta;
  {
    distributed::Watchdog::Scope watch(context.watchdog(), "snapshot: broadcasting the meta");
    long long step = meta.step;
    MPI_CHECK(MPI_Bcast(&step, 1, MPI_LONG_LONG, 0, context.world()));
    w.meta.step = step;
    for (std::string* text : {&w.meta.model, &w.meta.config_toml, &w.meta.dataset_fingerprint,
                              &w.meta.tessera_version})
      broadcast_string(context, *text, 0);
  }
  w.meta.world_size = context.size();
  if (w.meta.tessera_version.empty()) w.meta.tessera_version = TESSERA_VERSION;
  if (w.meta.step < 0) {
    w.state = Impl::State::Failed;  // nothing was created
    throw std::invalid_argument(final_path + ": snapshot step " + std::to_string(w.meta.step) +
                                " < 0");
  }

  std::string error;
  if (w.rank() == 0)
    error = attempt([&] {
      const fs::path parent = fs::path(final_path).parent_path();
      if (!parent.empty()) fs::create_directories(parent);
    });
  Failure failure = agree(context, error, "creating the snapshot folder");
  if (failure.failed()) w.fail(failure, "creating the folder");
  error = attempt([&] {
#ifdef H5_HAVE_PARALLEL
    if (w.parallel) w.file = h5::create_file_mpio(w.temp_path, context.world());
#endif
    if (!w.parallel && w.rank() == 0) w.file = h5::create_file(w.temp_path);
    if (w.writes_metadata()) w.write_root_attributes();
  });
  failure = agree(context, error, "creating " + w.temp_path);
  if (failure.failed()) w.fail(failure, "creating " + w.temp_path);
}

SnapshotWriter::~SnapshotWriter() = default;

void SnapshotWriter::write_replicated(const std::string& name, const torch::Tensor& tensor) {
  impl_->write(name, tensor, /*sharded=*/false);
}

void SnapshotWriter::write_sharded(const std::string& name, const torch::Tensor& local_rows) {
  impl_->write(name, local_rows, /*sharded=*/true);
}

void SnapshotWriter::Impl::write(const std::string& name, const torch::Tensor& tensor,
                                 bool sharded) {
  const char* method = sharded ? "write_sharded" : "write_replicated";
  check_open(method);
  const std::string call = std::string(method) + "(\"" + name + "\")";
  auto invalid = [&](const std::string& why) {
    throw std::invalid_argument(final_path + ": " + call + ": " + why);
  };

  // 1. Check the arguments locally and agree on them.
  std::string path;
  torch::Tensor data;  // contiguous CPU bytes as stored (bool as uint8)
  h5::Type type = h5::Type::U8;
  const std::string local_error = [&]() -> std::string {
    try {
      path = layout::checked_name(name);
      if (!tensor.defined()) return "the tensor is undefined";
      const auto stored = layout::stored_type(tensor.scalar_type());
      if (!stored)
        return "dtype " + layout::dtype_name(tensor.scalar_type()) +
               " is not supported (float32, float64, int64, int32, uint8, bool)";
      type = *stored;
      if (sharded && tensor.dim() == 0) return "a sharded tensor needs a row dimension";
      if (tensor.dim() > kMaxDims)
        return "tensors have at most " + std::to_string(kMaxDims) + " dimensions";
      data = tensor.to(torch::kCPU);
      if (data.scalar_type() == torch::kBool) data = data.to(torch::kUInt8);
      data = data.contiguous();
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }();
  Failure failure = agree(context, local_error, call);
  if (failure.failed())
    invalid(failure.message + (size() > 1 ? " (rank " + std::to_string(failure.rank) + ")" : ""));

  // 2. Every rank's name, dtype and shape; they must match (rows may differ when sharded).
  constexpr int kFields = 3 + kMaxDims;  // name fingerprint, dtype, ndim, dims
  std::vector<int64_t> all(static_cast<size_t>(kFields) * size(), 0);
  {
    int64_t* mine = all.data() + static_cast<size_t>(kFields) * rank();
    mine[0] = static_cast<int64_t>(checksum(path.data(), path.size()));
    mine[1] = static_cast<int64_t>(tensor.scalar_type());
    mine[2] = data.dim();
    for (int64_t d = 0; d < data.dim(); ++d) mine[3 + d] = data.size(d);
    distributed::Watchdog::Scope watch(context.watchdog(), "snapshot: allgather of " + call);
    MPI_CHECK(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all.data(), kFields, MPI_INT64_T,
                            context.world()));
  }
  const int64_t* first = all.data();
  for (int r = 1; r < size(); ++r) {
    const int64_t* other = all.data() + static_cast<size_t>(kFields) * r;
    const std::string rank_text = "rank " + std::to_string(r);
    if (other[0] != first[0]) invalid(rank_text + " wrote another name at the same time");
    if (other[1] != first[1])
      invalid(rank_text + " passed " +
              layout::dtype_name(static_cast<torch::ScalarType>(other[1])) + ", rank 0 " +
              layout::dtype_name(static_cast<torch::ScalarType>(first[1])));
    const int skip = sharded ? 1 : 0;  // rows may differ between ranks
    bool same = other[2] == first[2];
    for (int64_t d = skip; same && d < first[2]; ++d) same = other[3 + d] == first[3 + d];
    if (!same)
      invalid(rank_text + " passed shape " + shape_text(other + 3, other[2]) + ", rank 0 " +
              shape_text(first + 3, first[2]) +
              (sharded ? " (only the first dimension may differ)" : " (replicated: all equal)"));
  }
  if (datasets.count(path)) invalid("\"" + path + "\" was already written");
  if (groups.count(path)) invalid("\"" + path + "\" is already a group of other datasets");
  for (const std::string& existing : datasets)
    if (path.compare(0, existing.size() + 1, existing + "/") == 0)
      invalid("\"" + existing + "\" is a dataset, it cannot hold \"" + path + "\"");

  // 3. Global shape, this rank's rows and the checksum (partial sums over byte ranges).
  std::vector<hsize_t> dims(static_cast<size_t>(first[2]));
  for (size_t d = 0; d < dims.size(); ++d) dims[d] = static_cast<hsize_t>(first[3 + d]);
  const int64_t element_bytes = static_cast<int64_t>(data.element_size());
  int64_t row_bytes = element_bytes, row_start = 0, global_rows = 0;
  std::vector<int64_t> rows(static_cast<size_t>(size()), 0);
  if (sharded) {
    for (size_t d = 1; d < dims.size(); ++d) row_bytes *= static_cast<int64_t>(dims[d]);
    for (int r = 0; r < size(); ++r) {
      rows[r] = all[static_cast<size_t>(kFields) * r + 3];
      if (r < rank()) row_start += rows[r];
      global_rows += rows[r];
    }
    dims[0] = static_cast<hsize_t>(global_rows);
  }
  int64_t total_bytes = element_bytes;
  for (const hsize_t n : dims) total_bytes *= static_cast<int64_t>(n);
  const bool contributes = sharded || rank() == 0;
  const int64_t local_bytes = contributes ? static_cast<int64_t>(data.nbytes()) : 0;
  uint64_t sum = contributes ? checksum_partial(data.data_ptr(), data.nbytes(),
                                                         static_cast<uint64_t>(row_start * row_bytes))
                             : 0;
  {
    distributed::Watchdog::Scope watch(context.watchdog(), "snapshot: checksum of " + call);
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, context.world()));
  }
  const uint64_t checksum = checksum_finish(sum, static_cast<uint64_t>(total_bytes));

  // 4. Gather to rank 0 when not writing in parallel.
  torch::Tensor gathered;
  if (sharded && !parallel && total_bytes > 0) {
    distributed::Watchdog::Scope watch(context.watchdog(), "snapshot: gathering " + call);
    MPI_Datatype row_type;
    MPI_CHECK(MPI_Type_contiguous(static_cast<int>(row_bytes), MPI_BYTE, &row_type));
    MPI_CHECK(MPI_Type_commit(&row_type));
    std::vector<int> counts(static_cast<size_t>(size())), displs(static_cast<size_t>(size()));
    for (int r = 0; r < size(); ++r) {
      counts[r] = static_cast<int>(rows[r]);
      displs[r] = r == 0 ? 0 : displs[r - 1] + counts[r - 1];
    }
    if (rank() == 0) {
      std::vector<int64_t> shape(dims.begin(), dims.end());
      gathered = torch::empty(shape, data.options());
    }
    const int rc = MPI_Gatherv(data.data_ptr(), counts[rank()], row_type,
                               rank() == 0 ? gathered.data_ptr() : nullptr, counts.data(),
                               displs.data(), row_type, 0, context.world());
    MPI_Type_free(&row_type);
    MPI_CHECK(rc);
  }

  // 5. Create the dataset and write it; then agree on the outcome.
  std::string io_error = attempt([&] {
    if (!writes_metadata()) return;
    h5::Id dataset = create_dataset(path, type, dims);
    if (total_bytes > 0) {
      if (!parallel) {
        h5::write(dataset.get(), type, (sharded ? gathered : data).data_ptr());
      } else if (!sharded) {
        if (rank() == 0) h5::write(dataset.get(), type, data.data_ptr());  // independent I/O
      } else {
#ifdef H5_HAVE_PARALLEL
        std::vector<hsize_t> start(dims.size(), 0), count = dims;
        start[0] = static_cast<hsize_t>(row_start);
        count[0] = static_cast<hsize_t>(rows[rank()]);
        h5::Id transfer(H5_CHECK(H5Pcreate(H5P_DATASET_XFER)), H5Pclose);
        H5_CHECK(H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_COLLECTIVE));
        h5::write_block(dataset.get(), type, start, count, data.data_ptr(), transfer.get());
#endif
      }
    }
    h5::write_uint64_attribute(dataset.get(), layout::kChecksumAttr, checksum);
    h5::write_string_attribute(dataset.get(), layout::kDtypeAttr,
                               layout::dtype_name(tensor.scalar_type()));
    dataset.close();
  });
  if (!io_error.empty()) io_error = with_space_diagnosis(io_error, temp_path, local_bytes);
  contributed += local_bytes;
  const bool inject_here =
      options.inject_failure_rank < 0 || options.inject_failure_rank == rank();
  if (io_error.empty() && inject_here && options.inject_failure_after_bytes >= 0 &&
      local_bytes > 0 && contributed > options.inject_failure_after_bytes)
    io_error = "injected write failure after " + std::to_string(contributed) +
               " bytes (SnapshotWriterOptions::inject_failure_after_bytes = " +
               std::to_string(options.inject_failure_after_bytes) + ")";
  failure = agree(context, io_error, call);
  if (failure.failed()) fail(failure, "writing \"" + path + "\"");
  datasets.insert(path);
  bytes_written += total_bytes;
}

void SnapshotWriter::commit() {
  Impl& w = *impl_;
  w.check_open("commit");
  // Complete the file: the dataset count, a flush, close (collective in parallel mode), the seal
  // (docs/formats.md, "The seal"), fsync.
  std::string error = w.attempt_commit_close();
  if (!error.empty()) error = with_space_diagnosis(error, w.temp_path, 0);
  Failure failure = agree(w.context, error, "closing " + w.temp_path);
  if (failure.failed()) w.fail(failure, "completing the file");
  if (w.parallel) {
    failure = w.seal_in_parallel();
    if (failure.failed()) w.fail(failure, "sealing the file");
  }
  failure = agree(w.context, w.attempt_sync(), "syncing " + w.temp_path);
  if (failure.failed()) w.fail(failure, "completing the file");
  // Rank 0 moves it into place; the folder is synced so that the new name survives a crash.
  error.clear();
  if (w.rank() == 0) error = attempt([&] { fs::rename(w.temp_path, w.final_path); });
  failure = agree(w.context, error, "renaming " + w.temp_path);
  if (failure.failed()) w.fail(failure, "renaming it to " + w.final_path);
  w.state = Impl::State::Committed;
  if (w.rank() == 0) {
    // Best effort: the new file is complete and in place; this makes its name durable too.
    const fs::path parent = fs::path(w.final_path).parent_path();
    attempt([&] { fsync_path(parent.empty() ? "." : parent.string(), /*directory=*/true); });
  }
}

const SnapshotMeta& SnapshotWriter::meta() const { return impl_->meta; }

const std::string& SnapshotWriter::final_path() const { return impl_->final_path; }
const std::string& SnapshotWriter::temp_path() const { return impl_->temp_path; }
bool SnapshotWriter::parallel() const { return impl_->parallel; }
int64_t SnapshotWriter::bytes_written() const { return impl_->bytes_written; }

}  // namespace tessera
