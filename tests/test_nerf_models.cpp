// Tests of the NeRF models (models/nerf): registry, shapes, gradients, determinism and batch-split
// independence, exact checkpointing, learning a synthetic sphere, and the occupancy grid update.
#include <gtest/gtest.h>
#include <torch/autograd.h>
#include <torch/optim.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "distributed/errors.h"
#include "framework/checkpoint_policy.h"
#include "framework/config.h"
#include "framework/family.h"
#include "framework/memory.h"
#include "models/builtin.h"
#include "models/nerf/ray_model.h"
#include "models/nerf/nerf_family.h"
#include "models/nerf/nerf_common.h"
#include "models/nerf/nerf_config.h"
#include "models/nerf/nerf_hash.h"
#include "models/nerf/nerf_mlp.h"
#include "models/nerf/occupancy_grid.h"

namespace {

using tessera::Config;
using tessera::FamilyRegistry;
using tessera::parse_config;
using tessera::models::nerf::Model;
using tessera::models::nerf::ModelContext;
using tessera::models::nerf::ModelRegistry;
using tessera::models::nerf::RayBatch;
using tessera::models::nerf::RenderResult;
using tessera::models::nerf::StepContext;
namespace nerf = tessera::models::nerf;

constexpr float kSphereRadius = 0.5f;
const float kSphereColor[3] = {0.2f, 0.4f, 0.9f};

ModelContext scene_context() {
  ModelContext context;
  context.scene_bounds = {-1.0, -1.0, -1.0, 1.0, 1.0, 1.0};
  context.near = 1.0;
  context.far = 4.0;
  return context;
}

// nerf-hash with nerf.sampler = "proposal": a test parameter, not a registered model.
const std::string kHashProposal = "nerf-hash+proposal";

std::string model_name(const std::string& param) {
  return param == kHashProposal ? "nerf-hash" : param;
}

std::unique_ptr<Model> create(const std::string& name, int64_t seed = 7) {
  ModelRegistry registry;
  nerf::register_nerf_models(registry);
  Config config;
  config.model.name = model_name(name);
  config.run.seed = seed;
  if (name == kHashProposal) config.section<nerf::NerfConfig>().hash.sampler = "proposal";
  return registry.create(config, scene_context());
}

// Rays of `cameras` pinhole cameras (k x k pixels) on a circle of radius 2.5 looking at the origin,
// with the analytic target: a sphere of kSphereColor over a white background.
RayBatch sphere_rays(int k, int cameras = 2) {
  std::vector<float> o, d, rgb;
  for (int c = 0; c < cameras; ++c) {
    const double angle = c * M_PI / 2.0 + 0.3;
    const double cx = 2.5 * std::sin(angle), cz = -2.5 * std::cos(angle);
    const double fwd[3] = {-cx / 2.5, 0.0, -cz / 2.5};
    const double right[3] = {-fwd[2], 0.0, fwd[0]};  // perpendicular, horizontal
    const double down[3] = {0.0, 1.0, 0.0};
    constexpr double kTanHalfFov = 0.4;
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j) {
        const double u = ((j + 0.5) / k * 2.0 - 1.0) * kTanHalfFov;
        const double v = ((i + 0.5) / k * 2.0 - 1.0) * kTanHalfFov;
        double dir[3];
        for (int a = 0; a < 3; ++a) dir[a] = fwd[a] + u * right[a] + v * down[a];
        const double n = std::sqrt(dir[0] * dir[0] + dir[1] * dir[1] + dir[2] * dir[2]);
        for (double& x : dir) x /= n;
        const double org[3] = {cx, 0.0, cz};
        const double b = org[0] * dir[0] + org[1] * dir[1] + org[2] * dir[2];
        const double cc = 2.5 * 2.5 - kSphereRadius * kSphereRadius;
        const bool hit = b * b - cc > 0 && -b - std::sqrt(b * b - cc) > 0;
        for (int a = 0; a < 3; ++a) {
          o.push_back(static_cast<float>(org[a]));
          d.push_back(static_cast<float>(dir[a]));
          rgb.push_back(hit ? kSphereColor[a] : 1.0f);
        }
      }
  }
  const int64_t r = static_cast<int64_t>(o.size() / 3);
  RayBatch rays;
  rays.origins = torch::tensor(o).view({r, 3});
  rays.directions = torch::tensor(d).view({r, 3});
  rays.target_rgb = torch::tensor(rgb).view({r, 3});
  rays.near = torch::full({r}, 1.0f);
  rays.far = torch::full({r}, 4.0f);
  rays.background = torch::ones({3});
  rays.ray_ids = torch::arange(r, torch::kInt64);
  return rays;
}

RayBatch slice(const RayBatch& rays, int64_t begin, int64_t end) {
  return tessera::models::nerf::narrow_rays(rays, begin, end - begin);
}

std::vector<torch::Tensor> all_params(Model& model) {
  std::vector<torch::Tensor> out;
  for (auto& g : model.parameter_groups())
    for (auto& p : g.params) out.push_back(p);
  return out;
}

void zero_grads(Model& model) {
  for (auto& p : all_params(model))
    if (p.grad().defined()) p.mutable_grad().zero_();
}

// The trainer's loss: the mean squared error, and the model's regularization (summed over the
// rays) per ray.
torch::Tensor loss_of(const RenderResult& out, const RayBatch& rays) {
  const torch::Tensor mse = (out.rgb - rays.target_rgb).pow(2).mean();
  if (!out.regularization.defined()) return mse;
  return mse + out.regularization / static_cast<double>(rays.origins.size(0));
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.dtype() == b.dtype() &&
         a.contiguous().view(torch::kInt32).equal(b.contiguous().view(torch::kInt32));
}

class NerfModels : public ::testing::TestWithParam<std::string> {};

TEST_P(NerfModels, RegisteredAndRendersValidShapes) {
  ModelRegistry registry;
  nerf::register_nerf_models(registry);
  EXPECT_TRUE(registry.contains(model_name(GetParam())));
  auto model = create(GetParam());
  EXPECT_EQ(model->name(), model_name(GetParam()));
  const auto rays = sphere_rays(6);
  const auto out = model->render(rays, StepContext{3, 11, true});
  const int64_t r = rays.origins.size(0);
  ASSERT_EQ(out.rgb.sizes(), (std::vector<int64_t>{r, 3}));
  ASSERT_EQ(out.opacity.sizes(), (std::vector<int64_t>{r}));
  ASSERT_EQ(out.depth.sizes(), (std::vector<int64_t>{r}));
  EXPECT_GT(out.samples, 0);
  EXPECT_GE(out.rgb.min().item<float>(), 0.0f);
  EXPECT_LE(out.rgb.max().item<float>(), 1.0f);
  EXPECT_GE(out.opacity.min().item<float>(), 0.0f);
  EXPECT_LE(out.opacity.max().item<float>(), 1.0f + 1e-5f);
  EXPECT_TRUE(torch::isfinite(out.depth).all().item<bool>());
}

TEST_P(NerfModels, GradientsReachEveryParameter) {
  auto model = create(GetParam());
  const auto rays = sphere_rays(8);
  // Step 5: at step 0 the proposal sampler draws the radiance field's samples evenly (its weights
  // are annealed from w^0), and the first proposal field's weights bound theirs: no gradient yet.
  loss_of(model->render(rays, StepContext{5, 1, true}), rays).backward();
  int index = 0;
  for (auto& group : model->parameter_groups())
    for (auto& p : group.params) {
      ASSERT_TRUE(p.grad().defined()) << group.name << " #" << index;
      EXPECT_GT(p.grad().abs().sum().item<double>(), 0.0) << group.name << " #" << index;
      EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>()) << group.name << " #" << index;
      ++index;
    }
}

TEST_P(NerfModels, InitializationIsAPureFunctionOfTheSeed) {
  auto a = create(GetParam(), 5), b = create(GetParam(), 5), c = create(GetParam(), 6);
  const auto pa = all_params(*a), pb = all_params(*b), pc = all_params(*c);
  ASSERT_EQ(pa.size(), pb.size());
  bool any_differs = false;
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(pa[i], pb[i])) << i;
    any_differs = any_differs || !pa[i].equal(pc[i]);
  }
  EXPECT_TRUE(any_differs);
}

TEST_P(NerfModels, RenderIsDeterministicAndIndependentOfTheBatchSplit) {
  auto model = create(GetParam());
  const auto rays = sphere_rays(8);  // 128 rays
  const int64_t r = rays.origins.size(0);
  for (bool training : {true, false}) {
    const StepContext ctx{12, 99, training};
    const auto full = model->render(rays, ctx);
    const auto again = model->render(rays, ctx);
    EXPECT_TRUE(bitwise_equal(full.rgb, again.rgb));
    const int64_t cut = 37;  // uneven halves
    const auto a = model->render(slice(rays, 0, cut), ctx);
    const auto b = model->render(slice(rays, cut, r), ctx);
    EXPECT_TRUE(bitwise_equal(full.rgb, torch::cat({a.rgb, b.rgb}))) << "training=" << training;
    EXPECT_TRUE(bitwise_equal(full.opacity, torch::cat({a.opacity, b.opacity})));
    EXPECT_TRUE(bitwise_equal(full.depth, torch::cat({a.depth, b.depth})));
    EXPECT_EQ(full.samples, a.samples + b.samples);
  }
  if (GetParam() != "nerf-hash") {  // the jitter depends on (seed, step): another step differs
    const auto s1 = model->render(rays, StepContext{12, 99, true});
    const auto s2 = model->render(rays, StepContext{13, 99, true});
    EXPECT_FALSE(s1.depth.equal(s2.depth));
  }
}

TEST_P(NerfModels, CheckpointedSegmentsGiveIdenticalGradients) {
  auto model = create(GetParam());
  const auto rays = sphere_rays(8);
  const StepContext ctx{4, 21, true};
  auto grads = [&]() {
    zero_grads(*model);
    auto loss = loss_of(model->render(rays, ctx), rays);
    loss.backward();
    std::vector<torch::Tensor> g{loss.detach().clone()};
    for (auto& p : all_params(*model)) g.push_back(p.grad().clone());
    return g;
  };
  model->set_checkpointed_segments({});
  const auto plain = grads();
  model->set_checkpointed_segments(model->segment_names());
  const auto checkpointed = grads();
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(bitwise_equal(plain[i], checkpointed[i])) << i;
  EXPECT_THROW(model->set_checkpointed_segments({"encoding"}), std::exception);
}

// A few dozen Adam steps on the synthetic sphere; returns {initial loss, final loss}.
std::pair<double, double> train_sphere(Model& model, int steps, double lr) {
  const auto rays = sphere_rays(12);  // 288 rays
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (auto& g : model.parameter_groups())
    groups.emplace_back(g.params, std::make_unique<torch::optim::AdamOptions>(lr));
  torch::optim::Adam adam(groups, torch::optim::AdamOptions(lr).eps(1e-15));
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    adam.zero_grad();
    const RenderResult out = model.render(rays, StepContext{step, 3, true});
    loss_of(out, rays).backward();
    adam.step();
    if (step == 0) first = (out.rgb - rays.target_rgb).pow(2).mean().item<double>();  // as `last`
  }
  {
    torch::NoGradGuard no_grad;
    last = loss_of(model.render(rays, StepContext{steps, 3, false}), rays).item<double>();
  }
  return {first, last};
}

TEST(NerfTraining, HashGridLearnsTheSphere) {
  auto model = create("nerf-hash");
  const auto [first, last] = train_sphere(*model, 30, 1e-2);
  std::printf("nerf-hash sphere: loss %.5f -> %.5f (%.1fx)\n", first, last, first / last);
  EXPECT_GT(first / last, 10.0);

  // The grid updated from the trained model keeps the sphere and empties most of the box.
  auto* hash = dynamic_cast<nerf::NerfHash*>(model.get());
  ASSERT_NE(hash, nullptr);
  auto& grid = hash->occupancy_grid();
  const float step = hash->step_size();
  grid.update([&](const torch::Tensor& p) { return hash->density(p) * step; }, 3, 29);
  const auto bits = grid.bitfield().view({-1}).to(torch::kFloat32);
  const auto dist = grid.sample_positions(3, 29).norm(2, 1);
  const double near_rate = bits.masked_select(dist.lt(0.35)).mean().item<double>();
  const double total_rate = bits.mean().item<double>();
  std::printf("occupied: %.3f of cells inside r<0.35, %.3f overall\n", near_rate, total_rate);
  EXPECT_GT(near_rate, 0.9);
  EXPECT_LT(total_rate, 0.5);
  // Marching now skips the emptied cells: far fewer samples than through the full grid.
  const auto rays = sphere_rays(8);
  const int64_t full = create("nerf-hash")->render(rays, StepContext{30, 3, false}).samples;
  const int64_t skipped = model->render(rays, StepContext{30, 3, false}).samples;
  std::printf("samples for 128 rays: %lld with the full grid, %lld after the update\n",
              static_cast<long long>(full), static_cast<long long>(skipped));
  EXPECT_LT(skipped * 2, full);
}

// An unbounded scene (extent beyond the bounds) contracts space: the grids cover [-2, 2]^3 of
// contracted space, rays run past the foreground out to `far`, and the model still learns.
TEST(NerfTraining, UnboundedHashGridContractsAndLearnsTheSphere) {
  ModelContext context = scene_context();
  context.scene_extent = {-8, -8, -8, 8, 8, 8};
  ASSERT_TRUE(context.unbounded());
  ModelRegistry registry;
  nerf::register_nerf_models(registry);
  tessera::Config config;
  config.model.name = "nerf-hash";
  config.run.seed = 7;
  auto model = registry.create(config, context);
  auto* hash = dynamic_cast<nerf::NerfHash*>(model.get());
  ASSERT_NE(hash, nullptr);
  EXPECT_TRUE(hash->contracted());
  EXPECT_FALSE(dynamic_cast<nerf::NerfHash*>(create("nerf-hash").get())->contracted());
  // A ray out of the foreground reaches `far` (world units) with samples all the way: the
  // bounded model stops at the box (t <= 3.5 for a ray from 2.5 out).
  RayBatch ray = sphere_rays(1, 1);
  ray.far = torch::full({1}, 7.5f);
  ray.directions = -ray.directions;  // away from the sphere, out of the box
  {
    torch::NoGradGuard no_grad;
    const RenderResult out = model->render(ray, StepContext{0, 3, false});
    EXPECT_GT(out.samples, 0);
    EXPECT_GT(out.opacity.item<float>(), 0.0f) << "the untrained fog out there is seen";
    EXPECT_EQ(create("nerf-hash")->render(ray, StepContext{0, 3, false}).samples, 0)
        << "the bounded model has no samples outside its box";
  }
  const auto [first, last] = train_sphere(*model, 30, 1e-2);
  std::printf("contracted nerf-hash sphere: loss %.5f -> %.5f (%.1fx)\n", first, last, first / last);
  EXPECT_GT(first / last, 5.0);

  // The uncontracted frame grows to hold the cameras (2.5 from the center here), never
  // contracting the space between a camera and the foreground.
  EXPECT_FLOAT_EQ(hash->frame_half_width(), 1.0f) << "no camera bounds given: the box";
  context.camera_bounds = {-2.5, -0.5, -2.5, 2.5, 0.5, 1.0};
  auto with_cameras = registry.create(config, context);
  EXPECT_FLOAT_EQ(dynamic_cast<nerf::NerfHash*>(with_cameras.get())->frame_half_width(), 2.5f);
  const auto [first_c, last_c] = train_sphere(*with_cameras, 30, 1e-2);
  std::printf("contracted beyond the cameras: loss %.5f -> %.5f (%.1fx)\n", first_c, last_c,
              first_c / last_c);
  EXPECT_GT(first_c / last_c, 5.0);
}

// Eval on an unbounded scene (RayBatch::last_sample_background): what a ray's transmittance
// leaves after its last sample takes that sample's colour, so the dataset's background never
// shows through a ray that slips between the far density; a ray without samples keeps the
// background. Bounded models, whose empty space really shows the background, ignore the flag.
TEST(NerfHashBackground, LastSampleColourFillsWhatTheRayLeavesOnUnboundedScenes) {
  ModelContext context = scene_context();
  context.scene_extent = {-8, -8, -8, 8, 8, 8};
  auto model = std::make_unique<nerf::NerfHash>(nerf::NerfHashOptions{}, context, 7);
  RayBatch rays = sphere_rays(4, 1);
  rays.far = torch::full({rays.far.size(0)}, 7.5f);
  rays.far[0] = rays.near[0];  // no samples
  torch::NoGradGuard no_grad;
  auto render = [&](Model& m, float background, bool last_sample) {
    RayBatch r = rays;
    r.background = torch::full({3}, background);
    r.last_sample_background = last_sample;
    return m.render(r, StepContext{0, 3, false});
  };
  const RenderResult white = render(*model, 1.0f, true), black = render(*model, 0.0f, true);
  ASSERT_LT(white.opacity.slice(0, 1).min().item<float>(), 0.999f)
      << "an untrained model leaves transmittance for the fill to show";
  EXPECT_TRUE(torch::equal(white.rgb.slice(0, 1), black.rgb.slice(0, 1)))
      << "rays with samples never show the background";
  EXPECT_TRUE(torch::equal(white.rgb[0], torch::ones({3})));
  EXPECT_TRUE(torch::equal(black.rgb[0], torch::zeros({3})));
  // The fill is one sample's colour (in [0, 1]), weighted by the transmittance left.
  const auto fill = (white.rgb - render(*model, 0.0f, false).rgb).slice(0, 1);
  const auto left = (1.0f - white.opacity.slice(0, 1)).unsqueeze(1);
  EXPECT_TRUE((fill >= -1e-6f).all().item<bool>());
  EXPECT_TRUE((fill <= left + 1e-6f).all().item<bool>());
  // Off, the background shows where transmittance is left.
  EXPECT_FALSE(torch::equal(render(*model, 1.0f, false).rgb, render(*model, 0.0f, false).rgb));
  // Bounded: the flag changes nothing.
  auto bounded = create("nerf-hash");
  rays.far = torch::full({rays.far.size(0)}, 4.0f);
  EXPECT_FALSE(torch::equal(render(*bounded, 1.0f, true).rgb, render(*bounded, 0.0f, true).rgb));
  EXPECT_TRUE(torch::equal(render(*bounded, 1.0f, true).rgb, render(*bounded, 1.0f, false).rgb));
}

// nerf.hash_weight_decay: a training render's regularization is weight_decay * (its rays) * the
// sum over levels of each level's mean squared feature (divided by the step's rays in training,
// so once per step), none without gradients or at 0; trained with it, the sphere is still
// learned and the table ends smaller than without it.
TEST(NerfHashWeightDecay, AddsTheLevelsMeanSquaredFeatureOncePerStep) {
  ModelContext context = scene_context();
  nerf::NerfHashOptions options;
  options.weight_decay = 0.1f;
  nerf::NerfHash model(options, context, 7);
  const RayBatch rays = sphere_rays(4, 1);
  const torch::Tensor table = model.parameter_groups()[0].params[0];
  ASSERT_EQ(table.dim(), 3);
  const double expected = 0.1 * static_cast<double>(rays.origins.size(0)) *
                          table.detach().square().mean({1, 2}).sum().item<double>();
  const RenderResult out = model.render(rays, StepContext{0, 3, true});
  ASSERT_TRUE(out.regularization.defined());
  EXPECT_NEAR(out.regularization.item<double>(), expected, 1e-6 * expected);
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(model.render(rays, StepContext{0, 3, false}).regularization.defined());
  }
  nerf::NerfHash plain(nerf::NerfHashOptions{}, context, 7);
  EXPECT_FALSE(plain.render(rays, StepContext{0, 3, true}).regularization.defined());

  // Trained (the photometric loss plus the decay per ray, as RayTrainer adds them).
  auto train = [](nerf::NerfHash& m) {
    const auto batch = sphere_rays(12);
    torch::optim::Adam adam(all_params(m), torch::optim::AdamOptions(1e-2).eps(1e-15));
    for (int step = 0; step < 40; ++step) {
      adam.zero_grad();
      const RenderResult r = m.render(batch, StepContext{step, 3, true});
      auto loss = loss_of(r, batch);
      if (r.regularization.defined()) loss = loss + r.regularization / batch.origins.size(0);
      loss.backward();
      adam.step();
    }
    torch::NoGradGuard no_grad;
    return std::make_pair(loss_of(m.render(batch, StepContext{40, 3, false}), batch).item<double>(),
                          m.parameter_groups()[0].params[0].square().mean().item<double>());
  };
  nerf::NerfHash decayed(options, context, 7), undecayed(nerf::NerfHashOptions{}, context, 7);
  const auto [loss_decayed, table_decayed] = train(decayed);
  const auto [loss_plain, table_plain] = train(undecayed);
  std::printf("sphere after 40 steps: loss %.5f with decay, %.5f without; mean squared feature "
              "%.3g vs %.3g\n", loss_decayed, loss_plain, table_decayed, table_plain);
  EXPECT_LE(loss_decayed, 2.0 * loss_plain) << "the decay leaves what the rays support";
  EXPECT_LT(table_decayed, 0.5 * table_plain);
}

// march_jitter: a training ray starts marching a random fraction of its first step later, a pure
// function of (seed, step, ray id); eval marches as without. The sphere's cameras lie outside the
// box, so the march starts where a ray enters it, not at near.
TEST(NerfHashMarchJitter, TrainingRaysStartAFractionOfAStepLater) {
  nerf::NerfHashOptions options;
  options.march_jitter = true;
  nerf::NerfHash jittered(options, scene_context(), 7), plain(nerf::NerfHashOptions{}, scene_context(), 7);
  const RayBatch rays = sphere_rays(6);  // 72 rays, every cell occupied at init
  const StepContext train{5, 3, true}, eval{5, 3, false}, other{6, 3, true};
  const auto base = plain.march(rays, &train);
  for (const auto* t : {&base.ts, &base.ray_offsets}) ASSERT_TRUE(t->defined());
  EXPECT_TRUE(torch::equal(jittered.march(rays, &eval).ts, base.ts)) << "eval: no jitter";
  EXPECT_TRUE(torch::equal(jittered.march(rays).ts, base.ts)) << "no context: no jitter";
  const auto moved = jittered.march(rays, &train);
  const float dt = plain.step_size();
  const auto first = [](const tessera::kernels::RayMarchOutput& m, int64_t r) {
    return m.ts[m.ray_offsets[r].item<int64_t>()].item<float>();
  };
  std::vector<double> shift;
  for (int64_t r = 0; r < 72; ++r) {
    ASSERT_GT(base.ray_offsets[r + 1].item<int64_t>(), base.ray_offsets[r].item<int64_t>()) << r;
    const double s = first(moved, r) - first(base, r);
    EXPECT_GE(s, -1e-5) << "ray " << r;
    EXPECT_LT(s, dt + 1e-5) << "ray " << r;
    shift.push_back(s / dt);
  }
  const auto below = std::count_if(shift.begin(), shift.end(), [](double f) { return f < 0.5; });
  EXPECT_GT(below, 18) << "spread over the step";
  EXPECT_LT(below, 54) << "spread over the step";
  // The same for a ray in any batch: the second half alone, with its ray ids.
  const RayBatch half = slice(rays, 36, 72);
  const auto part = jittered.march(half, &train);
  EXPECT_TRUE(torch::equal(part.ts, moved.ts.slice(0, moved.ray_offsets[36].item<int64_t>())));
  EXPECT_FALSE(torch::equal(jittered.march(rays, &other).ts, moved.ts)) << "another step, other starts";
}

// Samples behind where a ray's transmittance ends are left out of the render (docs/nerf.md,
// nerf-hash step 5), and the colors, opacities and gradients are those of rendering every
// marched sample. The density MLP's log-density bias is raised by 6 (sigma ~ 400 at init, a few
// steps of optical thickness 5): every ray ends within the box, a few samples in.
TEST(NerfHashSkipping, OccludedSamplesChangeNeitherTheRenderNorTheGradients) {
  auto model = create("nerf-hash");
  auto* hash = dynamic_cast<nerf::NerfHash*>(model.get());
  ASSERT_NE(hash, nullptr);
  {
    torch::NoGradGuard no_grad;
    const auto groups = model->parameter_groups();
    ASSERT_EQ(groups[1].name, "mlp");
    groups[1].params[3][0] += 6.0f;  // density layers: weight, bias, weight, bias (feature 0)
  }
  const auto rays = sphere_rays(8);
  auto run = [&](bool skip, int64_t chunk = 32) {
    hash->set_skip_occluded(skip);
    hash->set_occlusion_chunk(chunk);
    zero_grads(*model);
    const RenderResult out = model->render(rays, StepContext{0, 3, true});
    loss_of(out, rays).backward();
    std::vector<torch::Tensor> grads;
    for (auto& p : all_params(*model)) grads.push_back(p.grad().clone());
    torch::NoGradGuard no_grad;
    const RenderResult eval = model->render(rays, StepContext{0, 3, false});
    return std::make_tuple(out, grads, eval);
  };
  const auto [all, all_grads, all_eval] = run(false);
  const auto [kept, kept_grads, kept_eval] = run(true);
  EXPECT_EQ(all.samples, kept.samples) << "the same samples are marched";
  EXPECT_EQ(all.samples_rendered, all.samples);
  std::printf("samples rendered: %lld of %lld\n", static_cast<long long>(kept.samples_rendered),
              static_cast<long long>(kept.samples));
  EXPECT_LT(kept.samples_rendered * 4, kept.samples) << "rays end a few samples into the box";
  EXPECT_TRUE(torch::allclose(kept.rgb, all.rgb, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(kept.opacity, all.opacity, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(kept.depth, all.depth, 1e-5, 1e-5));
  EXPECT_TRUE(torch::allclose(kept_eval.rgb, all_eval.rgb, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(kept_eval.rgb, kept.rgb.detach(), 1e-5, 1e-6))
      << "eval reuses the density pass's features: the same colors as training";
  ASSERT_EQ(kept_grads.size(), all_grads.size());
  for (size_t i = 0; i < kept_grads.size(); ++i) {
    const double scale = all_grads[i].abs().max().item<double>();
    EXPECT_LE((kept_grads[i] - all_grads[i]).abs().max().item<double>(), 1e-4 * scale + 1e-9)
        << "parameter " << i;
  }
  // The occlusion pass in rounds (1, 2, 4, ... samples a ray: many rounds here) and in one round
  // keeps the same samples, so the same render and eval.
  for (const int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{2}}) {
    const auto [out, grads, eval] = run(true, chunk);
    EXPECT_EQ(out.samples_rendered, kept.samples_rendered) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(out.rgb, kept.rgb, 1e-5, 1e-6)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(eval.rgb, kept_eval.rgb, 1e-5, 1e-6)) << "chunk " << chunk;
    EXPECT_TRUE(torch::allclose(eval.opacity, kept_eval.opacity, 1e-5, 1e-6)) << "chunk " << chunk;
  }
}

// distortion_loss (O(S), prefix sums) against its definition, the double sum over sample pairs,
// in value and gradient; and it prefers weight on one interval to the same weight spread out.
TEST(DistortionLoss, MatchesThePairwiseDefinitionAndPrefersConcentratedWeight) {
  auto gen = nerf::make_generator({11});
  const std::vector<int64_t> counts = {5, 0, 1, 9};
  std::vector<int64_t> offsets = {0}, ray_of;
  for (size_t r = 0; r < counts.size(); ++r) {
    offsets.push_back(offsets.back() + counts[r]);
    for (int64_t i = 0; i < counts[r]; ++i) ray_of.push_back(static_cast<int64_t>(r));
  }
  const int64_t s = offsets.back();
  const auto widths = torch::rand({s}, gen, torch::kFloat64) * 0.1 + 0.01;
  // Intervals in order along each ray, with gaps (occupancy skipping leaves some).
  auto begin = torch::empty({s}, torch::kFloat64);
  for (size_t r = 0; r < counts.size(); ++r) {
    double t = 0.05;
    for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      begin[i] = t;
      t += widths[i].item<double>() + 0.02 * (i % 3);
    }
  }
  const auto end = begin + widths;
  const auto weights = (torch::rand({s}, gen, torch::kFloat64) * 0.3).set_requires_grad(true);
  const auto ray_offsets = torch::tensor(offsets, torch::kInt64);
  const auto ray_indices = torch::tensor(ray_of, torch::kInt64);
  const auto fast = nerf::distortion_loss(weights, begin, end, ray_offsets, ray_indices);
  ASSERT_EQ(fast.size(0), static_cast<int64_t>(counts.size()));
  const auto fast_grad = torch::autograd::grad({fast.sum()}, {weights})[0];

  std::vector<torch::Tensor> slow_rays;
  const auto mid = 0.5 * (begin + end);
  for (size_t r = 0; r < counts.size(); ++r) {
    auto total = torch::zeros({}, torch::kFloat64);
    for (int64_t i = offsets[r]; i < offsets[r + 1]; ++i) {
      for (int64_t j = offsets[r]; j < offsets[r + 1]; ++j)
        total = total + weights[i] * weights[j] * (mid[i] - mid[j]).abs();
      total = total + weights[i] * weights[i] * (end[i] - begin[i]) / 3.0;
    }
    slow_rays.push_back(total);
  }
  const auto slow = torch::stack(slow_rays);
  const auto slow_grad = torch::autograd::grad({slow.sum()}, {weights})[0];
  EXPECT_TRUE(torch::allclose(fast, slow, 1e-12, 1e-14)) << fast << slow;
  EXPECT_EQ(fast[1].item<double>(), 0.0) << "a ray without samples";
  EXPECT_TRUE(torch::allclose(fast_grad, slow_grad, 1e-12, 1e-14));

  // One ray of 8 equal intervals: all weight on one of them beats the same total spread out.
  const auto b8 = torch::arange(8, torch::kFloat64) * 0.1, e8 = b8 + 0.1;
  const auto off8 = torch::tensor({int64_t{0}, int64_t{8}}), idx8 = torch::zeros({8}, torch::kInt64);
  auto one = torch::zeros({8}, torch::kFloat64);
  one[3] = 0.9;
  const auto spread = torch::full({8}, 0.9 / 8, torch::kFloat64);
  EXPECT_LT(nerf::distortion_loss(one, b8, e8, off8, idx8).item<double>(),
            nerf::distortion_loss(spread, b8, e8, off8, idx8).item<double>() / 4);
}

int64_t parameter_count(Model& model) {
  int64_t n = 0;
  for (const auto& p : all_params(model)) n += p.numel();
  return n;
}

// mip-NeRF 360's interlevel loss on hand-made histograms: zero where the proposal's weight on
// the intervals overlapping a sample's bounds that sample's weight, (w - w_outer)^2 / w where not.
TEST(NerfHashProposal, InterlevelLossPenalizesWeightTheProposalMisses) {
  nerf::ProposalOptions options;
  auto generator = nerf::make_generator({1});
  const nerf::ProposalSampler sampler(options, generator, torch::kCPU);
  nerf::ProposalSamples s;
  s.nerf_edges = torch::tensor({0.0f, 0.25f, 0.5f, 0.75f, 1.0f}).repeat({3, 1});
  s.edges = {torch::tensor({0.0f, 0.5f, 1.0f}).repeat({3, 1})};
  s.weights = {torch::tensor({1.0f, 0.0f}).repeat({3, 1})};  // all in front
  const torch::Tensor w = torch::tensor({0.5f, 0.5f, 0.0f, 0.0f,     // in front: covered
                                         0.0f, 0.0f, 0.5f, 0.5f,     // behind: missed
                                         0.0f, 0.0f, 0.0f, 0.0f});   // nothing
  const torch::Tensor loss = sampler.interlevel_loss(s, w);
  ASSERT_EQ(loss.sizes(), (std::vector<int64_t>{3}));
  EXPECT_NEAR(loss[0].item<float>(), 0.0f, 1e-6f);
  EXPECT_NEAR(loss[1].item<float>(), (2 * 0.25f / 0.5f) / 4, 1e-5f);  // mean over the 4 samples
  EXPECT_NEAR(loss[2].item<float>(), 0.0f, 1e-6f);
  // A proposal interval that straddles two samples' intervals bounds both.
  s.edges = {torch::tensor({0.0f, 0.4f, 0.6f, 1.0f}).repeat({3, 1})};
  s.weights = {torch::tensor({0.0f, 0.6f, 0.0f}).repeat({3, 1})};
  const torch::Tensor middle = torch::tensor({0.0f, 0.5f, 0.5f, 0.0f}).repeat({3});
  EXPECT_NEAR(sampler.interlevel_loss(s, middle)[0].item<float>(), 0.0f, 1e-6f);
  // Gradients reach the proposal's weights only, not the radiance field's.
  s.weights = {torch::tensor({0.2f, 0.2f, 0.2f}).repeat({3, 1}).requires_grad_()};
  const torch::Tensor radiance = middle.clone().requires_grad_();
  sampler.interlevel_loss(s, radiance).sum().backward();
  EXPECT_LT(s.weights[0].grad()[0][1].item<float>(), 0.0f) << "more weight there lowers the loss";
  EXPECT_FALSE(radiance.grad().defined());
}

// The radiance field's samples of nerf.sampler = "proposal" lie in order within the span that
// marching would cover; training jitters them by (seed, step, ray); eval takes the centres.
TEST(NerfHashProposal, SamplesLieInOrderWithinTheRaySpan) {
  auto model = create(kHashProposal);
  auto* hash = dynamic_cast<nerf::NerfHash*>(model.get());
  ASSERT_NE(hash, nullptr);
  const auto rays = sphere_rays(4);  // near 1, far 4
  const int64_t r = rays.origins.size(0), n = nerf::ProposalOptions{}.nerf_samples;
  torch::NoGradGuard no_grad;
  const nerf::ProposalSamples eval = hash->propose(rays);
  const StepContext train{5, 3, true};
  const nerf::ProposalSamples jittered = hash->propose(rays, &train);
  for (const auto* s : {&eval, &jittered}) {
    ASSERT_EQ(s->samples.ts.size(0), r * n);
    EXPECT_TRUE(s->samples.ray_offsets.equal(torch::arange(r + 1, torch::kInt64) * n));
    const auto ts = s->samples.ts.view({r, n});
    EXPECT_TRUE((ts.slice(1, 1) >= ts.slice(1, 0, -1)).all().item<bool>());
    EXPECT_GE(ts.min().item<float>(), 1.0f);  // the near plane
    EXPECT_LE(ts.max().item<float>(), 4.0f);  // the far plane
    EXPECT_LE(s->samples.positions.abs().max().item<float>(), 1.0f + 1e-4f) << "within the box";
    EXPECT_GE(s->samples.deltas.min().item<float>(), 0.0f);
    const auto expect = rays.origins.index_select(0, s->samples.ray_indices) +
                        s->samples.ts.unsqueeze(1) * rays.directions.index_select(0, s->samples.ray_indices);
    EXPECT_TRUE(torch::allclose(s->samples.positions, expect, 1e-5, 1e-5));
  }
  EXPECT_FALSE(eval.samples.ts.equal(jittered.samples.ts));
  EXPECT_TRUE(eval.samples.ts.equal(hash->propose(rays).samples.ts));
  const StepContext later{6, 3, true};
  EXPECT_FALSE(jittered.samples.ts.equal(hash->propose(rays, &later).samples.ts));

  // A ray along x above the box (y = 3) never enters it: samples of no length, the background.
  RayBatch miss = slice(rays, 0, 1);
  miss.origins = torch::tensor({{2.5f, 3.0f, 0.0f}});
  miss.directions = torch::tensor({{-1.0f, 0.0f, 0.0f}});
  EXPECT_EQ(hash->propose(miss).samples.deltas.abs().max().item<float>(), 0.0f);
  const RenderResult out = model->render(miss, StepContext{5, 3, false});
  EXPECT_EQ(out.opacity.item<float>(), 0.0f);
  EXPECT_TRUE(torch::allclose(out.rgb, torch::ones({1, 3})));  // sphere_rays' white background
}

// The proposal fields learn from the interlevel loss only: the photometric loss alone gives them
// no gradient (the sampling passes none), and with the interlevel loss it does.
TEST(NerfHashProposal, OnlyTheInterlevelLossReachesTheProposalFields) {
  const auto rays = sphere_rays(8);
  for (float weight : {0.0f, 1.0f}) {
    nerf::NerfHashOptions options;
    options.sampler = "proposal";
    options.proposal.interlevel_weight = weight;
    nerf::NerfHash model(options, scene_context(), 7);
    loss_of(model.render(rays, StepContext{5, 1, true}), rays).backward();
    double proposal_grad = 0;
    for (auto& group : model.parameter_groups())
      if (group.name == "proposal")
        for (auto& p : group.params)
          if (p.grad().defined()) proposal_grad += p.grad().abs().sum().item<double>();
    if (weight == 0)
      EXPECT_EQ(proposal_grad, 0.0);
    else
      EXPECT_GT(proposal_grad, 0.0);
  }
}

// The proposal fields learn from the interlevel loss alone where a ray's weight lies, and the
// radiance field's samples follow: trained against a radiance field whose weight sits on the
// sphere's surface (all of it on the sample nearest the first hit, none on rays that miss),
// the samples of the rays that hit gather there.
TEST(NerfHashProposal, TheProposalFieldsLearnWhereTheWeightIs) {
  nerf::ProposalOptions options;
  auto generator = nerf::make_generator({7});
  const nerf::ProposalSampler sampler(options, generator, torch::kCPU);
  const auto rays = sphere_rays(12, 4);  // 576 rays from 4 sides, near 1, far 4
  const auto b = (rays.origins * rays.directions).sum(1);
  const auto disc = b.square() - (rays.origins.square().sum(1) - kSphereRadius * kSphereRadius);
  const auto hit = disc > 0;
  const auto t_hit = -b - disc.clamp_min(0).sqrt();
  auto to_unit = [](const torch::Tensor& p) { return (p + 1.0f) * 0.5f; };  // the box [-1, 1]^3
  auto share_near_surface = [&]() {  // of the hit rays' samples, within 0.15 of the hit
    torch::NoGradGuard no_grad;
    const auto s = sampler.sample(rays.origins, rays.directions, rays.near, rays.far, to_unit,
                                  torch::Tensor(), 2 * nerf::ProposalSampler::kAnnealSteps);
    const auto ts = s.samples.ts.view({rays.origins.size(0), -1});
    return ((ts - t_hit.unsqueeze(1)).abs() < 0.15f).index({hit}).to(torch::kFloat32).mean().item<double>();
  };
  const double before = share_near_surface();
  torch::optim::Adam adam(sampler.parameters(), torch::optim::AdamOptions(1e-2).eps(1e-15));
  auto draws = nerf::make_generator({8});
  for (int step = 0; step < 150; ++step) {
    adam.zero_grad();
    const auto uniforms = torch::rand({rays.origins.size(0), 3}, draws);
    const auto s = sampler.sample(rays.origins, rays.directions, rays.near, rays.far, to_unit,
                                  uniforms, step);
    const auto ts = s.samples.ts.view({rays.origins.size(0), -1});
    const auto nearest = (ts - t_hit.unsqueeze(1)).abs().argmin(1, true);
    const auto w = torch::zeros_like(ts).scatter_(1, nearest, 1.0f) * hit.unsqueeze(1);
    sampler.interlevel_loss(s, w.reshape({-1})).mean().backward();
    adam.step();
  }
  const double after = share_near_surface();
  std::printf("radiance-field samples within 0.15 of the surface: %.3f -> %.3f\n", before, after);
  EXPECT_LT(before, 0.25);
  EXPECT_GT(after, 0.5);
}

// nerf-hash with the proposal sampler learns the sphere as the grid sampler does.
TEST(NerfHashProposal, LearnsTheSphere) {
  auto model = create(kHashProposal);
  const auto [first, last] = train_sphere(*model, 30, 1e-2);
  std::printf("nerf-hash (proposal sampler) sphere: loss %.5f -> %.5f (%.1fx)\n", first, last,
              first / last);
  EXPECT_GT(first / last, 10.0);
}

// The [nerf] section's sizes reach the models that registry.create builds from a config.
TEST(NerfConfigSection, SizesFromTheConfigBuildTheModel) {
  FamilyRegistry families;  // [nerf] joins the config schema
  tessera::models::register_builtin_families(families);
  ModelRegistry registry;
  nerf::register_nerf_models(registry);
  const Config hash_config = parse_config(
      "[nerf]\nhash_levels = 4\nhash_log2_size = 10\nhash_features_per_level = 4\n"
      "hash_hidden_width = 32\nhash_geo_features = 8\nhash_color_layers = 1\n", "t");
  const auto hash = registry.create(hash_config, scene_context());
  nerf::NerfHashOptions hash_options;
  hash_options.levels = 4;
  hash_options.log2_hashmap_size = 10;
  hash_options.features_per_level = 4;
  hash_options.hidden_width = 32;
  hash_options.geo_features = 8;
  hash_options.color_hidden_layers = 1;
  nerf::NerfHash expected_hash(hash_options, scene_context(), 0);
  EXPECT_EQ(parameter_count(*hash), parameter_count(expected_hash));
  EXPECT_NE(parameter_count(*hash), parameter_count(*create("nerf-hash")));

  const Config mlp_config = parse_config(
      "[model]\nname = \"nerf-mlp\"\n[nerf]\nmlp_layers = 4\nmlp_width = 32\n"
      "mlp_skip_layer = 2\nmlp_color_width = 16\nmlp_position_frequencies = 6\n", "t");
  const auto mlp = registry.create(mlp_config, scene_context());
  nerf::NerfMlpOptions mlp_options;
  mlp_options.layers = 4;
  mlp_options.width = 32;
  mlp_options.skip_layer = 2;
  mlp_options.color_width = 16;
  mlp_options.position_frequencies = 6;
  nerf::NerfMlp expected_mlp(mlp_options, scene_context(), 0);
  EXPECT_EQ(parameter_count(*mlp), parameter_count(expected_mlp));
  EXPECT_NE(parameter_count(*mlp), parameter_count(*create("nerf-mlp")));
}

// nerf.hash_max_resolution = 0: the finest level's cell is 2/3 of a pixel footprint at the
// foreground's center, over the scene box (bounded) or the contracted cube of 4 frame half-widths
// (unbounded).
TEST(NerfHashResolution, FinestResolutionFollowsThePixelFootprint) {
  ModelContext context = scene_context();  // box side 2
  nerf::NerfHashOptions options;
  EXPECT_EQ(options.finest_resolution, 0);
  EXPECT_EQ(nerf::NerfHash(options, context, 0).finest_resolution(), 256);  // no cameras known
  context.pixel_footprint = 0.01;
  EXPECT_EQ(nerf::NerfHash(options, context, 0).finest_resolution(), 300);  // 1.5 * 2 / 0.01
  context.pixel_footprint = 0.0203;
  EXPECT_EQ(nerf::NerfHash(options, context, 0).finest_resolution(), 148);  // 147.8, rounded up
  context.pixel_footprint = 1.0;  // never below the coarsest level
  EXPECT_EQ(nerf::NerfHash(options, context, 0).finest_resolution(), options.base_resolution);
  options.finest_resolution = 512;  // a configured value is kept
  EXPECT_EQ(nerf::NerfHash(options, context, 0).finest_resolution(), 512);

  // Unbounded: the frame's half-width is 3 (cameras out to x = 3), the grid 4 * 3 = 12 across.
  ModelContext capture = scene_context();
  capture.scene_extent = {-16, -16, -16, 16, 16, 16};
  capture.camera_bounds = {-3, -1, 0, 3, 1, 1};
  capture.pixel_footprint = 0.05;
  nerf::NerfHash unbounded(nerf::NerfHashOptions{}, capture, 0);
  ASSERT_TRUE(unbounded.contracted());
  EXPECT_FLOAT_EQ(unbounded.frame_half_width(), 3.0f);
  EXPECT_EQ(unbounded.finest_resolution(), 360);
}

// nerf.hash_log2_size = 0: rows per level from the train views' pixels, at least 10 per row, as a
// power of two within [2^14, 2^17]; 2^15 without cameras; a size of 1-9 is refused.
TEST(NerfHashResolution, TableSizeFollowsTheTrainingPixels) {
  nerf::NerfHashOptions options;
  options.log2_hashmap_size = 0;
  auto log2_size = [&](int64_t pixels) {
    ModelContext context = scene_context();
    context.train_pixels = pixels;
    return nerf::NerfHash(options, context, 0).log2_hashmap_size();
  };
  EXPECT_EQ(log2_size(0), 15) << "unknown: the default";
  EXPECT_EQ(log2_size(36 * 96 * 96), 15);     // 33,177 rows: 2^15 = 32,768 fits
  EXPECT_EQ(log2_size(32767 * 10), 14);       // one row short of 2^15
  EXPECT_EQ(log2_size(9 * 270 * 480), 16);    // 116,640 rows: 2^16.8
  EXPECT_EQ(log2_size(70 * 302 * 403), 17);   // 852k rows: at the upper bound
  EXPECT_EQ(log2_size(1000), 14);             // at the lower bound
  nerf::NerfHash model(options, scene_context(), 0);
  EXPECT_EQ(model.parameter_groups()[0].params[0].size(1), int64_t{1} << 15) << "the table's rows";
  FamilyRegistry families;
  tessera::models::register_builtin_families(families);
  const Config bad = parse_config("[nerf]\nhash_log2_size = 5\n", "bad.toml");
  EXPECT_THROW(nerf::check_nerf_config(bad.section<nerf::NerfConfig>(), "bad.toml"),
               tessera::UserError);
  const Config from_images = parse_config("[nerf]\nhash_log2_size = 0\n", "ok.toml");
  EXPECT_NO_THROW(nerf::check_nerf_config(from_images.section<nerf::NerfConfig>(), "ok.toml"));
}

// nerf.hash_coarse_to_fine: levels past the coarsest third do not touch the density before their
// ramp reaches them, and every level does once the ramp is over.
TEST(NerfHashResolution, CoarseToFineSwitchesTheLevelsOnOverThePlannedSteps) {
  nerf::NerfHashOptions options;
  options.levels = 6;
  options.coarse_to_fine = 0.5f;
  ModelContext context = scene_context();
  context.pixel_footprint = 0.01;
  nerf::NerfHash model(options, context, 3);
  model.set_total_steps(100);  // levels 0, 1 on at step 0; all six from step 50
  auto density_at = [&](int64_t step) {
    torch::NoGradGuard no_grad;
    RayBatch rays;  // a render at `step` sets the level weights the density uses
    rays.origins = torch::tensor({{0.0f, 0.0f, -3.0f}});
    rays.directions = torch::tensor({{0.0f, 0.0f, 1.0f}});
    rays.near = torch::full({1}, 1.0f);
    rays.far = torch::full({1}, 4.0f);
    rays.background = torch::ones({1, 3});
    rays.ray_ids = torch::zeros({1}, torch::kInt64);
    StepContext step_context;
    step_context.step = step;
    step_context.training = false;
    model.render(rays, step_context);
    return model.density(torch::rand({256, 3}) * 1.8 - 0.9);
  };
  const auto table = model.parameter_groups()[0].params[0];
  auto perturbed = [&](int level, int64_t step) {
    torch::manual_seed(5);
    const auto before = density_at(step);
    const auto saved = table[level].clone();
    {
      torch::NoGradGuard no_grad;
      table[level].add_(0.5);
    }
    torch::manual_seed(5);
    const auto after = density_at(step);
    {
      torch::NoGradGuard no_grad;
      table[level].copy_(saved);
    }
    return !torch::equal(before, after);
  };
  EXPECT_TRUE(perturbed(1, 0));    // the coarsest third is on from the start
  EXPECT_FALSE(perturbed(2, 0));   // level 2 starts its ramp at step 0: weight 0 there
  EXPECT_TRUE(perturbed(2, 10));   // ... and has weight 0.8 at step 10
  EXPECT_FALSE(perturbed(5, 30));  // the finest ramps up over steps 37.5-50
  EXPECT_TRUE(perturbed(5, 50));
  model.set_total_steps(1000);     // a re-plan stretches the ramp
  EXPECT_FALSE(perturbed(5, 50));
}

TEST(NerfTraining, MlpLearnsTheSphere) {
  nerf::NerfMlpOptions options;  // a smaller trunk than the default keeps the test fast
  options.layers = 4;
  options.width = 64;
  options.skip_layer = 2;
  options.color_width = 64;
  options.samples_per_ray = 32;
  nerf::NerfMlp model(options, scene_context(), 7);
  const auto [first, last] = train_sphere(model, 40, 5e-3);
  std::printf("nerf-mlp sphere: loss %.5f -> %.5f (%.1fx)\n", first, last, first / last);
  EXPECT_GT(first / last, 5.0);
}

TEST(OccupancyGrid, StartsOccupiedAndMarksExactlyTheCellsAboveThreshold) {
  nerf::OccupancyGridOptions options;
  options.resolution = 16;
  options.chunk = 1000;
  const std::array<double, 6> bounds{-1, -1, -1, 1, 1, 1};
  nerf::OccupancyGrid grid(options, bounds, torch::kCPU);
  EXPECT_EQ(grid.bitfield().sum().item<int64_t>(), grid.num_cells());
  // A sphere of optical thickness 1 inside radius 0.5, empty outside.
  auto sphere = [](const torch::Tensor& p) { return p.norm(2, 1).lt(kSphereRadius).to(torch::kFloat32); };
  grid.update(sphere, 5, 15);
  const auto probes = grid.sample_positions(5, 15);
  const auto expected_values = sphere(probes);
  EXPECT_TRUE(bitwise_equal(grid.values(), expected_values));
  const float threshold = std::min(0.01f, expected_values.mean().item<float>());
  EXPECT_FLOAT_EQ(grid.current_threshold(), threshold);
  const auto expected_bits = expected_values.gt(threshold).to(torch::kUInt8).view({16, 16, 16});
  EXPECT_TRUE(grid.bitfield().equal(expected_bits));
  // Geometry: cells entirely outside the sphere are empty, cells entirely inside occupied.
  const auto idx = torch::arange(grid.num_cells());
  const auto centers = torch::stack({idx.div(256, "floor"), idx.div(16, "floor").remainder(16),
                                     idx.remainder(16)}, 1).to(torch::kFloat32) * 0.125f - 1.0f + 0.0625f;
  const float half_diag = 0.0625f * std::sqrt(3.0f);
  const auto dist = centers.norm(2, 1);
  const auto bits = grid.bitfield().view({-1});
  EXPECT_EQ(bits.masked_select(dist.gt(kSphereRadius + half_diag)).sum().item<int64_t>(), 0);
  const auto inside = dist.lt(kSphereRadius - half_diag);
  EXPECT_GT(inside.sum().item<int64_t>(), 0);
  EXPECT_TRUE(bits.masked_select(inside).eq(1).all().item<bool>());
  // The sample points are a pure function of (seed, step), and change with the step.
  EXPECT_TRUE(bitwise_equal(grid.sample_positions(5, 15), probes));
  EXPECT_FALSE(grid.sample_positions(5, 31).equal(probes));
  // EMA: with zero density the values decay by exactly 0.95.
  const auto before = grid.values().clone();
  grid.update([](const torch::Tensor& p) { return torch::zeros({p.size(0)}); }, 5, 31);
  EXPECT_TRUE(bitwise_equal(grid.values(), before * 0.95f));
}

TEST_P(NerfModels, MeasureSegmentsGivesOneEntryPerSegmentWithPositiveBytes) {
  auto model = create(GetParam());
  const auto rays = sphere_rays(8);
  const auto infos = model->measure_segments(rays, StepContext{0, 3, true});
  const auto names = model->segment_names();
  ASSERT_EQ(infos.size(), names.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(infos[i].name, names[i]);
    EXPECT_GT(infos[i].activation_bytes, 0) << names[i];
    EXPECT_GT(infos[i].boundary_bytes, 0) << names[i];
    EXPECT_LE(infos[i].boundary_bytes, infos[i].activation_bytes) << names[i];
  }
  // A dry run: no parameter gradient appears.
  for (auto& p : all_params(*model)) EXPECT_FALSE(p.grad().defined());
}

TEST_P(NerfModels, BudgetBetweenLowestPeakAndTotalCheckpointsSomeButNotAllSegments) {
  auto model = create(GetParam());
  const auto rays = sphere_rays(8);
  const auto infos = model->measure_segments(rays, StepContext{0, 3, true});
  ASSERT_GE(infos.size(), 2u);
  int64_t total = 0;  // the peak with nothing checkpointed
  for (const auto& s : infos) total += s.activation_bytes;
  // The lowest peak any plan reaches: the plan a budget too small for all of them takes.
  tessera::CheckpointPolicyOptions options;
  options.budget_mib = 1e-6;
  const auto lowest = tessera::make_checkpoint_policy("budget", options)->plan(infos);
  EXPECT_FALSE(lowest.fits);
  ASSERT_LT(lowest.peak_bytes, total) << lowest.text;
  options.budget_mib = (lowest.peak_bytes + total) / 2.0 / (1024.0 * 1024.0);
  const auto plan = tessera::make_checkpoint_policy("budget", options)->plan(infos);
  EXPECT_TRUE(plan.fits) << plan.text;
  EXPECT_GE(plan.num_checkpointed(), 1u) << plan.text;
  EXPECT_LT(plan.num_checkpointed(), infos.size()) << plan.text;
  // The plan applies and renders the same values as without checkpointing.
  std::vector<std::string> chosen;
  for (size_t i = 0; i < infos.size(); ++i)
    if (plan.is_checkpointed(i)) chosen.push_back(infos[i].name);
  const StepContext ctx{0, 3, true};
  const auto plain = model->render(rays, ctx).rgb.detach();
  model->set_checkpointed_segments(chosen);
  EXPECT_TRUE(bitwise_equal(plain, model->render(rays, ctx).rgb.detach()));
}

// Peak activation memory of one forward + backward on the classic NeRF (the paper's 8 x 256 trunk
// with the skip at layer 4, 128-wide colour head) at 4096 rays: every segment checkpointed must
// need less than 0.6x of the peak without checkpointing. 16 samples per ray instead of 64 keep
// the test at ~1 GiB; every activation scales with the sample count, so the ratio does not.
TEST(NerfMlpMemory, CheckpointingCutsPeakBelowSixTenths) {
  tessera::install_counting_cpu_allocator();
  nerf::NerfMlpOptions paper;
  paper.width = 256;
  paper.color_width = 128;
  paper.samples_per_ray = 16;
  nerf::NerfMlp model(paper, scene_context(), 7);
  const auto rays = sphere_rays(32, 4);  // 4 cameras x 32 x 32 = 4096 rays
  ASSERT_EQ(rays.origins.size(0), 4096);
  const torch::Device cpu(torch::kCPU);
  auto peak_of_step = [&](bool checkpointed) {
    model.set_checkpointed_segments(checkpointed ? model.segment_names() : std::vector<std::string>{});
    for (auto& p : all_params(model)) p.mutable_grad() = torch::Tensor();
    const int64_t start = tessera::memory_stats(cpu).current_bytes;
    tessera::reset_peak(cpu);
    loss_of(model.render(rays, StepContext{0, 1, true}), rays).backward();
    const int64_t peak = tessera::memory_stats(cpu).peak_bytes - start;
    for (auto& p : all_params(model)) p.mutable_grad() = torch::Tensor();
    return peak;
  };
  const int64_t none = peak_of_step(false), all = peak_of_step(true);
  const double ratio = static_cast<double>(all) / static_cast<double>(none);
  std::printf("classic NeRF, 4096 rays x 16 samples: peak none %s, all segments %s, ratio %.3f\n",
              tessera::format_bytes(none).c_str(), tessera::format_bytes(all).c_str(), ratio);
  RecordProperty("peak_bytes_none", std::to_string(none));
  RecordProperty("peak_bytes_checkpointed", std::to_string(all));
  EXPECT_GT(none, int64_t{100} << 20);  // the activations were counted
  EXPECT_LT(ratio, 0.6);
}

INSTANTIATE_TEST_SUITE_P(Both, NerfModels, ::testing::Values("nerf-hash", "nerf-mlp", kHashProposal),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) if (c == '-' || c == '+') c = '_';
                           return n;
                         });

}  // namespace
