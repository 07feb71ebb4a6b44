// Lens distortion honored in training (docs/datasets.md, "Lens distortion"), under mpiexec -n 2:
// nerf-hash trained on a synthetic scene rendered through a lens (`tessera synth --distortion`)
// reaches a clearly higher eval PSNR with the coefficients honored than with the same images
// and the coefficients dropped (what an importer that ignored them would give).
#include <gtest/gtest.h>
#include <torch/types.h>

#include <array>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "models/nerf/ray_model.h"
#include "models/nerf/ray_trainer.h"
#include "models/nerf/nerf_family.h"
#include "tests/mpi_test_env.h"

namespace tessera {
namespace {

using namespace models::nerf;  // the ray family under test

// A strong pincushion lens: it moves the corners of the 128-pixel views by about 26 pixels and
// the middles of the edges by about 9.
constexpr std::array<double, 4> kLens{0.6, 0.2, 0.0, 0.0};

// The dataset at `from` rewritten with every camera's distortion set to 0 (images unchanged).
void write_without_distortion(const std::string& from, const std::string& to) {
  const data::SceneReader scene(from);
  std::vector<data::Camera> cameras = scene.cameras();
  for (auto& c : cameras) c.k1 = c.k2 = c.p1 = c.p2 = 0.0;
  data::SceneWriter writer(to, scene.meta(), cameras, scene.has_alpha());
  for (size_t i = 0; i < cameras.size(); ++i)
    writer.write_image(i, scene.read_image(i),
                       scene.has_alpha() ? scene.read_alpha(i) : torch::Tensor());
  writer.commit();
}

double train_and_eval(const std::string& path) {
  const data::SceneReader scene(path);
  ModelRegistry registry;
  models::nerf::register_nerf_models(registry);
  Config config;
  config.model.name = "nerf-hash";
  config.run.seed = 3;
  auto model = registry.create(config, ModelContext::from_scene(scene, torch::kCPU));
  RayTrainerOptions o;
  o.steps = 400;
  o.nerf.rays_per_step = 1024;
  o.seed = 3;
  o.nerf.lr_schedule = "exponential";
  o.nerf.lr = 1e-2;
  o.nerf.final_lr = 1e-3;
  o.log_every = 0;
  o.progress = false;
  o.eval_split = "val";
  o.eval_max_views = 4;
  o.nerf.background = "random";
  RayTrainer trainer(*test::g_context, test::cpu_world(), *model, scene, o);
  for (int64_t t = 0; t < o.steps; ++t) trainer.train_step(t);
  return trainer.evaluate(o.steps, /*write=*/false).value("psnr");
}

TEST(LensTraining, HonoringDistortionRecoversThePsnrThatIgnoringItLoses) {
  const std::string dir = test::make_shared_temp_dir("tessera-lens-training", [](const std::string& d) {
    data::synth::SynthOptions options;
    options.views = 24;
    options.width = 128;
    options.height = 128;
    options.distortion = kLens;
    data::synth::write_synth_scene(options, d + "/lens.h5");
    write_without_distortion(d + "/lens.h5", d + "/ignored.h5");
  });
  const double honored = train_and_eval(dir + "/lens.h5");
  const double ignored = train_and_eval(dir + "/ignored.h5");
  if (test::cpu_world().rank() == 0)
    std::printf("eval PSNR after 400 steps: %.2f dB with the lens honored, %.2f ignored\n", honored,
                ignored);
  // Measured: 24.94 dB honored, 23.76 ignored (1.2 dB; 0.9 at 64 pixels and 250 steps, where
  // both runs are further from converged). Run-to-run differences of the seed are ~0.3 dB.
  EXPECT_GT(honored, ignored + 0.75);
  EXPECT_GT(honored, 24.0) << "the honored run learns the scene";
  test::remove_shared_temp_dir(dir);
}

}  // namespace
}  // namespace tessera
