// NeRF on a capture-like scene renders the views between its training views without fog
// (docs/nerf.md, "Generalizing to new views"), under mpiexec -n 2: nerf-hash trained with
// configs/capture_nerf.toml on `tessera synth --preset tabletop` (objects on a table under a
// dome, no alpha, normalized and unbounded as an imported photo capture; every 8th view is val,
// between the train views of the spiral) scores its val views close to its train views. With the
// finest resolution pinned at 2048 and every level on from the start (what the capture config
// used to say) the same run fits the train views as well and renders the val views as fog:
// eval 12.97 dB against 23.73 on the train views (measured by hand, docs/nerf.md). With the finest
// resolution from the images and coarse to fine but 2^17 rows, no decay and white holes (the
// config of before this test's present bounds): 21.24 against 27.89, gap 6.65.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "framework/config.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "framework/family.h"
#include "models/builtin.h"
#include "models/nerf/nerf_family.h"
#include "models/nerf/ray_model.h"
#include "models/nerf/ray_trainer.h"
#include "tests/mpi_test_env.h"

namespace tessera {
namespace {

using namespace models::nerf;  // the ray family under test

// 36 train and 6 val views of 96x96 (every 8th view is val), 600 steps of 2048 rays: the
// measurements of docs/nerf.md.
constexpr int kViews = 48;
constexpr int kSide = 96;
constexpr int kSteps = 600;
// The fog (N_max 2048, one process): eval 12.97 dB, 10.8 dB below the train views. This test's
// run (2 ranks; N_max 610 and 2^15 rows from the images, coarse to fine 0.5, hash-grid decay 0.1,
// the far colour in the holes, pixel jitter, the proposal sampler): eval 23.09, train 24.62, gap
// 1.53 (seed 1 by hand: 22.54, gap 1.87). With the occupancy grid's sampler and march jitter
// instead: eval 22.53, gap 2.02 (seed 1: 23.12, 1.84), which fails the gap's bound; without the
// jitters as well: gaps 3.11 and 3.31. 3DGS on the same scene: 23.64, gap 3.7.
constexpr double kMaxGap = 2.0;
constexpr double kMinEvalPsnr = 22.0;

struct Scores {
  double eval_psnr = 0, train_psnr = 0;
};

// Trains nerf-hash with the capture config on `scene_path` and scores its val and train views.
Scores train_capture_config(const std::string& scene_path, const std::vector<std::string>& extra) {
  const char* source = std::getenv("TESSERA_SOURCE_DIR");
  if (!source) throw std::runtime_error("TESSERA_SOURCE_DIR is not set");
  FamilyRegistry families;  // [nerf] joins the config schema
  models::register_builtin_families(families);
  std::vector<std::string> overrides = {
      "data.path=" + scene_path, "train.epochs=0", "train.time_budget_minutes=0",
      "train.steps=" + std::to_string(kSteps), "eval.max_views=6", "eval.train_views=6",
      "nerf.rays_per_step=2048"};
  overrides.insert(overrides.end(), extra.begin(), extra.end());
  const Config config = load_config(std::string(source) + "/configs/capture_nerf.toml", overrides);
  const data::SceneReader scene(scene_path);
  ModelRegistry registry;
  register_nerf_models(registry);
  RayTrainerOptions o = trainer_options(config);
  o.log_every = 0;
  o.progress = false;
  RayTrainer trainer(*test::g_context, test::cpu_world(),
                     registry.create(config, ModelContext::from_scene(scene, torch::kCPU)), scene, o);
  for (int64_t t = 0; t < o.steps; ++t) trainer.train_step(t);
  const EvalScores scores = trainer.evaluate(o.steps, /*write=*/false);
  return {scores.value("psnr"), scores.value("train_psnr")};
}

TEST(NerfGeneralization, ValViewsBetweenTheTrainViewsShowNoFog) {
  const std::string dir = test::make_shared_temp_dir("tessera-nerf-generalization", [](const std::string& d) {
    data::synth::SynthOptions options;
    options.preset = "tabletop";
    options.views = kViews;
    options.width = kSide;
    options.height = kSide;
    data::synth::write_synth_scene(options, d + "/tabletop.h5");
  });
  const Scores scores = train_capture_config(dir + "/tabletop.h5", {});
  if (test::cpu_world().rank() == 0)
    std::printf("after %d steps: eval %.2f dB, train %.2f dB (gap %.2f)\n", kSteps,
                scores.eval_psnr, scores.train_psnr, scores.train_psnr - scores.eval_psnr);
  EXPECT_LE(scores.train_psnr - scores.eval_psnr, kMaxGap);
  EXPECT_GE(scores.eval_psnr, kMinEvalPsnr);
}

}  // namespace
}  // namespace tessera
