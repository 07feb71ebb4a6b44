// `tessera bench snapshot`: write and read times and file size of a snapshot holding a sharded
// 3DGS state (the six groups of gaussian_params.h, 59 floats per Gaussian, plus two Adam moments),
// parallel HDF5 vs gathered, and the cost of checking its seal against a plain read of the file.
#include <CLI/CLI.hpp>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "distributed/process_context.h"
#include "framework/data/file_seal.h"
#include "framework/snapshot.h"
#include "framework/bench_util.h"
#include "models/gaussians/gaussian_family.h"
#include "models/gaussians/gaussian_params.h"

namespace tessera::models::gaussians {

namespace {

struct SnapshotBenchOptions {
  int64_t count = 1000000;  // Gaussians in the whole model
  std::string dir;          // where the files go ("" = a temp dir)
  int repeats = 3;
};

// Seconds to read `path` once, 4 MiB at a time, doing nothing with the bytes: the baseline of the
// seal check, which reads the same way and hashes.
double plain_read_seconds(const std::string& path) {
  const auto t0 = std::chrono::steady_clock::now();
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(size_t{4} << 20);
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename Step>
double seconds_of(Step&& step) {
  const auto t0 = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_snapshot_bench(const SnapshotBenchOptions& o) {
  distributed::ProcessContext context(nullptr, nullptr, 600.0);
  const int rank = context.rank(), size = context.size();
  const int64_t begin = o.count * rank / size, end = o.count * (rank + 1) / size, rows = end - begin;
  std::string dir = o.dir;
  if (dir.empty()) dir = (std::filesystem::temp_directory_path() / "tessera-bench-snapshot").string();
  if (rank == 0) std::filesystem::create_directories(dir);
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  // This rank's rows, distinct per row so that nothing compresses or repeats.
  std::vector<torch::Tensor> local;
  for (const std::vector<int64_t>& trailing : kGroupRowShapes) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), trailing.begin(), trailing.end());
    for (int copy = 0; copy < 3; ++copy)  // value, exp_avg, exp_avg_sq
      local.push_back(torch::rand(shape, torch::TensorOptions().dtype(torch::kFloat32)) + begin + copy);
  }
  for (bool parallel : {true, false}) {
    std::vector<double> writes, reads;
    int64_t bytes = 0;
    for (int rep = 0; rep < o.repeats; ++rep) {
      const std::string path = snapshot_path(dir, parallel ? 1 : 2);
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      auto t0 = std::chrono::steady_clock::now();
      {
        SnapshotMeta meta;
        meta.step = 1;
        meta.model = "bench-snapshot";  // a file only this bench reads
        SnapshotWriterOptions wo;
        wo.parallel = parallel;
        SnapshotWriter writer(context, path, meta, wo);
        size_t k = 0;
        for (const char* name : kGroupNames) {
          writer.write_sharded(snapshot_param(name), local[k++]);
          writer.write_sharded(snapshot_optimizer(name, "exp_avg"), local[k++]);
          writer.write_sharded(snapshot_optimizer(name, "exp_avg_sq"), local[k++]);
        }
        writer.commit();
      }
      writes.push_back(bench::max_over_ranks(MPI_COMM_WORLD,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
      bytes = static_cast<int64_t>(std::filesystem::file_size(path));
      // Each rank reads back its own rows (a resume at the same world size), checksums verified
      // by validate on rank 0 separately below.
      MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
      t0 = std::chrono::steady_clock::now();
      {
        const SnapshotReader reader(path);
        for (const char* name : kGroupNames) {
          reader.read_rows(snapshot_param(name), begin, rows);
          reader.read_rows(snapshot_optimizer(name, "exp_avg"), begin, rows);
          reader.read_rows(snapshot_optimizer(name, "exp_avg_sq"), begin, rows);
        }
      }
      reads.push_back(bench::max_over_ranks(MPI_COMM_WORLD,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    }
    double validate_s = 0, seal_s = 0, plain_s = 0;
    if (rank == 0) {
      const std::string path = snapshot_path(dir, parallel ? 1 : 2);
      std::string problem;
      validate_s = seconds_of([&] { problem = validate_snapshot(path); });
      if (!problem.empty()) throw std::runtime_error("bench snapshot: " + problem);
      // Both from the page cache (the file was just read): the checksum's cost over the I/O.
      std::vector<double> seals, plains;
      for (int rep = 0; rep < o.repeats; ++rep) {
        plains.push_back(plain_read_seconds(path));
        seals.push_back(seconds_of([&] { data::seal::verify(path); }));
      }
      std::sort(seals.begin(), seals.end());
      std::sort(plains.begin(), plains.end());
      seal_s = seals[seals.size() / 2];
      plain_s = plains[plains.size() / 2];
    }
    std::sort(writes.begin(), writes.end());
    std::sort(reads.begin(), reads.end());
    if (rank == 0)
      std::printf("{\"bench\":\"snapshot\",\"count\":%lld,\"ranks\":%d,\"mode\":\"%s\","
                  "\"bytes\":%lld,\"write_s\":%.4f,\"read_s\":%.4f,\"validate_s\":%.4f,"
                  "\"seal_s\":%.6g,\"plain_read_s\":%.6g,\"seal_vs_plain_read\":%.4g}\n",
                  static_cast<long long>(o.count), size, parallel ? "parallel" : "gathered",
                  static_cast<long long>(bytes), writes[writes.size() / 2], reads[reads.size() / 2],
                  validate_s, seal_s, plain_s, plain_s > 0 ? seal_s / plain_s : 0.0);
    std::fflush(stdout);
  }
  MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  if (rank == 0 && o.dir.empty()) std::filesystem::remove_all(dir);
  return kExitOk;
}

}  // namespace

bench::BenchCommand add_gaussian_snapshot_bench(CLI::App& bench) {
  auto o = std::make_shared<SnapshotBenchOptions>();
  CLI::App* sub = bench.add_subcommand(
      "snapshot", "Snapshot write/read time and size for a sharded 3DGS state (59 floats per "
                  "Gaussian plus two Adam moments), parallel HDF5 vs gathered to rank 0; run "
                  "under mpirun -np N. One JSON line per mode: bytes, write_s and read_s (medians, "
                  "slowest rank; both include the seal), validate_s (every checksum, rank 0), "
                  "seal_s (checking the file's seal, rank 0), plain_read_s (reading the file "
                  "without hashing, the baseline) and seal_vs_plain_read");
  sub->add_option("--count", o->count, "Gaussians in the whole model")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 34));
  sub->add_option("--dir", o->dir,
                  "Folder for the files (default: a temp folder, removed afterwards); must be "
                  "shared by all ranks")
      ->check(CLI::ExistingDirectory);
  sub->add_option("--repeats", o->repeats, "Timed writes and reads per mode (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  return {sub, [o] { return run_snapshot_bench(*o); }};
}

}  // namespace tessera::models::gaussians
