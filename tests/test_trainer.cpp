// RayTrainer and RaySampler under mpiexec -n 1, 2, 3: batches as a pure function of (seed, step),
// N ranks equal 1 rank, accumulation equals a large batch, agreed skip-steps, and run output.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "distributed/mpi_communicator.h"
#include "framework/budget.h"
#include "framework/data/scene.h"
#include "framework/snapshot.h"
#include "models/nerf/ray_trainer.h"
#include "framework/trainer_run.h"
#include "tests/cuda_skip.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using namespace models::nerf;  // the ray family under test

distributed::Communicator& world() { return test::cpu_world(); }

// "color = MLP(ray direction)": 3 -> 16 -> 3 with a sigmoid; deterministic init.
class DirectionMlp : public Model {
 public:
  explicit DirectionMlp(torch::Device device = torch::kCPU) {
    auto grid = [](int64_t rows, int64_t cols, double phase) {
      return torch::sin(torch::arange(rows * cols, torch::kFloat32).reshape({rows, cols}) * 0.7 +
                        phase) * 0.8;
    };
    w1_ = grid(3, 16, 0.1).to(device).requires_grad_();
    b1_ = grid(1, 16, 0.5).reshape({16}).mul(0.3).to(device).requires_grad_();
    w2_ = grid(16, 3, 1.3).to(device).requires_grad_();
    b2_ = torch::zeros({3}).to(device).requires_grad_();
  }
  std::string name() const override { return "direction_mlp"; }
  std::vector<ParamGroup> parameter_groups() override {
    return {{"hidden", {w1_, b1_}}, {"out", {w2_, b2_}}};
  }
  RenderResult render(const RayBatch& rays, const StepContext&) override {
    RenderResult r;
    r.rgb = torch::sigmoid(torch::tanh(rays.directions.matmul(w1_) + b1_).matmul(w2_) + b2_);
    r.opacity = torch::ones({rays.directions.size(0)}, rays.directions.options());
    r.depth = torch::zeros({rays.directions.size(0)}, rays.directions.options());
    return r;
  }
  std::vector<torch::Tensor> flat() { return {w1_, b1_, w2_, b2_}; }
  torch::Tensor concat() {
    std::vector<torch::Tensor> v;
    for (auto& t : flat()) v.push_back(t.detach().reshape({-1}));
    return torch::cat(v);
  }

 private:
  torch::Tensor w1_, b1_, w2_, b2_;
};

data::Camera camera(int i) {
  data::Camera c;
  c.width = 16, c.height = 12;  // SSIM needs at least 11x11
  c.fx = 14.0, c.fy = 13.0, c.cx = 8.0 + 0.3 * i, c.cy = 6.0;
  const double a = 0.4 * i;  // rotation about y
  c.camera_to_world = {std::cos(a), 0, std::sin(a), 0.1 * i, 0, 1, 0, -0.2 * i,
                       -std::sin(a), 0, std::cos(a), 1.0, 0, 0, 0, 1};
  c.split = i == 3 ? data::Split::Val : data::Split::Train;
  return c;
}

constexpr int64_t kPixels = 16 * 12;  // per image

// A 4-image dataset (3 train, 1 val) with alpha, written by rank 0 into a shared temp dir.
class TrainerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_shared_temp_dir("tessera-trainer", [](const std::string& dir) {
      data::SceneMeta meta;
      meta.near = 0.1, meta.far = 4.0, meta.background = {0.2, 0.4, 0.6};
      meta.scene_bounds = {-1, -1, -1, 1, 1, 1};
      std::vector<data::Camera> cams;
      for (int i = 0; i < 4; ++i) cams.push_back(camera(i));
      data::SceneWriter writer(dir + "/scene.h5", meta, cams, true);
      for (int i = 0; i < 4; ++i) {
        auto idx = torch::arange(kPixels * 3, torch::kInt64).reshape({12, 16, 3});
        writer.write_image(i, ((idx * (7 + i) + 13 * i) % 256).to(torch::kUInt8),
                           ((torch::arange(kPixels, torch::kInt64).reshape({12, 16}) * 31 + i) % 256)
                               .to(torch::kUInt8));
      }
      writer.commit();
    });
    scene_ = std::make_unique<data::SceneReader>(dir_ + "/scene.h5");
  }
  static void TearDownTestSuite() {
    scene_.reset();
    test::remove_shared_temp_dir(dir_);
  }
  static RayTrainerOptions options() {
    RayTrainerOptions o;
    o.steps = 5;
    o.nerf.rays_per_step = 48;
    o.nerf.lr_schedule = "constant";
    o.nerf.background = "dataset";
    o.seed = 7;
    o.nerf.lr = 1e-2;
    o.nerf.adam_eps = 1e-8;
    o.log_every = 0;
    o.progress = false;
    return o;
  }
  static std::string dir_;
  static std::unique_ptr<data::SceneReader> scene_;
};
std::string TrainerTest::dir_;
std::unique_ptr<data::SceneReader> TrainerTest::scene_;

// Elements outside |got - want| <= rtol * max(|want|, 1e-2); the wrong ones are printed. The floor
// covers parameters that cancelled to near zero from O(0.1) values: float32 reassociation leaves
// them an absolute error of ~1e-9 (e.g. a bias of 1.5e-4 off by 1.4e-9 over 5 Adam steps).
int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& want, double rtol) {
  const auto g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
  const torch::Tensor bad = ((g - w).abs() > rtol * w.abs().clamp_min(1e-2)).nonzero().reshape({-1});
  for (int64_t i = 0; i < bad.size(0); ++i) {
    const int64_t k = bad[i].item<int64_t>();
    std::fprintf(stderr, "[rank %d] element %lld: got %.9g want %.9g\n", world().rank(),
                 static_cast<long long>(k), g[k].item<double>(), w[k].item<double>());
  }
  return bad.size(0);
}

TEST_F(TrainerTest, BatchIsPureFunctionOfSeedAndStep) {
  RaySamplerOptions so;
  so.rays_per_step = 50;
  so.seed = 3;
  RaySampler a(*scene_, so, [](int64_t) { return 1.0; });
  RaySampler b(*scene_, so, [](int64_t) { return 1.0; });
  EXPECT_EQ(a.num_pixels(), 3 * kPixels);
  // Out of order on b: history must not matter.
  const torch::Tensor b7 = b.global_batch(7), b0 = b.global_batch(0);
  EXPECT_TRUE(torch::equal(a.global_batch(0), b0));
  EXPECT_TRUE(torch::equal(a.global_batch(7), b7));
  EXPECT_FALSE(torch::equal(a.global_batch(0), a.global_batch(1)));
  // Same on every rank (bitwise).
  const torch::Tensor all = world().allgather(a.global_batch(3));
  for (int r = 0; r < world().size(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0]));
  // The slices of any world size concatenate to the global batch, with matching ray ids.
  for (int n = 1; n <= 4; ++n) {
    std::vector<torch::Tensor> ids, targets;
    for (int r = 0; r < n; ++r) {
      RayBatch rb = a.rank_batch(3, r, n, torch::kCPU);
      ids.push_back(rb.ray_ids);
      targets.push_back(rb.target_rgb);
    }
    EXPECT_TRUE(torch::equal(torch::cat(ids), torch::arange(50, torch::kInt64))) << n;
    EXPECT_TRUE(torch::equal(torch::cat(targets),
                             a.rays_for(a.global_batch(3), 0, torch::kCPU).target_rgb)) << n;
  }
  // Within an epoch of rate 1 (11 steps of 50 of 576 pixels) no pixel repeats.
  std::set<int64_t> seen;
  for (int64_t s = 0; s < 4; ++s)
    for (int64_t i = 0; i < 50; ++i) seen.insert(a.global_batch(s)[i].item<int64_t>());
  EXPECT_EQ(seen.size(), 200u);
}

// Random backgrounds (datasets with alpha): one color per ray, a pure function of (seed, step,
// ray id) whatever the split across ranks, composited into the target the model is compared with.
TEST_F(TrainerTest, RandomBackgroundsPerRayAgreeAcrossSplits) {
  RaySamplerOptions so;
  so.rays_per_step = 50;
  so.seed = 3;
  so.random_background = true;
  RaySampler a(*scene_, so, [](int64_t) { return 1.0; });
  const RayBatch whole = a.rank_batch(5, 0, 1, torch::kCPU);
  ASSERT_EQ(whole.background.sizes(), (std::vector<int64_t>{50, 3}));
  EXPECT_GE(whole.background.min().item<float>(), 0.0f);
  EXPECT_LT(whole.background.max().item<float>(), 1.0f);
  EXPECT_GT(whole.background.std().item<float>(), 0.2f) << "colors spread over [0, 1)";
  for (int n = 2; n <= 3; ++n) {
    std::vector<torch::Tensor> bgs;
    for (int r = 0; r < n; ++r) bgs.push_back(a.rank_batch(5, r, n, torch::kCPU).background);
    EXPECT_TRUE(torch::equal(torch::cat(bgs), whole.background)) << n << " ranks";
  }
  EXPECT_FALSE(torch::equal(a.rank_batch(6, 0, 1, torch::kCPU).background, whole.background));
  // The target is the pixel over its own ray's color.
  const torch::Tensor ids = a.global_batch(5);
  const RayBatch plain = a.rays_for(ids, 0, torch::kCPU);  // no step: the dataset's background
  EXPECT_EQ(plain.background.dim(), 1);
  for (int64_t i = 0; i < 50; i += 7) {
    const int64_t id = ids[i].item<int64_t>();
    const int64_t image = id / kPixels, y = (id % kPixels) / 16, x = id % 16;
    const torch::Tensor rgb = scene_->read_image(image)[y][x].to(torch::kFloat32) / 255.0f;
    const float alpha = scene_->read_alpha(image)[y][x].item<uint8_t>() / 255.0f;
    EXPECT_TRUE(torch::allclose(whole.target_rgb[i],
                                rgb * alpha + whole.background[i] * (1 - alpha), 1e-6, 1e-6))
        << "ray " << i;
  }
}

// Pixel jitter: each training ray passes through a random point of its own pixel, a pure
// function of (seed, step, ray id) whatever the split across ranks; without a step, the center.
TEST_F(TrainerTest, JitteredRaysStayInsideTheirPixelAndAgreeAcrossSplits) {
  RaySamplerOptions so;
  so.rays_per_step = 60;
  so.seed = 3;
  so.pixel_jitter = true;
  RaySampler a(*scene_, so, [](int64_t) { return 1.0; });
  const torch::Tensor ids = a.global_batch(4);
  const RayBatch whole = a.rank_batch(4, 0, 1, torch::kCPU);
  const RayBatch centers = a.rays_for(ids, 0, torch::kCPU);  // no step: pixel centers
  std::vector<double> fx, fy;  // where each jittered ray crosses its pixel, in [0, 1)^2
  for (int64_t i = 0; i < 60; ++i) {
    const int64_t id = ids[i].item<int64_t>();
    const int64_t image = id / kPixels, y = (id % kPixels) / 16, x = id % 16;
    const data::Camera c = scene_->cameras()[a.train_indices()[image]];
    const auto& m = c.camera_to_world;
    auto pixel_of = [&](const torch::Tensor& d) {  // world direction -> pixel coordinates
      double cam[3];
      for (int k = 0; k < 3; ++k)
        cam[k] = m[0 + k] * d[0].item<double>() + m[4 + k] * d[1].item<double>() + m[8 + k] * d[2].item<double>();
      return std::pair<double, double>{c.fx * cam[0] / cam[2] + c.cx, c.fy * cam[1] / cam[2] + c.cy};
    };
    const auto [cx, cy] = pixel_of(centers.directions[i]);
    EXPECT_NEAR(cx, x + 0.5, 1e-4) << "ray " << i;
    EXPECT_NEAR(cy, y + 0.5, 1e-4) << "ray " << i;
    const auto [jx, jy] = pixel_of(whole.directions[i]);
    EXPECT_GE(jx, x - 1e-4) << "ray " << i;
    EXPECT_LT(jx, x + 1 + 1e-4) << "ray " << i;
    EXPECT_GE(jy, y - 1e-4) << "ray " << i;
    EXPECT_LT(jy, y + 1 + 1e-4) << "ray " << i;
    fx.push_back(jx - x), fy.push_back(jy - y);
    EXPECT_TRUE(torch::equal(whole.origins[i], centers.origins[i]));
  }
  // Spread over the pixel, not a fixed offset: both halves of each axis are hit.
  const auto below = [](const std::vector<double>& v) {
    return std::count_if(v.begin(), v.end(), [](double f) { return f < 0.5; });
  };
  EXPECT_GT(below(fx), 15);
  EXPECT_LT(below(fx), 45);
  EXPECT_GT(below(fy), 15);
  EXPECT_LT(below(fy), 45);
  for (int n = 2; n <= 3; ++n) {
    std::vector<torch::Tensor> dirs;
    for (int r = 0; r < n; ++r) dirs.push_back(a.rank_batch(4, r, n, torch::kCPU).directions);
    EXPECT_TRUE(torch::equal(torch::cat(dirs), whole.directions)) << n << " ranks";
  }
  EXPECT_TRUE(torch::equal(a.rank_batch(4, 0, 1, torch::kCPU).directions, whole.directions));
  // Another step draws other points, even for the same pixels.
  EXPECT_FALSE(torch::equal(a.rays_for(ids, 0, torch::kCPU, 5).directions, whole.directions));
}

TEST_F(TrainerTest, LowRateDrawsFromSubset) {
  RaySamplerOptions so;
  so.rays_per_step = 10;
  RaySampler s(*scene_, so, [](int64_t step) { return step < 3 ? 0.25 : 0.1; });
  const SamplingEpoch e0 = s.epoch_of(0);
  EXPECT_EQ(e0.pool, 144);  // ceil(0.25 * 576)
  EXPECT_EQ(e0.steps, 14);   // floor(144 / 10): the last partial batch is dropped
  EXPECT_EQ(s.epoch_of(13).index, 0);
  const SamplingEpoch e1 = s.epoch_of(14);  // rate re-read at the epoch boundary (step 14)
  EXPECT_EQ(e1.index, 1);
  EXPECT_EQ(e1.pool, 58);  // ceil(0.1 * 576)
  EXPECT_EQ(e1.steps, 5);
  EXPECT_EQ(s.epoch_of(19).first_step, 19);
  std::set<int64_t> pool;
  for (int64_t t = 0; t < 14; ++t)
    for (int64_t i = 0; i < 10; ++i) pool.insert(s.global_batch(t)[i].item<int64_t>());
  EXPECT_EQ(pool.size(), 140u);  // 140 distinct pixels of the 144-pixel pool
  std::set<int64_t> pool1;
  for (int64_t t = 14; t < 19; ++t)
    for (int64_t i = 0; i < 10; ++i) pool1.insert(s.global_batch(t)[i].item<int64_t>());
  EXPECT_EQ(pool1.size(), 50u);
  EXPECT_NE(pool1, pool);
}

TEST_F(TrainerTest, PixelRayMatchesHandComputation) {
  data::Camera c;
  c.fx = 2, c.fy = 4, c.cx = 1, c.cy = 1, c.width = 2, c.height = 2;
  // Rotation of 90 degrees about z, translation (1, 2, 3).
  c.camera_to_world = {0, -1, 0, 1, 1, 0, 0, 2, 0, 0, 1, 3, 0, 0, 0, 1};
  torch::Tensor o, d;
  pixel_rays({c}, torch::zeros({1}, torch::kInt64), torch::ones({1}, torch::kInt64),
             torch::zeros({1}, torch::kInt64), &o, &d);
  // Camera direction ((1.5 - 1) / 2, (0.5 - 1) / 4, 1) = (0.25, -0.125, 1) -> world (0.125, 0.25, 1).
  const double n = std::sqrt(0.125 * 0.125 + 0.25 * 0.25 + 1.0);
  const torch::Tensor want = torch::tensor({0.125 / n, 0.25 / n, 1.0 / n}, torch::kFloat32);
  EXPECT_TRUE(torch::allclose(d[0], want, 1e-6, 1e-7)) << d;
  EXPECT_TRUE(torch::equal(o[0], torch::tensor({1.0f, 2.0f, 3.0f})));
  // Target compositing over the background with alpha.
  RaySamplerOptions so;
  so.rays_per_step = 4;
  RaySampler s(*scene_, so, [](int64_t) { return 1.0; });
  const RayBatch b = s.rays_for(torch::tensor({int64_t{5}}), 0, torch::kCPU);  // image 0, y 0, x 5
  const torch::Tensor rgb = scene_->read_image(0)[0][5].to(torch::kFloat32) / 255.0f;
  const float a = scene_->read_alpha(0)[0][5].item<uint8_t>() / 255.0f;
  const torch::Tensor bg = torch::tensor({0.2f, 0.4f, 0.6f});
  EXPECT_TRUE(torch::allclose(b.target_rgb[0], rgb * a + bg * (1 - a), 1e-6, 1e-6));
  EXPECT_FLOAT_EQ(b.near[0].item<float>(), 0.1f);
  EXPECT_FLOAT_EQ(b.far[0].item<float>(), 4.0f);
}

// The model's context carries the box of all camera centers (nerf-hash keeps them uncontracted).
TEST_F(TrainerTest, ModelContextHoldsTheBoxOfTheCameraCenters) {
  const ModelContext context = ModelContext::from_scene(*scene_, torch::kCPU);
  std::array<double, 6> want{};
  for (size_t i = 0; i < scene_->cameras().size(); ++i)
    for (int a = 0; a < 3; ++a) {
      const double c = scene_->cameras()[i].camera_to_world[4 * a + 3];
      want[a] = i == 0 ? c : std::min(want[a], c);
      want[a + 3] = i == 0 ? c : std::max(want[a + 3], c);
    }
  EXPECT_EQ(context.camera_bounds, want);
  EXPECT_LT(want[0], want[3]) << "the fixture's cameras are spread out";
  EXPECT_EQ(context.scene_bounds, scene_->meta().scene_bounds);
  // The pixel footprint: the median over the cameras of distance to the box's center / focal.
  const auto& b = scene_->meta().scene_bounds;
  std::vector<double> footprints;
  for (const data::Camera& camera : scene_->cameras()) {
    double d2 = 0;
    for (int a = 0; a < 3; ++a) {
      const double d = camera.camera_to_world[4 * a + 3] - 0.5 * (b[a] + b[a + 3]);
      d2 += d * d;
    }
    footprints.push_back(std::sqrt(d2 / (camera.fx * camera.fy)));
  }
  std::sort(footprints.begin(), footprints.end());
  EXPECT_NEAR(context.pixel_footprint, footprints[footprints.size() / 2], 1e-12);
  EXPECT_GT(context.pixel_footprint, 0.0);
}

TEST_F(TrainerTest, NRanksEqualOneRank) {
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, options());
  for (int64_t t = 0; t < 5; ++t) trainer.train_step(t);
  // The 1-rank reference, run locally on every rank over MPI_COMM_SELF.
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  DirectionMlp reference;
  RayTrainer ref_trainer(*test::g_context, self, reference, *scene_, options());
  for (int64_t t = 0; t < 5; ++t) ref_trainer.train_step(t);
  const torch::Tensor got = model.concat(), want = reference.concat();
  EXPECT_FALSE(torch::equal(got, DirectionMlp().concat()));  // it trained
  EXPECT_EQ(count_wrong(got, want, 1e-6), 0) << (got - want).abs().max();
  const torch::Tensor all = world().allgather(got);
  for (int r = 0; r < world().size(); ++r) EXPECT_TRUE(torch::equal(all[r], got)) << r;
}

// The trainer on CUDA (batches, loss, NCCL gradient sync, Adam on the device) follows the same
// path as on the CPU: the same losses and parameters to float32 reassociation.
TEST_F(TrainerTest, CudaTrainsAsOnTheCpu) {
  TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available() && distributed::nccl_available(),
                           "needs a CUDA device and an NCCL build");
  if (!test::g_context->one_cuda_device_per_rank())
    GTEST_SKIP() << "fewer CUDA devices than ranks on this node";
  const torch::Device cuda(torch::kCUDA, test::g_context->cuda_device_index());
  auto nccl = distributed::make_communicator(*test::g_context, "nccl", cuda);
  DirectionMlp on_gpu(cuda), on_cpu;
  RayTrainerOptions k2 = options();
  k2.nerf.micro_batches = 2;
  RayTrainer gpu(*test::g_context, *nccl, on_gpu, *scene_, k2);
  RayTrainer cpu(*test::g_context, world(), on_cpu, *scene_, k2);
  for (int64_t t = 0; t < 5; ++t) {
    const StepRecord g = gpu.train_step(t), c = cpu.train_step(t);
    EXPECT_NEAR(g.loss, c.loss, 1e-5 * c.loss) << "step " << t;
  }
  EXPECT_TRUE(on_gpu.concat().is_cuda());
  EXPECT_FALSE(torch::equal(on_cpu.concat(), DirectionMlp().concat()));  // it trained
  EXPECT_EQ(count_wrong(on_gpu.concat().cpu(), on_cpu.concat(), 1e-4), 0);
}

TEST_F(TrainerTest, AccumulationEqualsLargeBatch) {
  RayTrainerOptions k4 = options();
  k4.nerf.micro_batches = 4;
  DirectionMlp a, b;
  RayTrainer ta(*test::g_context, world(), a, *scene_, options());
  RayTrainer tb(*test::g_context, world(), b, *scene_, k4);
  for (int64_t t = 0; t < 5; ++t) {
    const StepRecord ra = ta.train_step(t), rb = tb.train_step(t);
    EXPECT_NEAR(ra.loss, rb.loss, 1e-6 * ra.loss);  // float32 sums, reassociated
  }
  EXPECT_EQ(count_wrong(b.concat(), a.concat(), 1e-6), 0) << (b.concat() - a.concat()).abs().max();
}

TEST_F(TrainerTest, AgreementAndAgreedSkipStep) {
  RayTrainerOptions o = options();
  o.check_agreement = true;
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
  const int last = world().size() - 1;
  trainer.loss_hook = [&](int64_t step, int64_t, torch::Tensor& loss) {
    if (step == 2 && world().rank() == last) loss = loss * std::nan("");
  };
  for (int64_t t = 0; t < 2; ++t) EXPECT_FALSE(trainer.train_step(t).skipped);
  const torch::Tensor before = model.concat();
  const StepRecord r = trainer.train_step(2);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(torch::equal(model.concat(), before));
  EXPECT_FALSE(trainer.train_step(3).skipped);
  EXPECT_EQ(trainer.loss_scaler().skipped_steps(), 1);
  const torch::Tensor all = world().allgather(model.concat());
  for (int r2 = 0; r2 < world().size(); ++r2) EXPECT_TRUE(torch::equal(all[r2], all[0]));
}

// fp16 needs CUDA; bf16 autocast runs on the CPU (test_nerf_invariants trains with it).
TEST_F(TrainerTest, Fp16OnCpuAndUnknownPrecisionsAreUserErrors) {
  for (const char* p : {"fp16", "fp64", "int8"}) {
    RayTrainerOptions o = options();
    o.precision = p;
    DirectionMlp model;
    EXPECT_THROW(RayTrainer(*test::g_context, world(), model, *scene_, o), UserError) << p;
  }
}

TEST_F(TrainerTest, RunWritesMetricsAndRenders) {
  RayTrainerOptions o = options();
  o.steps = 4;
  o.log_every = 2;
  o.eval_every = 2;
  o.out_dir = dir_ + "/run";
  o.progress = true;  // the progress line appears in the test log
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
  const TrainSummary s = trainer.run();
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.eval.items, 1);
  EXPECT_GT(s.eval.value("psnr"), 0.0);
  EXPECT_GT(s.work_per_s, 0.0);
  std::fprintf(stderr, "[rank %d] test model: %.0f rays/s on %d ranks\n", world().rank(),
               s.work_per_s, world().size());
  world().barrier();
  if (world().rank() != 0) return;
  const auto lines = test::lines_of(test::read_file(o.out_dir + "/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);  // steps 2 and 4, then the summary
  for (size_t i = 0; i < 2; ++i) {
    const auto j = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(j.at("step").get<int64_t>(), 2 * int64_t(i + 1));
    for (const char* key : {"loss", "lr", "sampling_rate", "rays_per_s", "peak_mem_bytes", "psnr",
                            "eval_psnr", "eval_ssim"})
      EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_TRUE(nlohmann::json::parse(lines[2]).at("summary").get<bool>());
  for (const char* name : {"step-00000002-view-003.png", "step-00000004-view-003.png"})
    EXPECT_TRUE(std::filesystem::exists(o.out_dir + "/renders/" + name)) << name;
}

// The eval's views are spread over the split, not its first ones: with 8 val views (cameras
// 1-8) and eval.max_views 2 it scores cameras 1 and 5 (val views 0 and 4 of 8), as the renders'
// names show; the first two would be cameras 1 and 2.
TEST_F(TrainerTest, EvalViewsAreSpreadOverTheSplit) {
  const std::string dir = test::make_shared_temp_dir("tessera-trainer-spread", [](const std::string& d) {
    data::SceneMeta meta;
    meta.near = 0.1, meta.far = 4.0, meta.background = {0.2, 0.4, 0.6};
    meta.scene_bounds = {-1, -1, -1, 1, 1, 1};
    std::vector<data::Camera> cams;
    for (int i = 0; i < 9; ++i) {
      cams.push_back(camera(i));
      cams.back().split = i == 0 ? data::Split::Train : data::Split::Val;
    }
    data::SceneWriter writer(d + "/scene.h5", meta, cams, false);
    for (int i = 0; i < 9; ++i)
      writer.write_image(i, ((torch::arange(kPixels * 3, torch::kInt64).reshape({12, 16, 3}) *
                              (7 + i)) % 256).to(torch::kUInt8));
    writer.commit();
  });
  {
    data::SceneReader scene(dir + "/scene.h5");
    RayTrainerOptions o = options();
    o.steps = 2;
    o.eval_max_views = 2;
    o.out_dir = dir + "/run";
    DirectionMlp model;
    RayTrainer trainer(*test::g_context, world(), model, scene, o);
    const TrainSummary s = trainer.run();
    EXPECT_EQ(s.eval.items, 2);
    world().barrier();
    if (world().rank() == 0) {
      std::vector<std::string> renders;
      for (const auto& entry : std::filesystem::directory_iterator(o.out_dir + "/renders"))
        if (entry.path().filename().string().rfind("step-", 0) == 0)
          renders.push_back(entry.path().filename().string());
      std::sort(renders.begin(), renders.end());
      EXPECT_EQ(renders, (std::vector<std::string>{"step-00000002-view-001.png",
                                                   "step-00000002-view-005.png"}));
    }
  }
  test::remove_shared_temp_dir(dir);
}

// Invariant 4: 6 steps straight equal 3 steps, a snapshot, and 3 more steps in a fresh RayTrainer
// and model that load it: bitwise, at the same world size.
TEST_F(TrainerTest, ResumeIsExact) {
  RayTrainerOptions o = options();
  o.steps = 6;
  o.out_dir = dir_ + "/resume-straight";
  DirectionMlp straight;
  {
    RayTrainer t(*test::g_context, world(), straight, *scene_, o);
    const TrainSummary s = t.run();
    EXPECT_TRUE(s.finished);
    EXPECT_EQ(s.last_snapshot, snapshot_path(o.out_dir + "/snapshots", 6));
  }
  o.out_dir = dir_ + "/resume-split";
  o.stop_after = 3;
  std::string snapshot;
  {
    DirectionMlp first_half;
    RayTrainer t(*test::g_context, world(), first_half, *scene_, o);
    const TrainSummary s = t.run();
    EXPECT_FALSE(s.finished);
    EXPECT_EQ(s.steps, 3);
    snapshot = s.last_snapshot;
    EXPECT_FALSE(torch::equal(first_half.concat(), straight.concat()));
  }
  ASSERT_EQ(snapshot, snapshot_path(o.out_dir + "/snapshots", 3));
  EXPECT_EQ(validate_snapshot(snapshot), "");
  o.stop_after = -1;
  DirectionMlp resumed;
  RayTrainer t(*test::g_context, world(), resumed, *scene_, o);
  t.load_snapshot(snapshot);
  EXPECT_EQ(t.next_step(), 3);
  const TrainSummary s = t.run();
  EXPECT_TRUE(s.finished);
  EXPECT_TRUE(torch::equal(resumed.concat(), straight.concat()))
      << "max abs diff " << (resumed.concat() - straight.concat()).abs().max().item<double>();
  // The resumed run's metrics keep the records up to step 3 and continue after it.
  world().barrier();
  if (world().rank() == 0) {
    const SnapshotReader reader(s.last_snapshot);
    EXPECT_EQ(reader.meta().step, 6);
    EXPECT_EQ(reader.meta().model, "direction_mlp");
    EXPECT_EQ(reader.meta().world_size, world().size());
  }
}

// Resuming at another world size: a snapshot written by N ranks continues on one rank (over
// MPI_COMM_SELF) to the parameters of N ranks straight, within float reassociation.
TEST_F(TrainerTest, ResumeAtAnotherWorldSize) {
  RayTrainerOptions o = options();
  o.steps = 6;
  o.out_dir = dir_ + "/resume-resize";
  o.stop_after = 3;
  DirectionMlp straight, first_half;
  std::string snapshot;
  {
    RayTrainer t(*test::g_context, world(), first_half, *scene_, o);
    snapshot = t.run().last_snapshot;
  }
  {
    RayTrainerOptions plain = options();
    plain.steps = 6;
    RayTrainer t(*test::g_context, world(), straight, *scene_, plain);
    for (int64_t step = 0; step < 6; ++step) t.train_step(step);
  }
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  RayTrainerOptions plain = options();
  plain.steps = 6;
  DirectionMlp resumed;
  RayTrainer t(*test::g_context, self, resumed, *scene_, plain);
  t.load_snapshot(snapshot);
  for (int64_t step = t.next_step(); step < 6; ++step) t.train_step(step);
  EXPECT_EQ(count_wrong(resumed.concat(), straight.concat(), 1e-6), 0);
}

// ---- Budgets (framework/budget.h): train.epochs and the time budget on a clock of the test's

// train.epochs replaces train.steps by passes over the train pixels, and the learning-rate
// schedule ends at the planned step.
TEST_F(TrainerTest, EpochsSetTheStepsAndTheSchedules) {
  RayTrainerOptions o = options();
  o.steps = 1000;
  o.epochs = 2.6;
  o.nerf.lr_schedule = "exponential";
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
  // 3 train views of 16x12 pixels, 48 rays a step: ceil(2.6 * 576 / 48) = ceil(31.2).
  EXPECT_EQ(trainer.run_driver().planned_steps(), 32);
  const TrainSummary s = trainer.run();
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.steps, 32);
  EXPECT_EQ(trainer.lr_options().total_steps, 32);
  EXPECT_EQ(trainer.options().sampling.total_steps, 32);
}

// A clock the test moves: each step takes `step_s(step)` seconds of it, the rest no time.
struct TestClock {
  double now = 0.0;
  std::function<double(int64_t)> step_s = [](int64_t) { return 1.0; };
};

RayTrainerOptions budget_options(RayTrainerOptions o, TestClock& clock) {
  o.steps = 1000;  // the cap: far more than 100 s of 1 s steps
  o.time_budget_s = 100.0;
  o.nerf.lr_schedule = "exponential";
  o.eval_max_views = 1;
  o.eval_train_views = 0;
  o.clock = [&clock] { return clock.now; };
  // The forecast from eval_cost: these models' evals take none of the test's time, so a probe
  // would forecast nothing (TimeBudgetForecastsTheEvalFromATimedSampleOfIt turns it on).
  o.eval_probe = false;
  return o;
}

void tick_per_step(RayTrainer& trainer, TestClock& clock) {
  trainer.loss_hook = [&clock](int64_t step, int64_t, torch::Tensor&) {
    clock.now += clock.step_s(step);
  };
}

// The steps that fit: planned after 10 steps from 1 s per step, keeping the forecast of the
// final eval and the budget's margin; the schedules end there.
TEST_F(TrainerTest, TimeBudgetPlansTheStepsThatFit) {
  TestClock clock;
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, budget_options(options(), clock));
  tick_per_step(trainer, clock);
  const double eval_s = trainer.eval_cost({3});  // 1 s per cost unit
  const int64_t expected =
      10 + static_cast<int64_t>(std::floor((1.0 - kBudgetMargin) * 100.0 - 10.0 - eval_s));
  const TrainSummary s = trainer.run();
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.steps, expected);
  EXPECT_EQ(trainer.lr_options().total_steps, expected);
  EXPECT_LE(clock.now, 100.0);
}

// Steps that become 10x slower than planned: the last guard ends the run before the step that
// would pass the budget, as finished (its final eval and snapshot written).
TEST_F(TrainerTest, TimeBudgetEndsARunWhoseStepsSlowDown) {
  TestClock clock;
  clock.step_s = [](int64_t step) { return step < 40 ? 1.0 : 10.0; };
  RayTrainerOptions o = budget_options(options(), clock);
  o.out_dir = dir_ + "/budget-slow";
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
  tick_per_step(trainer, clock);
  const TrainSummary s = trainer.run();
  EXPECT_TRUE(s.finished);
  // 40 steps of 1 s and 5 of 10 s: 90 s; a sixth slow step would end at 100 s, past the
  // budget once the eval is kept.
  EXPECT_EQ(s.steps, 45);
  EXPECT_LE(clock.now, 100.0);
  EXPECT_EQ(s.last_snapshot, snapshot_path(o.out_dir + "/snapshots", 45));
}

// A budget whose final eval weighs: 64 cost units (a val and a train view of 192 pixels, 6 rays a
// step), against `budget_s`.
RayTrainerOptions eval_heavy_budget(RayTrainerOptions o, TestClock& clock, double budget_s) {
  o = budget_options(o, clock);
  o.time_budget_s = budget_s;
  o.nerf.rays_per_step = 6;
  o.eval_train_views = 1;
  return o;
}

// The first steps 3x slower than the rest (a NeRF before it learns opacity renders every
// marched sample): at their speed the final eval's forecast (64 cost units: 2 views of 192
// pixels, 6 rays a step) is 192 s, more than the budget left at the first plan. That forecast
// does not end the run; the second plan prices it from the steps after the first plan.
TEST_F(TrainerTest, TimeBudgetFirstStepsDoNotEndTheRunOnTheirEvalForecast) {
  TestClock clock;
  clock.step_s = [](int64_t step) { return step < 15 ? 3.0 : 1.0; };
  const RayTrainerOptions o = eval_heavy_budget(options(), clock, 200.0);
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
  tick_per_step(trainer, clock);
  const double eval_cost = trainer.eval_cost({3}) + trainer.eval_cost({0});
  ASSERT_DOUBLE_EQ(eval_cost, 64.0);
  const TrainSummary s = trainer.run();
  EXPECT_TRUE(s.finished);
  // Step 10: 30 s elapsed, 3 s a step. Kept, the forecast (192 s) leaves nothing of 190 s: the
  // run would end at step 11. Deferred, the plan is 60 steps, planned again at 59 from steps
  // 10-58 (1.2 s a step): 78 steps, the eval forecast at 77 s. At 1 s a unit, with the eval's
  // true 64 s, the run ends within the budget.
  EXPECT_EQ(s.steps, 78);
  EXPECT_LE(clock.now + eval_cost * 1.0, o.time_budget_s);
}

// A final eval that cannot fit the budget (64 s of a 60 s budget) ends the run at the second
// plan, after the steps that fit without it, with a warning; not at the first plan's step 11.
TEST_F(TrainerTest, TimeBudgetWithAnEvalLongerThanItTrainsTheStepsThatFitWithoutIt) {
  TestClock clock;
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, eval_heavy_budget(options(), clock, 60.0));
  tick_per_step(trainer, clock);
  const TrainSummary s = trainer.run();
  EXPECT_TRUE(s.finished);
  // Step 10: without the eval, 10 + floor(57 - 10) = 57 steps, planned again at step 56,
  // where the eval (64 s) does not fit the 1 s left: the run ends there.
  EXPECT_EQ(s.steps, 56);
}

// A model whose eval renders take `per_ray` seconds of the test's clock for each ray.
class EvalTimedMlp : public DirectionMlp {
 public:
  EvalTimedMlp(TestClock& clock, double per_ray) : clock_(clock), per_ray_(per_ray) {}
  RenderResult render(const RayBatch& rays, const StepContext& context) override {
    if (!context.training) clock_.now += per_ray_ * static_cast<double>(rays.origins.size(0));
    return DirectionMlp::render(rays, context);
  }

 private:
  TestClock& clock_;
  double per_ray_;
};

// The final eval's forecast from a probe: the run renders a step's worth of the eval's rays at
// each plan and scales their time to the eval (times the probe's margin, 1.25), instead of
// pricing each eval ray at a training ray's time. Here an eval ray takes 0.05 s: the eval's 384
// rays (a val and a train view of 192 pixels, all on one rank) take 19.2 s, where eval_cost
// forecasts 64 s (6 rays a step, 1 s a step). The run plans the steps that fit the true eval and
// ends within the budget; with the probe off it keeps 64 s and trains fewer steps.
TEST_F(TrainerTest, TimeBudgetForecastsTheEvalFromATimedSampleOfIt) {
  auto train = [&](bool probe) {
    TestClock clock;
    RayTrainerOptions o = eval_heavy_budget(options(), clock, 100.0);
    o.eval_probe = probe;
    EvalTimedMlp model(clock, 0.05);
    RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
    tick_per_step(trainer, clock);
    const TrainSummary s = trainer.run();
    EXPECT_TRUE(s.finished);
    return std::make_pair(s.steps, clock.now);
  };
  const auto [probed_steps, probed_end] = train(true);
  const auto [priced_steps, priced_end] = train(false);
  // The probe's 6 rays take 0.3 s: a forecast of 0.3 * 384 / 6 * 1.25 = 24 s. Plans at steps 10
  // and 60, each after a probe: 60 + floor(95 - 60.6 - 24) = 70 steps.
  // The ranks agree on the plan; the eval's rays (one chunk a view), and so its time, are all
  // one rank's: the latest clock.
  EXPECT_EQ(probed_steps, 70);
  EXPECT_GT(probed_steps, priced_steps + 8);
  torch::Tensor ends = torch::tensor({probed_end, priced_end}, torch::kFloat64);
  world().allreduce(ends, distributed::ReduceOp::Max);
  EXPECT_LE(ends[0].item<double>(), 100.0);
  EXPECT_GT(ends[0].item<double>(), 70.0 + 19.2) << "the eval ran on the test's clock";
  EXPECT_LE(ends[1].item<double>(), 100.0);
}

// A resumed run keeps the plan and counts the time before its snapshot.
TEST_F(TrainerTest, TimeBudgetResumesWithItsPlanAndItsTime) {
  TestClock first_clock;
  RayTrainerOptions o = budget_options(options(), first_clock);
  o.out_dir = dir_ + "/budget-resume";
  o.stop_after = 30;
  std::string snapshot;
  int64_t planned = 0;
  {
    DirectionMlp model;
    RayTrainer trainer(*test::g_context, world(), model, *scene_, o);
    tick_per_step(trainer, first_clock);
    snapshot = trainer.run().last_snapshot;
    planned = trainer.run_driver().planned_steps();
  }
  ASSERT_EQ(snapshot, snapshot_path(o.out_dir + "/snapshots", 30));
  ASSERT_LT(planned, 100);
  TestClock clock;  // a new process's clock: starts again at 0
  clock.now = 0.0;
  RayTrainerOptions resumed_options = budget_options(options(), clock);
  resumed_options.out_dir = o.out_dir;
  DirectionMlp model;
  RayTrainer trainer(*test::g_context, world(), model, *scene_, resumed_options);
  tick_per_step(trainer, clock);
  trainer.load_snapshot(snapshot);
  EXPECT_EQ(trainer.run_driver().planned_steps(), planned);
  EXPECT_EQ(trainer.lr_options().total_steps, planned);
  const TrainSummary s = trainer.run();
  EXPECT_TRUE(s.finished);
  EXPECT_EQ(s.steps, planned);
  EXPECT_LE(30.0 + clock.now, 100.0);  // the first run's 30 s count
}

class RenamedMlp : public DirectionMlp {
 public:
  std::string name() const override { return "renamed_mlp"; }
};

TEST_F(TrainerTest, ResumeRefusesAnotherModel) {
  RayTrainerOptions o = options();
  o.steps = 2;
  o.out_dir = dir_ + "/resume-other-model";
  DirectionMlp model;
  std::string snapshot;
  {
    RayTrainer t(*test::g_context, world(), model, *scene_, o);
    snapshot = t.run().last_snapshot;
  }
  RenamedMlp other;
  RayTrainer t(*test::g_context, world(), other, *scene_, o);
  try {
    t.load_snapshot(snapshot);
    ADD_FAILURE() << "load_snapshot accepted a snapshot of another model";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model 'direction_mlp'"), std::string::npos) << e.what();
  }
}

// docs/training_loop.md: SIGTERM on one rank stops every rank after the same step, with one snapshot.
TEST_F(TrainerTest, SignalStopsEveryRankWithASnapshot) {
  RayTrainerOptions o = options();
  o.steps = 50;
  o.out_dir = dir_ + "/signal";
  DirectionMlp model;
  RayTrainer t(*test::g_context, world(), model, *scene_, o);
  t.loss_hook = [&](int64_t step, int64_t, torch::Tensor&) {
    if (step == 2 && world().rank() == world().size() - 1) std::raise(SIGTERM);
  };
  const TrainSummary s = t.run();
  EXPECT_FALSE(s.finished);
  EXPECT_TRUE(s.stopped_by_signal);  // tessera train exits with kExitStopped
  EXPECT_EQ(s.steps, 3);  // the flag is agreed at the end of step 2 (the third step)
  EXPECT_EQ(s.last_snapshot, snapshot_path(o.out_dir + "/snapshots", 3));
  world().barrier();
  EXPECT_EQ(validate_snapshot(s.last_snapshot), "");
}

// A signal during start-up or resume, caught by the handlers `tessera train` installs before MPI
// starts: the run stops before its first step, with the snapshot of that step, on every rank.
// (Without the outer handlers the signal would end one rank; with a flag cleared by the run's
// own handlers it would be lost.)
TEST_F(TrainerTest, SignalDuringStartUpStopsBeforeTheFirstStep) {
  const StopSignals outer;
  if (world().rank() == world().size() - 1) std::raise(SIGTERM);
  RayTrainerOptions o = options();
  o.steps = 50;
  o.out_dir = dir_ + "/signal-start";
  DirectionMlp model;
  RayTrainer t(*test::g_context, world(), model, *scene_, o);
  const TrainSummary s = t.run();
  EXPECT_TRUE(s.stopped_by_signal);
  EXPECT_FALSE(s.finished);
  EXPECT_EQ(s.steps, 0);
  EXPECT_EQ(s.last_snapshot, snapshot_path(o.out_dir + "/snapshots", 0));
  world().barrier();
  EXPECT_EQ(validate_snapshot(s.last_snapshot), "");
}

// docs/training_loop.md: non-finite losses skip steps on every rank; after max_skipped_steps in a row the
// run stops with a message naming the last snapshot, which stays loadable.
TEST_F(TrainerTest, RepeatedNonFiniteStepsStopTheRun) {
  RayTrainerOptions o = options();
  o.steps = 50;
  o.snapshot_every = 2;
  o.max_skipped_steps = 3;
  o.out_dir = dir_ + "/nonfinite";
  DirectionMlp model;
  RayTrainer t(*test::g_context, world(), model, *scene_, o);
  t.loss_hook = [&](int64_t step, int64_t, torch::Tensor& loss) {
    if (step >= 3 && world().rank() == 0) loss = loss * std::numeric_limits<float>::quiet_NaN();
  };
  try {
    t.run();
    ADD_FAILURE() << "the run did not stop";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("training stopped at step 6"), std::string::npos) << what;
    EXPECT_NE(what.find("step-00000004.h5"), std::string::npos) << what;
  }
  // Skipped at steps 4, 5, 6 (indices 3..5); the snapshot of step 4 stays the newest.
  world().barrier();
  EXPECT_EQ(validate_snapshot(snapshot_path(o.out_dir + "/snapshots", 4)), "");
  EXPECT_FALSE(std::filesystem::exists(snapshot_path(o.out_dir + "/snapshots", 6)));
}

}  // namespace
}  // namespace tessera
