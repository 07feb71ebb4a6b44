// The ray family's snapshot state: parameters, Adam moments and model state such as the
// occupancy grid (tessera-snapshot v2, docs/formats.md); the TrainingRun writes the rest.
#include "distributed/errors.h"
#include "framework/adam_state.h"
#include "framework/snapshot.h"
#include "models/nerf/ray_trainer.h"

namespace tessera::models::nerf {

namespace {

// Snapshot names of the parameters: "<group>.<index in group>", in parameter_groups() order,
// which every rank and every world size share (parameters are replicated).
NamedParams named_params(Model& model) {
  NamedParams out;
  for (const ParamGroup& g : model.parameter_groups())
    for (size_t i = 0; i < g.params.size(); ++i)
      out.emplace_back(g.name + "." + std::to_string(i), g.params[i]);
  return out;
}

}  // namespace

void RayTrainer::save_state(SnapshotWriter& writer) {
  write_adam_params(writer, named_params(model_), optimizer());
  for (const auto& [name, t] : model_.state_tensors())
    writer.write_replicated(snapshot_state("model/" + name), t);
  // The schedules are pure functions of the step; their values at the next step are stored
  // for `tessera info`.
  const int64_t next = writer.meta().step;
  writer.write_replicated(snapshot_state("lr"), torch::tensor(lr_.at(next), torch::kFloat64));
  writer.write_replicated(snapshot_state("sampling_rate"),
                          torch::tensor(sampling_.at(next), torch::kFloat64));
}

void RayTrainer::load_state(const SnapshotReader& reader) {
  const std::string& path = reader.path();
  torch::NoGradGuard no_grad;
  read_adam_params(reader, named_params(model_), optimizer(), "the model's config section");
  for (auto& [name, t] : model_.state_tensors()) {
    const std::string key = snapshot_state("model/" + name);
    if (!reader.has(key)) throw UserError(path + ": model state '" + name + "' is missing");
    t.copy_(reader.read(key));
  }
}

}  // namespace tessera::models::nerf
