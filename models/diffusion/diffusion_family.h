// The point-diffusion family (docs/diffusion.md): a PointDenoiser trained with DDPM's loss on a
// tessera-shapes dataset, data parallel across ranks behind the framework's TrainingRun.
#pragma once

#include <utility>

#include <torch/optim.h>
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/gradient_synchronizer.h"
#include "framework/data/shapes.h"
#include "framework/bench_util.h"
#include "framework/checkpoint_policy.h"
#include "framework/data_parallel.h"
#include "framework/family.h"
#include "framework/schedule.h"
#include "models/diffusion/diffusion_config.h"
#include "models/diffusion/noise_schedule.h"
#include "models/diffusion/point_denoiser.h"
#include "models/diffusion/sampling.h"

namespace tessera::models::diffusion {

constexpr const char* kModelName = "point-diffusion";

// Noise levels of the held-out denoising loss: the midpoints of this many equal parts of [0, T).
constexpr int64_t kEvalLevels = 8;

// Data parallel (framework/data_parallel.h): each rank denoises its share of the batch's shapes.
class DiffusionFamily : public DataParallelFamily, public SampleWriter {
 public:
  explicit DiffusionFamily(const FamilyContext& context);
  ~DiffusionFamily() override;

  std::string model_name() const override { return kModelName; }
  std::string work_unit() const override { return "shapes"; }
  void on_start(int64_t first_step) override;
  // The held-out denoising loss: the mean DDPM loss of the shapes `items` at kEvalLevels fixed
  // noise levels with fixed noise (a pure function of the seed), split across ranks.
  EvalScores evaluate(int64_t step, const std::vector<size_t>& items,
                      const ImageSink& on_image) override;
  void save_state(SnapshotWriter& writer) override;
  void load_state(const SnapshotReader& reader) override;
  std::string describe() override;
  // `tessera sample`: request.count clouds split across ranks, sample i's start noise (and
  // DDPM's noise) drawn from (request.seed, i) only; rank 0 writes DIR/sample-NNNN.ply (xyz,
  // rgb), each file whole or not at all.
  std::string write_samples(const SampleRequest& request) override;
  SampleWriter* sample_writer() override { return this; }
  std::string not_learning_causes() const override;
  // An epoch: the train shapes, diffusion.batch at a time; the learning-rate schedule scales
  // with the plan; an eval costs kEvalLevels forward passes of its shapes, plus with
  // generative_eval sample_steps forwards of as many samples (each a third of a training pass).
  EpochSize epoch_size() const override {
    return {static_cast<double>(train_.size()), static_cast<double>(options_.batch)};
  }
  void set_total_steps(int64_t steps) override;
  double eval_cost(const std::vector<size_t>& items) const override {
    const double forwards =
        kEvalLevels + (options_.generative_eval ? static_cast<double>(options_.sample_steps) : 0.0);
    return static_cast<double>(items.size()) * forwards / static_cast<double>(options_.batch) / 3.0;
  }

  const PointDenoiser& model() const { return *model_; }
  // The shapes of step `step`'s global batch (dataset indices), the same on every rank.
  std::vector<int64_t> batch_shapes(int64_t step);
  // x_0 of shapes `ids`: [B, tokens, 6], xyz then rgb scaled to [-1, 1], on the device.
  torch::Tensor clean_points(const std::vector<int64_t>& ids) const;
  // Clouds `0 .. count` drawn with `sampler` in `steps` steps, sample i's randomness from
  // (seed, purpose, i): split across ranks, gathered on every rank: [count, tokens, 6] float32
  // on the CPU, channels as clean_points'. `on_chunk(done)` (may be empty) sees rank 0's
  // progress. Collective.
  torch::Tensor draw_samples(int64_t count, int64_t steps, Sampler sampler, uint64_t seed,
                             uint64_t purpose, const std::function<void(int64_t)>& on_chunk);
  // What one block stores until backward on this rank's micro-batch when kept whole
  // (activation_bytes) and when recomputed (boundary_bytes: its output), measured on a dry
  // forward under `precision`; the budget policy plans on it. The random state is left as it was.
  SegmentInfo measure_block(const std::string& precision);
  // What forward() recomputes under checkpoint.policy (for "budget", the plan over the blocks).
  const Recompute& recompute() const { return recompute_; }
  // Replaces it (`bench diffusion` times every policy on one model, interleaved).
  void set_recompute(const Recompute& recompute) { recompute_ = recompute; }
  // Bytes stored until backward by one micro-batch's forward under recompute(), measured on a
  // dry forward of this rank's micro-batch size (the random state is left as it was).
  int64_t measure_activation_bytes(const std::string& precision);

 protected:
  // ---- DataParallelFamily. Phases: data (the micro-batch's shapes and noise), forward (the
  // loss and its allreduce included), backward, gradient_sync; optimizer after the update.
  double begin_step(const StepControl& control) override;
  MicroBatchLoss micro_batch_loss(const StepControl& control, int64_t k, int64_t count) override;
  // run.deterministic: units of diffusion.unit_shapes shapes of the step's batch (0: batch / 16,
  // at least 4; the units' sizes differ by at most one).
  int64_t work_units() const override;
  int64_t unit_shapes() const;
  // The clouds [begin, end) of `count` that this rank samples: whole chunks, the same at any
  // world size (draw_samples).
  std::pair<int64_t, int64_t> sample_range(int64_t count) const;
  MicroBatchLoss unit_loss(const StepControl& control, int64_t unit, int64_t units) override;
  // The loss of the step's shapes [lo, hi) (a micro-batch or a unit).
  MicroBatchLoss shapes_loss(const StepControl& control, int64_t lo, int64_t hi);
  void end_step(StepRecord& record) override;
  const char* loss_phase() const override { return "forward"; }

 private:
  // checkpoint.policy -> recompute_ (and the budget plan's text).
  void plan_recompute(const Config& config);

  distributed::Communicator& comm_;
  const data::shapes::ShapesReader& shapes_;
  DiffusionConfig options_;
  uint64_t seed_;
  torch::Device device_;
  RecomputePolicy policy_;
  Recompute recompute_;
  std::string checkpoint_plan_;  // the budget policy's plan, logged at start
  std::string policy_name_;  // checkpoint.policy
  std::string precision_;
  std::unique_ptr<PointDenoiser> model_;
  NoiseSchedule schedule_;
  LrSchedule lr_;
  std::vector<size_t> train_;
  int64_t micro_shapes_ = 0;  // shapes in this rank's largest micro-batch
  std::map<int64_t, std::vector<int64_t>> epochs_;  // epoch -> permutation of train_ (cache)
  double step_lr_ = 0.0;
  std::vector<int64_t> step_shapes_;  // the step's global batch (batch_shapes)
};

// FamilyInfo registration: model `point-diffusion`, its [diffusion] section and its dataset.
void register_diffusion_family(FamilyRegistry& registry);

// `tessera bench diffusion` (diffusion_bench.cpp): the checkpoint policies' memory and time.
bench::BenchCommand add_diffusion_bench(CLI::App& bench);

}  // namespace tessera::models::diffusion
