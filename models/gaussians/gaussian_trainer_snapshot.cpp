// GaussianTrainer snapshots (tessera-snapshot v2, docs/formats.md "Gaussian runs"): every rank's
// rows with their Adam moments and densify statistics, for exact resume and `tessera export`.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "framework/snapshot.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {
namespace {

constexpr size_t kFields = 6;

// Per-Gaussian state besides the parameters and their moments (docs/formats.md).
constexpr const char* kIds = "state/gaussian_ids";                   // [N] int64
constexpr const char* kRankRows = "state/rank_rows";                 // [W] int64
constexpr const char* kNextId = "state/next_id";                     // int64
constexpr const char* kGradNormSum = "state/densify/grad_norm_sum";  // [N] float32
constexpr const char* kVisibleCount = "state/densify/count";         // [N] int32
constexpr const char* kMaxRadii = "state/densify/max_radii";         // [N] int32

torch::optim::AdamParamState* adam_state(torch::optim::Adam& optimizer, const torch::Tensor& p) {
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<torch::optim::AdamParamState*>(it->second.get());
}

// The names of the per-Gaussian datasets in the row order of install_rows: the six fields, the
// exp_avg and exp_avg_sq of each, then the three densify statistics.
std::vector<std::string> row_datasets() {
  std::vector<std::string> names;
  for (const char* g : kGroupNames) names.push_back(snapshot_param(g));
  for (const char* g : kGroupNames) {
    names.push_back(snapshot_optimizer(g, "exp_avg"));
    names.push_back(snapshot_optimizer(g, "exp_avg_sq"));
  }
  names.push_back(kGradNormSum);
  names.push_back(kVisibleCount);
  names.push_back(kMaxRadii);
  return names;
}

// Refuses (UserError) a snapshot that is not of a Gaussian run or lacks a dataset or has rows
// that do not line up; returns the Gaussian count N.
int64_t check_layout(const SnapshotReader& reader) {
  const std::string& path = reader.path();
  const SnapshotMeta& meta = reader.meta();
  if (meta.model != GaussianTrainer::kSnapshotModel)
    throw UserError(path + ": a snapshot of model '" + meta.model + "', not of a Gaussian run "
                    "(model.name = \"gaussians\")");
  auto need = [&](const std::string& name) {
    if (!reader.has(name))
      throw UserError(path + ": has no dataset \"" + name + "\" (the file is damaged or was not "
                      "written by a Gaussian run)");
    return reader.shape(name);
  };
  const std::vector<int64_t> id_shape = need(kIds);
  if (id_shape.size() != 1)
    throw UserError(path + ": dataset \"" + std::string(kIds) + "\" is not one-dimensional");
  const int64_t n = id_shape[0];
  std::vector<std::string> names = row_datasets();
  for (size_t i = 0; i < names.size(); ++i) {
    const std::vector<int64_t> shape = need(names[i]);
    std::vector<int64_t> want{n};
    if (i < 3 * kFields) {
      const auto& rest = kGroupRowShapes[i < kFields ? i : (i - kFields) / 2];
      want.insert(want.end(), rest.begin(), rest.end());
    }
    if (shape != want)
      throw UserError(path + ": dataset \"" + names[i] + "\" has shape " +
                      c10::str(c10::IntArrayRef(shape)) + ", expected " +
                      c10::str(c10::IntArrayRef(want)) + " (the file is damaged)");
  }
  need(kNextId);
  const std::vector<int64_t> ranks = need(kRankRows);
  if (ranks.size() != 1)
    throw UserError(path + ": dataset \"" + std::string(kRankRows) + "\" is not one-dimensional");
  return n;
}

// Rows [start, start + count) of a dataset (an empty tensor of the right shape for count 0).
torch::Tensor read_slice(const SnapshotReader& reader, const std::string& name, int64_t start,
                         int64_t count) {
  if (count > 0) return reader.read_rows(name, start, count);
  std::vector<int64_t> shape = reader.shape(name);
  shape[0] = 0;
  return torch::empty(shape, torch::TensorOptions().dtype(reader.dtype(name)));
}


}  // namespace

void GaussianTrainer::save_state(SnapshotWriter& writer) {
  torch::NoGradGuard no_grad;
  // Every rank's row count, so that a resume at this world size hands each rank its own rows.
  const torch::Tensor rank_rows =
      comm_.allgather(torch::tensor({params_.size()}, torch::kInt64).to(comm_.device()))
          .cpu()
          .reshape({-1});
  const auto fields = params_.fields();
  for (size_t i = 0; i < kFields; ++i)
    writer.write_sharded(snapshot_param(kGroupNames[i]), fields[i]->detach());
  for (size_t i = 0; i < kFields; ++i) {
    const torch::Tensor p = fields[i]->detach();
    const torch::optim::AdamParamState* s = adam_state(*optimizer_, *fields[i]);
    const bool has = s != nullptr && s->exp_avg().defined();
    writer.write_sharded(snapshot_optimizer(kGroupNames[i], "exp_avg"),
                         has ? s->exp_avg() : torch::zeros_like(p));
    writer.write_sharded(snapshot_optimizer(kGroupNames[i], "exp_avg_sq"),
                         has ? s->exp_avg_sq() : torch::zeros_like(p));
    // The same for every row and rank: the trainer's update count (0 before the first update).
    writer.write_replicated(snapshot_optimizer(kGroupNames[i], "step"),
                            torch::tensor(has ? adam_steps_ : int64_t{0}, torch::kInt64));
  }
  writer.write_sharded(kIds, ids_);
  writer.write_sharded(kGradNormSum, stats_.grad_norm_sum);
  writer.write_sharded(kVisibleCount, stats_.count);
  writer.write_sharded(kMaxRadii, stats_.max_radii);
  writer.write_replicated(kRankRows, rank_rows);
  writer.write_replicated(kNextId, torch::tensor(next_id_, torch::kInt64));
  // Pure functions of the step, stored for `tessera info`: the next step's learning rates (with
  // the batch scaling) and SH degree.
  const double scale =
      options_.sqrt_batch_lr_scaling ? std::sqrt(static_cast<double>(options_.views_per_step)) : 1;
  const auto lrs = group_learning_rates(options_.rates, extent_, steps_done_ + 1);
  std::vector<double> lr(lrs.begin(), lrs.end());
  for (double& v : lr) v *= scale;
  writer.write_replicated(snapshot_state("lr"), torch::tensor(lr, torch::kFloat64));
  writer.write_replicated(snapshot_state("sh_degree"),
                          torch::tensor(static_cast<int64_t>(sh_degree_at(steps_done_)),
                                        torch::kInt64));
}

void GaussianTrainer::load_state(const SnapshotReader& reader) {
  torch::NoGradGuard no_grad;
  const torch::Device device = params_.means.device();
  const std::string& path = reader.path();
  std::string error;
  std::vector<torch::Tensor> rows;
  torch::Tensor ids;
  int64_t step = 0, updates = 0, next_id = 0;
  bool own_rows = false;
  try {
    const SnapshotMeta& meta = reader.meta();
    const int64_t n = check_layout(reader);
    // Rows are read by hyperslab without their checksums (read_rows reads a part), so rank 0
    // verifies the whole file first.
    if (comm_.rank() == 0) {
      const std::string problem = reader.verify();
      if (!problem.empty())
        throw UserError("damaged snapshot: " + problem + " (use an older snapshot)");
    }
    const torch::Tensor rank_rows = reader.read(kRankRows);
    const int64_t world = comm_.size(), rank = comm_.rank();
    if (rank_rows.sum().item<int64_t>() != n)
      throw UserError(path + ": its per-rank row counts do not add up to its " +
                      std::to_string(n) + " Gaussians (the file is damaged)");
    own_rows = rank_rows.size(0) == world;
    int64_t start = n * rank / world, count = n * (rank + 1) / world - start;
    if (own_rows) {
      start = rank_rows.slice(0, 0, rank).sum().item<int64_t>();
      count = rank_rows[rank].item<int64_t>();
    }
    for (const std::string& name : row_datasets())
      rows.push_back(read_slice(reader, name, start, count).to(device));
    ids = read_slice(reader, kIds, start, count).to(device);
    step = meta.step;
    updates = reader.read(snapshot_optimizer(kGroupNames[0], "step")).item<int64_t>();
    next_id = reader.read(kNextId).item<int64_t>();
  } catch (const UserError& e) {
    error = e.what();
  }
  // Every rank learns the outcome, so none goes on into a collective alone.
  error = agreed_error(comm_, error);
  if (!error.empty()) throw UserError(error);

  steps_done_ = step;
  adam_steps_ = updates;  // before install_rows: the Adam state's step count
  next_id_ = next_id;
  ids_ = ids;
  install_rows(rows, /*with_state=*/updates > 0);
  stats_.grad_norm_sum = rows[3 * kFields].contiguous();
  stats_.count = rows[3 * kFields + 1].contiguous();
  stats_.max_radii = rows[3 * kFields + 2].contiguous();
  // Another world size: an even slice each, then Morton ownership (with the Adam state).
  if (!own_rows) rebalance(true);
}

GaussianParams read_snapshot_params(const std::string& path, int64_t* step) {
  torch::NoGradGuard no_grad;
  const SnapshotReader reader(path);
  const int64_t n = check_layout(reader);
  const torch::Tensor ids = reader.read(kIds);  // read() verifies each checksum
  const auto [sorted, order] = ids.sort();
  if (n > 1 && (sorted.slice(0, 1) == sorted.slice(0, 0, n - 1)).any().item<bool>())
    throw UserError(path + ": a Gaussian id appears twice (the file is damaged)");
  std::array<torch::Tensor, kFields> f;
  for (size_t i = 0; i < kFields; ++i)
    f[i] = reader.read(snapshot_param(kGroupNames[i])).index_select(0, order);
  if (step != nullptr) *step = reader.meta().step;
  return make_params(f[0], f[1], f[2], f[3], f[4], f[5]);
}

}  // namespace tessera::models::gaussians
