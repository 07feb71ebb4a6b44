// The `gaussians` model family (3DGS sharded across ranks, docs/gaussians.md) for the family
// registry: the GaussianTrainer behind the framework's TrainingRun, its options from the config, and
// what `tessera info` and `tessera export` do with its snapshots.
#pragma once

#include "framework/bench_util.h"
#include "framework/config.h"
#include "framework/family.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {

// The sharded trainer's options from the resolved config ([gaussians], [sampling] as views
// per epoch, [checkpoint] budget as the views-per-pass budget). UserError for a budget policy
// without a budget and for the segments policy.
GaussianTrainerOptions gaussian_trainer_options(const Config& config);

// The family: GaussianTrainer's step halves, eval, renders and snapshot state as the TrainingRun's hooks;
// gaussians.ply in the run directory when a run finishes.
class GaussianFamily : public ModelFamily, public ViewRenderer {
 public:
  explicit GaussianFamily(const FamilyContext& context);
  // The same with options set in code (tests, `bench gaussians`); every rank passes the same.
  GaussianFamily(distributed::Communicator& comm, const data::SceneReader& scene,
                 const GaussianTrainerOptions& options);

  std::string model_name() const override;
  std::string work_unit() const override { return "views"; }
  void on_start(int64_t first_step) override;
  StepRecord forward_backward(const StepControl& control) override;
  std::vector<torch::Tensor> gradients() override;
  void apply_step(const StepControl& control, bool skipped, StepRecord& record) override;
  EvalScores evaluate(int64_t step, const std::vector<size_t>& views,
                      const ImageSink& on_image) override;
  torch::Tensor render_camera(const data::Camera& camera, int64_t step) override;
  ViewOutputs render_outputs(const data::Camera& camera, int64_t step) override;
  std::string render_layout() override;
  ViewRenderer* view_renderer() override { return this; }
  void save_state(SnapshotWriter& writer) override;
  void load_state(const SnapshotReader& reader) override;
  std::string write_outputs(const std::string& out_dir) override;
  std::string describe() override;
  std::string not_learning_causes() const override;
  std::string overfitting_causes() const override;
  std::string stopped_hint() const override {
    return " (`tessera export SNAPSHOT --ply OUT.ply` writes its Gaussians)";
  }
  nlohmann::json summary_fields() override;
  MemoryParts memory_parts() override;
  // An epoch: the train views, gaussians.views_per_step at a time; the schedules scale with
  // the plan (GaussianTrainer::set_total_steps); a step costs its pixels, an eval view a third
  // of a full-resolution training view (no backward).
  EpochSize epoch_size() const override;
  void set_total_steps(int64_t steps) override { trainer_.set_total_steps(steps); }
  double step_cost(int64_t step) const override { return trainer_.step_cost(step); }
  double eval_cost(const std::vector<size_t>& views) const override {
    return static_cast<double>(views.size()) / 3.0;
  }

  GaussianTrainer& trainer() { return trainer_; }

 private:
  int sh_degree(int64_t step) const;  // the SH degree renders at `step` steps done use

  distributed::Communicator& comm_;
  GaussianTrainer trainer_;
  GaussianStepResult pending_;  // the step in progress
  int64_t all_to_all_at_step_start_ = 0;  // comm_.traffic() when the step began
  std::string ply_;             // written by write_outputs
};

void register_gaussian_family(FamilyRegistry& registry);
// `tessera bench gaussians` (gaussian_bench.cpp): step time and memory per rank at a fixed count.
bench::BenchCommand add_gaussian_bench(CLI::App& bench);
// `tessera bench snapshot` (gaussian_snapshot_bench.cpp): a sharded 3DGS state's snapshot write
// and read times, parallel HDF5 vs gathered, and the seal check against a plain read.
bench::BenchCommand add_gaussian_snapshot_bench(CLI::App& bench);

}  // namespace tessera::models::gaussians
