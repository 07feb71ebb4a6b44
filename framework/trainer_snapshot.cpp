// The ray family's snapshot state: parameters, Adam moments and model state such as the
// occupancy grid (tessera-snapshot v1, docs/formats.md); the TrainingRun writes the rest.
#include "distributed/errors.h"
#include "framework/snapshot.h"
#include "framework/trainer.h"

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

void Trainer::save_state(SnapshotWriter& writer) {
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
  // The schedules are pure functions of the step; their values at the next step are stored
  // for `tessera info`.
  const int64_t next = writer.meta().step;
  writer.write_replicated(snapshot_state("lr"), torch::tensor(lr_.at(next), torch::kFloat64));
  writer.write_replicated(snapshot_state("sampling_rate"),
                          torch::tensor(sampling_.at(next), torch::kFloat64));
}

void Trainer::load_state(const SnapshotReader& reader) {
  const std::string& path = reader.path();
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
}

}  // namespace tessera
