// Snapshots (tessera-snapshot v2, docs/formats.md): the collective, atomic SnapshotWriter, the
// SnapshotReader, validation by checksum, finding the newest good snapshot, and rotation.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera {

namespace distributed {
class ProcessContext;
}

constexpr const char* kSnapshotFormat = "tessera-snapshot";
// 2: sealed (framework/data/file_seal.h); version 1 files had no seal and are refused by it.
constexpr int kSnapshotVersion = 2;

// The root attributes of a snapshot besides format and version.
struct SnapshotMeta {
  int64_t step = 0;                 // optimizer steps taken when the snapshot was written
  std::string model;                // the model's name (model.name)
  std::string config_toml;          // the full resolved config
  std::string dataset_fingerprint;  // identifies the dataset the run trained on
  std::string tessera_version;      // the writer fills in this build's version when empty
  int world_size = 0;               // the writer records the context's world size
};

// `dir`/step-NNNNNNNN.h5, the step zero-padded to 8 digits (more digits past 99,999,999).
std::string snapshot_path(const std::string& dir, int64_t step);
// The step of a file named step-<digits>.h5 (any folder); nullopt for any other name.
std::optional<int64_t> snapshot_step(const std::string& path);

// Helpers for the standard groups: "params/<name>", "optimizer/<param>/<field>", "state/<name>".
std::string snapshot_param(const std::string& name);
std::string snapshot_optimizer(const std::string& param, const std::string& field);
std::string snapshot_state(const std::string& name);

// A write or commit that failed (full disk, I/O error, injected failure). The message names the
// snapshot path and the cause. Thrown on every rank; the previous snapshot is untouched.
class SnapshotWriteError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SnapshotWriterOptions {
  // Every rank writes its own rows collectively with parallel HDF5 (MPI-IO). When false, or when
  // HDF5 lacks MPI support, rank 0 gathers each dataset and writes it alone.
  bool parallel = true;
  // Testing hooks. A write on `inject_failure_rank` (-1: every rank) fails, as an I/O error
  // would, once the bytes that rank has contributed exceed `inject_failure_after_bytes`
  // (-1: never; 0: the first non-empty dataset). `inject_failure_at_commit` fails the commit on
  // that rank instead, after the file is complete but before the rename.
  int64_t inject_failure_after_bytes = -1;
  int inject_failure_rank = -1;
  bool inject_failure_at_commit = false;
};

// Writes one snapshot collectively: every rank constructs it and calls every method in the same
// order with the same names. Data goes to `final_path` + ".tmp" in the same folder; commit()
// flushes, closes and fsyncs it, renames it onto `final_path` (rank 0) and fsyncs the folder.
// Every failure is agreed across ranks (no rank hangs or carries on alone): all ranks throw, the
// temporary file is removed and an existing file at `final_path` is never touched. Destroying a
// writer that was not committed also removes the temporary file (collective in parallel mode).
class SnapshotWriter {
 public:
  SnapshotWriter(distributed::ProcessContext& context, const std::string& final_path,
                 const SnapshotMeta& meta, const SnapshotWriterOptions& options = {});
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  // `name` is a path below the root ("params/mlp/0.weight"); '/' nests groups, which are
  // created as needed. Supported dtypes: float32, float64, int64, int32, uint8, bool. Tensors
  // may live on any device. Bad arguments (a name written twice, a dtype or shape that differs
  // between ranks) throw std::invalid_argument on every rank and leave the writer usable.
  //
  // The same tensor on every rank; rank 0's values are written.
  void write_replicated(const std::string& name, const torch::Tensor& tensor);  // [*]
  // Each rank holds rows [n_r, *rest] (n_r may be 0); the dataset is their concatenation in
  // rank order, [sum n_r, *rest].
  void write_sharded(const std::string& name, const torch::Tensor& local_rows);  // [n_r, *]
  void commit();

  const SnapshotMeta& meta() const;  // as written (world size and version filled in)
  const std::string& final_path() const;
  const std::string& temp_path() const;
  bool parallel() const;         // whether parallel HDF5 is in use
  int64_t bytes_written() const;  // dataset bytes in the file so far (all ranks together)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Reads a snapshot with HDF5's serial driver; each rank may open it on its own. Not thread-safe.
class SnapshotReader {
 public:
  // Throws UserError when the file is missing, not HDF5, not a tessera-snapshot, of another
  // version, or lacks a required root attribute.
  explicit SnapshotReader(const std::string& path);
  ~SnapshotReader();
  SnapshotReader(SnapshotReader&&) noexcept;
  SnapshotReader& operator=(SnapshotReader&&) noexcept;

  const std::string& path() const;
  const SnapshotMeta& meta() const;
  // The datasets below `group` ("" for all, "params", "optimizer/mlp.weight"), as paths relative
  // to it, sorted. Empty when the group does not exist.
  std::vector<std::string> names(const std::string& group = "") const;
  bool has(const std::string& name) const;  // a dataset named `name`
  // Each throws UserError naming the snapshot when `name` is not a dataset.
  std::vector<int64_t> shape(const std::string& name) const;
  torch::ScalarType dtype(const std::string& name) const;
  uint64_t stored_checksum(const std::string& name) const;
  // The whole dataset on the CPU, bit for bit as written; its checksum is verified (UserError
  // on a mismatch).
  torch::Tensor read(const std::string& name) const;
  // Rows [start, start + count) of a dataset with at least one dimension, for re-sharding.
  torch::Tensor read_rows(const std::string& name, int64_t start, int64_t count) const;
  // Verifies every dataset's checksum and the dataset count; "" when all is well, else what is
  // wrong.
  std::string verify() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "" when `path` is a complete, undamaged snapshot (format, version, root attributes, every
// dataset's checksum); otherwise what is wrong with it.
std::string validate_snapshot(const std::string& path);

// The path of the newest step-*.h5 in `dir` (by step number) that validates. `warn` receives one
// message for each newer one skipped as damaged. nullopt when there is none (or no `dir`).
// Temporary *.tmp files are ignored.
std::optional<std::string> find_latest_snapshot(
    const std::string& dir, const std::function<void(const std::string&)>& warn = {});

// Deletes the oldest step-*.h5 in `dir` beyond the newest `keep` (keep = 0 keeps all; the newest
// is never deleted) and every step-*.h5.tmp left by a writer that died. Returns what it deleted.
// Call it on one rank, when no writer is running in `dir`.
std::vector<std::string> rotate_snapshots(const std::string& dir, int keep);

}  // namespace tessera
