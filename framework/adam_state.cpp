// Replicated parameters and Adam state in snapshots (framework/adam_state.h).
#include "framework/adam_state.h"

#include "distributed/errors.h"

namespace tessera {

namespace {

torch::optim::AdamParamState* adam_state(torch::optim::Adam& adam, const torch::Tensor& p) {
  auto& state = adam.state();
  const auto it = state.find(p.unsafeGetTensorImpl());
  if (it == state.end()) return nullptr;
  return static_cast<torch::optim::AdamParamState*>(it->second.get());
}

}  // namespace

void write_adam_params(SnapshotWriter& writer, const NamedParams& params, torch::optim::Adam& adam) {
  for (const auto& [name, p] : params) {
    writer.write_replicated(snapshot_param(name), p.detach());
    const auto* st = adam_state(adam, p);
    const torch::Tensor zeros = st ? torch::Tensor() : torch::zeros_like(p.detach());
    writer.write_replicated(snapshot_optimizer(name, "exp_avg"), st ? st->exp_avg() : zeros);
    writer.write_replicated(snapshot_optimizer(name, "exp_avg_sq"), st ? st->exp_avg_sq() : zeros);
    writer.write_replicated(snapshot_optimizer(name, "step"),
                            torch::tensor(st ? st->step() : int64_t{0}, torch::kInt64));
  }
}

void read_adam_params(const SnapshotReader& reader, const NamedParams& params,
                      torch::optim::Adam& adam, const std::string& settings) {
  const std::string& path = reader.path();
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    const std::string key = snapshot_param(name);
    if (!reader.has(key))
      throw UserError(path + ": parameter '" + name + "' is missing; the snapshot was written by "
                      "a model of another shape (check " + settings + ")");
    const torch::Tensor value = reader.read(key);
    if (value.sizes() != p.sizes() || value.scalar_type() != p.scalar_type())
      throw UserError(path + ": parameter '" + name + "' has shape " +
                      c10::str(value.sizes()) + " in the snapshot but " + c10::str(p.sizes()) +
                      " in this model (check " + settings + ")");
    p.copy_(value);
    const int64_t step = reader.read(snapshot_optimizer(name, "step")).item<int64_t>();
    auto& state = adam.state();
    state.erase(p.unsafeGetTensorImpl());
    if (step > 0) {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(step);
      st->exp_avg(reader.read(snapshot_optimizer(name, "exp_avg")).to(p.device()));
      st->exp_avg_sq(reader.read(snapshot_optimizer(name, "exp_avg_sq")).to(p.device()));
      state[p.unsafeGetTensorImpl()] = std::move(st);
    }
  }
}

MemoryParts adam_memory_parts(torch::optim::Adam& adam) {
  std::vector<torch::Tensor> params, grads, moments;
  for (const auto& group : adam.param_groups())
    for (const auto& p : group.params()) {
      params.push_back(p);
      // The step's gradient, as large as its parameter, whether or not it is kept between steps
      // (zero_grad frees it): it is part of every step's peak.
      if (p.requires_grad()) grads.push_back(p);
      if (const auto* st = adam_state(adam, p)) {
        moments.push_back(st->exp_avg());
        moments.push_back(st->exp_avg_sq());
        moments.push_back(st->max_exp_avg_sq());
      } else if (p.requires_grad()) {  // before the first step: the two its step allocates
        moments.push_back(p);
        moments.push_back(p);
      }
    }
  return {{"parameters", tensor_bytes(params)},
          {"gradients", tensor_bytes(grads)},
          {"optimizer (Adam)", tensor_bytes(moments)}};
}

}  // namespace tessera
