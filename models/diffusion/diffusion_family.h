// The point-diffusion family (docs/diffusion.md): a PointDenoiser trained with DDPM's loss on a
// tessera-shapes dataset, data parallel across ranks behind the framework's TrainingRun.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "distributed/gradient_synchronizer.h"
#include "framework/data/shapes.h"
#include "framework/family.h"
#include "framework/schedule.h"
#include "models/diffusion/diffusion_config.h"
#include "models/diffusion/noise_schedule.h"
#include "models/diffusion/point_denoiser.h"

namespace tessera::models::diffusion {

constexpr const char* kModelName = "point-diffusion";

// Noise levels of the held-out denoising loss: the midpoints of this many equal parts of [0, T).
constexpr int64_t kEvalLevels = 8;

class DiffusionFamily : public ModelFamily {
 public:
  explicit DiffusionFamily(const FamilyContext& context);
  ~DiffusionFamily() override;

  std::string model_name() const override { return kModelName; }
  std::string work_unit() const override { return "shapes"; }
  void on_start(int64_t first_step) override;
  StepRecord forward_backward(const StepControl& control) override;
  std::vector<torch::Tensor> gradients() override;
  void apply_step(const StepControl& control, bool skipped, StepRecord& record) override;
  // The held-out denoising loss: the mean DDPM loss of the shapes `items` at kEvalLevels fixed
  // noise levels with fixed noise (a pure function of the seed), split across ranks.
  EvalScores evaluate(int64_t step, const std::vector<size_t>& items,
                      const ImageSink& on_image) override;
  torch::Tensor render_camera(const data::Camera& camera, int64_t step) override;
  void save_state(SnapshotWriter& writer) override;
  void load_state(const SnapshotReader& reader) override;
  std::string describe() override;
  std::string not_learning_causes() const override;

  const PointDenoiser& model() const { return *model_; }
  // The shapes of step `step`'s global batch (dataset indices), the same on every rank.
  std::vector<int64_t> batch_shapes(int64_t step);
  // x_0 of shapes `ids`: [B, tokens, 6], xyz then rgb scaled to [-1, 1], on the device.
  torch::Tensor clean_points(const std::vector<int64_t>& ids) const;

 private:
  distributed::Communicator& comm_;
  const data::shapes::ShapesReader& shapes_;
  DiffusionOptions options_;
  uint64_t seed_;
  torch::Device device_;
  Recompute recompute_;
  std::unique_ptr<PointDenoiser> model_;
  std::unique_ptr<torch::optim::Adam> optimizer_;
  std::unique_ptr<distributed::GradientSynchronizer> sync_;
  NoiseSchedule schedule_;
  LrSchedule lr_;
  std::vector<size_t> train_;
  std::map<int64_t, std::vector<int64_t>> epochs_;  // epoch -> permutation of train_ (cache)
  double step_lr_ = 0.0;
};

// FamilyInfo registration: model `point-diffusion`, its [diffusion] section and its dataset.
void register_diffusion_family(FamilyRegistry& registry);

}  // namespace tessera::models::diffusion
