// Trainer snapshots: the training state (parameters, Adam moments, model state such as the
// occupancy grid, loss scaler) to and from tessera-snapshot v1 files, for exact resume.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "framework/snapshot.h"
#include "framework/trainer.h"
#include "framework/trainer_run.h"

namespace tessera {

namespace {

// Snapshot names of the parameters: "<group>.<index in group>", in parameter_groups() order,
// which every rank and every world size share (parameters are replicated).
std::vector<std::pair<std::string, torch::Tensor>> named_params(Model& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const ParamGroup& g : model.parameter_groups())
    for (size_t i = 0; i < g.params.size(); ++i)
      out.emplace_back(g.name + "." + std::to_string(i), g.params[i]);
  return out;
}

torch::optim::AdamParamState* adam_state(torch::optim::Adam& adam, const torch::Tensor& p) {
  auto& state = adam.state();
  const auto it = state.find(p.unsafeGetTensorImpl());
  if (it == state.end()) return nullptr;
  return static_cast<torch::optim::AdamParamState*>(it->second.get());
}

}  // namespace

std::string Trainer::dataset_fingerprint(const data::SceneReader& scene) {
  std::ostringstream text;
  text.precision(17);
  const auto& m = scene.meta();
  for (double b : m.scene_bounds) text << b << ',';
  text << m.near << ',' << m.far << ';';
  for (const auto& c : scene.cameras()) {
    text << c.fx << ',' << c.fy << ',' << c.cx << ',' << c.cy << ',' << c.width << ','
         << c.height << ',' << static_cast<int>(c.split);
    for (double v : c.camera_to_world) text << ',' << v;
    text << ';';
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(distributed::fingerprint(text.str())));
  return hex;
}

std::string Trainer::save_snapshot() {
  if (options_.out_dir.empty())
    throw std::logic_error("Trainer::save_snapshot needs an out_dir");
  SnapshotMeta meta;
  meta.step = steps_done_;
  meta.model = model_.name();
  meta.config_toml = options_.config_toml;
  meta.dataset_fingerprint = dataset_fingerprint(scene_);
  SnapshotWriterOptions wo;
  wo.parallel = options_.snapshot_parallel;
  // Folder, rotation and timing are shared with the 3DGS run (trainer_run.h).
  return write_run_snapshot(comm_, options_.out_dir, steps_done_, options_.snapshot_keep,
                            [&](const std::string& path) {
    SnapshotWriter writer(context_, path, meta, wo);
    for (const auto& [name, p] : named_params(model_)) {
      writer.write_replicated(snapshot_param(name), p.detach());
      const auto* st = adam_state(*optimizer_, p);
      const torch::Tensor zeros = st ? torch::Tensor() : torch::zeros_like(p.detach());
      writer.write_replicated(snapshot_optimizer(name, "exp_avg"), st ? st->exp_avg() : zeros);
      writer.write_replicated(snapshot_optimizer(name, "exp_avg_sq"), st ? st->exp_avg_sq() : zeros);
      writer.write_replicated(snapshot_optimizer(name, "step"),
                              torch::tensor(st ? st->step() : int64_t{0}, torch::kInt64));
    }
    for (const auto& [name, t] : model_.state_tensors())
      writer.write_replicated(snapshot_state("model/" + name), t);
    writer.write_replicated(snapshot_state("loss_scaler"),
                            torch::tensor(scaler_->state(), torch::kFloat64));
    writer.write_replicated(snapshot_state("consecutive_skips"),
                            torch::tensor(consecutive_skips_, torch::kInt64));
    // The schedules are pure functions of the step; their values at the next step are stored
    // for `tessera info` and checked on resume.
    writer.write_replicated(snapshot_state("lr"), torch::tensor(lr_.at(steps_done_), torch::kFloat64));
    writer.write_replicated(snapshot_state("sampling_rate"),
                            torch::tensor(sampling_.at(steps_done_), torch::kFloat64));
    writer.commit();
  });
}

void Trainer::load_snapshot(const std::string& path) {
  const SnapshotReader reader(path);
  const SnapshotMeta& meta = reader.meta();
  check_snapshot_matches_run(path, meta, model_.name(), dataset_fingerprint(scene_), options_.steps);
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : named_params(model_)) {
    const std::string key = snapshot_param(name);
    if (!reader.has(key))
      throw UserError(path + ": parameter '" + name + "' is missing; the snapshot was written by "
                      "a model of another shape (check the [model] settings)");
    const torch::Tensor value = reader.read(key);
    if (value.sizes() != p.sizes() || value.scalar_type() != p.scalar_type())
      throw UserError(path + ": parameter '" + name + "' has shape " +
                      c10::str(value.sizes()) + " in the snapshot but " + c10::str(p.sizes()) +
                      " in this model (check the [model] settings)");
    p.copy_(value);
    const int64_t step = reader.read(snapshot_optimizer(name, "step")).item<int64_t>();
    auto& state = optimizer_->state();
    state.erase(p.unsafeGetTensorImpl());
    if (step > 0) {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(step);
      st->exp_avg(reader.read(snapshot_optimizer(name, "exp_avg")).to(p.device()));
      st->exp_avg_sq(reader.read(snapshot_optimizer(name, "exp_avg_sq")).to(p.device()));
      state[p.unsafeGetTensorImpl()] = std::move(st);
    }
  }
  for (auto& [name, t] : model_.state_tensors()) {
    const std::string key = snapshot_state("model/" + name);
    if (!reader.has(key)) throw UserError(path + ": model state '" + name + "' is missing");
    t.copy_(reader.read(key));
  }
  const torch::Tensor scaler = reader.read(snapshot_state("loss_scaler"));
  scaler_->load_state(std::vector<double>(scaler.data_ptr<double>(),
                                          scaler.data_ptr<double>() + scaler.numel()));
  consecutive_skips_ = reader.read(snapshot_state("consecutive_skips")).item<int64_t>();
  steps_done_ = meta.step;
  spdlog::info("resumed from {} at step {} (written by {} rank(s), now {})", path, meta.step,
               meta.world_size, comm_.size());
}

}  // namespace tessera
