// docs/training_loop.md, invariants 1 to 6 with the real NeRF models through the RayTrainer, under
// mpiexec -n 1, 2, 3, 4, on a tiny synthetic scene: N ranks equal one rank (bitwise with
// run.deterministic, within float reassociation without), accumulation equals a large batch,
// exact checkpointing, rate agreement, resume at another world size.
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "framework/memory.h"
#include "models/nerf/ray_model.h"
#include "models/nerf/ray_trainer.h"
#include "models/nerf/nerf_hash.h"
#include "models/nerf/nerf_mlp.h"
#include "tests/bitwise_trace.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using namespace models::nerf;  // the ray family under test

namespace nerf = models::nerf;

distributed::Communicator& world() { return test::cpu_world(); }

constexpr uint64_t kModelSeed = 11;
constexpr int64_t kSteps = 20;  // training steps of invariants 1 and 2

// Small versions of the models: the invariants do not depend on the size, the run time does.
nerf::NerfMlpOptions small_mlp() {
  nerf::NerfMlpOptions o;
  o.position_frequencies = 6;
  o.direction_frequencies = 2;
  o.layers = 4;
  o.width = 32;
  o.skip_layer = 2;
  o.color_width = 16;
  o.samples_per_ray = 16;
  return o;
}

nerf::NerfHashOptions small_hash() {
  nerf::NerfHashOptions o;
  o.levels = 4;
  o.log2_hashmap_size = 12;
  o.base_resolution = 8;
  o.finest_resolution = 32;
  o.hidden_width = 32;
  o.geo_features = 8;
  o.steps_per_diagonal = 64;
  o.grid.resolution = 16;
  o.grid.chunk = 1000;         // the grid's 4096 cells in several chunks, split across ranks
  o.grid_update_interval = 4;  // several (collective) grid updates within the 20 steps
  return o;
}

// Every parameter, flattened and concatenated in parameter_groups() order.
torch::Tensor concat_params(Model& model) {
  std::vector<torch::Tensor> v;
  for (auto& g : model.parameter_groups())
    for (auto& p : g.params) v.push_back(p.detach().reshape({-1}).to(torch::kCPU));
  return torch::cat(v);
}

torch::Tensor concat_grads(Model& model) {
  std::vector<torch::Tensor> v;
  for (auto& g : model.parameter_groups())
    for (auto& p : g.params)
      v.push_back(p.grad().defined() ? p.grad().detach().reshape({-1}).clone()
                                     : torch::zeros({p.numel()}, p.options().requires_grad(false)));
  return torch::cat(v);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

// A synthetic "objects" scene of 8 views at 32x24 (6 train views, 4608 training pixels), written
// by rank 0 into a shared temp dir.
class NerfInvariantsTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_shared_temp_dir("tessera-nerf-inv", [](const std::string& dir) {
      data::synth::SynthOptions so;
      so.preset = "objects";
      so.views = 8;
      so.width = 32;
      so.height = 24;
      data::synth::write_synth_scene(so, dir + "/scene.h5");
    });
    scene_ = std::make_unique<data::SceneReader>(dir_ + "/scene.h5");
  }
  static void TearDownTestSuite() {
    scene_.reset();
    test::remove_shared_temp_dir(dir_);
  }
  static ModelContext model_context() {
    ModelContext c;
    const auto& m = scene_->meta();
    for (int i = 0; i < 6; ++i) c.scene_bounds[i] = m.scene_bounds[i];
    c.near = m.near;
    c.far = m.far;
    return c;
  }
  static std::unique_ptr<Model> make(const std::string& name) {
    if (name == "nerf-mlp")
      return std::make_unique<nerf::NerfMlp>(small_mlp(), model_context(), kModelSeed);
    nerf::NerfHashOptions options = small_hash();
    if (name == "nerf-hash+proposal") {
      options.sampler = "proposal";
      options.proposal.log2_hashmap_size = options.log2_hashmap_size;
      options.proposal.first_samples = 32;
      options.proposal.second_samples = 16;
      options.proposal.nerf_samples = 8;
    }
    return std::make_unique<nerf::NerfHash>(options, model_context(), kModelSeed);
  }
  static RayTrainerOptions options() {
    RayTrainerOptions o;
    o.steps = kSteps;
    o.nerf.rays_per_step = 256;
    o.nerf.lr_schedule = "constant";
    o.nerf.background = "dataset";
    o.seed = 5;
    o.nerf.lr = 1e-2;
    // Adam divides by sqrt(v), so a weight whose gradient comes from a few samples moves by ~lr
    // whatever the gradient's size: one ReLU kink crossed differently under float32
    // reassociation then changes it by O(lr) (measured: 4e-3 with eps 1e-8 or 1e-6 on nerf-mlp).
    // eps = 1e-4 bounds that amplification to lr * |dg| / eps per step, and the invariants are
    // compared one step at a time (lockstep_diff), so they measure the sharding and the
    // accumulation, not the chaos of a ReLU net (about 2e-7 relative per step here).
    o.nerf.adam_eps = 1e-4;
    o.log_every = 0;
    o.progress = false;
    return o;
  }
  static std::string dir_;
  static std::unique_ptr<data::SceneReader> scene_;
};
std::string NerfInvariantsTest::dir_;
std::unique_ptr<data::SceneReader> NerfInvariantsTest::scene_;

// Float reassociation bound of invariants 1 and 2: the largest parameter difference after one
// step from equal parameters, relative to the largest parameter magnitude. Parameters near zero
// get no special floor, so a step that moves the small weights differently fails too.
constexpr double kReassociationTolerance = 1e-5;

double relative_param_diff(const torch::Tensor& got, const torch::Tensor& want) {
  return max_abs_diff(got, want) / want.abs().max().item<double>();
}

// Copies `from`'s parameters into `to` (same model, same layout), in place: optimizer states keep
// their tensors.
void copy_params(Model& from, Model& to) {
  torch::NoGradGuard no_grad;
  std::vector<ParamGroup> a = from.parameter_groups(), b = to.parameter_groups();
  ASSERT_EQ(a.size(), b.size());
  for (size_t g = 0; g < a.size(); ++g) {
    ASSERT_EQ(a[g].params.size(), b[g].params.size()) << a[g].name;
    for (size_t i = 0; i < a[g].params.size(); ++i) b[g].params[i].copy_(a[g].params[i]);
  }
}

// Steps `tested` and `reference` together for kSteps steps, in lockstep: after each
// step the largest relative parameter difference is recorded, then `tested` gets `reference`'s
// parameters. Each step is thus compared from equal parameters, so what is measured is one step
// of the sharding or accumulation under test, never the drift of 20 steps of a ReLU net: once
// reassociation moves one sample across a ReLU kink, Adam (dividing by sqrt(v)) turns that
// sample's gradient into an O(lr * |dg| / eps) step that its momentum repeats for ~10 steps, and
// whether that happens at all depends on the compiler's rounding (clang: 2.5e-5 after 20 free
// steps where gcc gave 2e-7, from one kink at step 11). The losses of every step are compared too.
// Returns the largest per-step difference.
double lockstep_diff(RayTrainer& tested, Model& tested_model, RayTrainer& reference,
                     Model& reference_model) {
  double worst = 0;
  for (int64_t t = 0; t < kSteps; ++t) {
    const StepRecord a = reference.train_step(t), b = tested.train_step(t);
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * a.loss) << "step " << t;
    const double diff =
        relative_param_diff(concat_params(tested_model), concat_params(reference_model));
    EXPECT_LE(diff, kReassociationTolerance) << "step " << t;
    worst = std::max(worst, diff);
    copy_params(reference_model, tested_model);
  }
  return worst;
}

class NerfInvariantsByModel : public NerfInvariantsTest,
                              public testing::WithParamInterface<std::string> {};

// Invariant 1: each of 20 steps on N ranks gives the parameters of the same step on one rank with
// the same global batch (the 1-rank reference runs on every rank over MPI_COMM_SELF).
TEST_P(NerfInvariantsByModel, NRanksEqualOneRank) {
  auto model = make(GetParam()), reference = make(GetParam());
  const torch::Tensor initial = concat_params(*reference);
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  RayTrainer trainer(*test::g_context, world(), *model, *scene_, options());
  RayTrainer single(*test::g_context, self, *reference, *scene_, options());
  const double diff = lockstep_diff(trainer, *model, single, *reference);
  const torch::Tensor want = concat_params(*reference);
  const double moved = relative_param_diff(want, initial);
  if (world().rank() == 0)
    std::fprintf(stderr, "%s, %d ranks vs 1, %lld steps in lockstep: largest step difference "
                 "%.3g relative (training moved the parameters by %.3g relative)\n",
                 GetParam().c_str(), world().size(), static_cast<long long>(kSteps), diff, moved);
  EXPECT_GT(moved, 100 * kReassociationTolerance);  // it trained
  const torch::Tensor got = concat_params(*model);
  const torch::Tensor all = world().allgather(got);  // and every rank holds the same parameters
  for (int r = 0; r < world().size(); ++r) EXPECT_TRUE(torch::equal(all[r], got)) << "rank " << r;
}

// Invariant 2: each of 20 steps with K = 4 micro-batches of R/4 rays gives the parameters of one
// batch of R rays.
TEST_P(NerfInvariantsByModel, AccumulationEqualsLargeBatch) {
  auto large = make(GetParam()), accumulated = make(GetParam());
  RayTrainerOptions k4 = options();
  k4.nerf.micro_batches = 4;
  RayTrainer ta(*test::g_context, world(), *large, *scene_, options());
  RayTrainer tb(*test::g_context, world(), *accumulated, *scene_, k4);
  const double diff = lockstep_diff(tb, *accumulated, ta, *large);
  if (world().rank() == 0)
    std::fprintf(stderr, "%s, K=4 vs K=1 on %d ranks, %lld steps in lockstep: largest step "
                 "difference %.3g relative\n", GetParam().c_str(), world().size(),
                 static_cast<long long>(kSteps), diff);
}

// Mixed precision on the CPU: bf16 autocast runs the MLPs in bf16 and compositing in float32.
// The first step's loss matches fp32 to bf16's precision (the models start identical), the
// gradients stay finite, and the parameters after a few steps differ from fp32's (autocast did
// act) but stay close; every rank agrees on the bf16 parameters.
TEST_P(NerfInvariantsByModel, Bf16AutocastTrainsOnTheCpu) {
  auto fp32 = make(GetParam()), bf16 = make(GetParam());
  RayTrainerOptions o = options();
  o.steps = 4;
  RayTrainer reference(*test::g_context, world(), *fp32, *scene_, o);
  o.precision = "bf16";
  RayTrainer mixed(*test::g_context, world(), *bf16, *scene_, o);
  for (int64_t t = 0; t < o.steps; ++t) {
    const StepRecord a = reference.train_step(t), b = mixed.train_step(t);
    EXPECT_FALSE(b.skipped) << "step " << t;
    ASSERT_TRUE(std::isfinite(b.loss)) << "step " << t;
    if (t == 0) {
      EXPECT_NEAR(b.loss, a.loss, 0.03 * a.loss) << "bf16 " << b.loss << " fp32 " << a.loss;
    }
  }
  const torch::Tensor got = concat_params(*bf16), want = concat_params(*fp32);
  EXPECT_TRUE(torch::isfinite(got).all().item<bool>());
  EXPECT_GT(max_abs_diff(got, want), 0.0) << "bf16 autocast changed nothing";
  EXPECT_LT(relative_param_diff(got, want), 0.05);
  const torch::Tensor all = world().allgather(got);
  for (int r = 0; r < world().size(); ++r) EXPECT_TRUE(torch::equal(all[r], all[0])) << r;
}

// ---- Invariant 6, run.deterministic (docs/training_loop.md, "Bitwise at any world size"): 20
// free steps (no lockstep) at Adam's default eps, 1e-15, where reassociated float sums are
// amplified most, with random backgrounds and sample jitter.

RayTrainerOptions deterministic_options(bool deterministic) {
  RayTrainerOptions o;
  o.steps = kSteps;
  o.deterministic = deterministic;
  o.nerf.rays_per_step = 256;
  o.nerf.unit_rays = 40;  // 7 units of 36 or 37 rays: uneven on 2, 3 and 4 ranks
  o.nerf.background = "random";
  o.nerf.lr = 1e-2;
  o.eval_chunk_rays = 200;  // a view's 768 pixels in 4 chunks
  o.seed = 5;
  o.log_every = 0;
  o.progress = false;
  return o;
}

// kSteps steps from the trainer's next step, then the first two val views scored.
test::Trace train_trace(RayTrainer& trainer) {
  test::Trace trace;
  for (int64_t t = trainer.next_step(); t < trainer.options().steps; ++t)
    trace.add(trainer.train_step(t));
  trainer.set_eval_views("val", 2);
  trace.add(trainer.evaluate(trainer.options().steps, /*write=*/false));
  trace.state = test::adam_state_of(trainer.optimizer());
  return trace;
}

// N ranks at 3 threads each equal one rank at 1 thread (over MPI_COMM_SELF, on every rank), bit
// for bit: parameters, Adam's moments, each step's loss, samples per ray, eval PSNR and SSIM.
TEST_P(NerfInvariantsByModel, DeterministicNRanksEqualOneRankBitwise) {
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  test::Trace want, got;
  {
    test::IntraOpThreads one(1);
    auto model = make(GetParam());
    RayTrainer trainer(*test::g_context, self, *model, *scene_, deterministic_options(true));
    want = train_trace(trainer);
  }
  {
    test::IntraOpThreads three(3);
    auto model = make(GetParam());
    RayTrainer trainer(*test::g_context, world(), *model, *scene_, deterministic_options(true));
    got = train_trace(trainer);
  }
  test::expect_bitwise(got, want, GetParam() + " on " + std::to_string(world().size()) + " ranks",
                       world());
  auto fresh = make(GetParam());
  EXPECT_GT(max_abs_diff(concat_params(*fresh), want.state.narrow(0, 0, concat_params(*fresh).numel())),
            1e-3)
      << "the parameters trained";
}

// Fewer units than ranks: 2 units of 128 rays, so on 3 and 4 ranks some ranks render nothing and
// still join every collective (the exact sum, the occupancy update, the step's counts). The same
// in the eval: a view's 768 pixels in 2 chunks of 400, so ranks 2 and 3 render no pixel and still
// join each view's gather.
TEST_P(NerfInvariantsByModel, DeterministicRanksWithoutUnitsStillAgree) {
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  RayTrainerOptions o = deterministic_options(true);
  o.nerf.unit_rays = 128;
  o.eval_chunk_rays = 400;
  o.steps = 6;
  auto a = make(GetParam()), b = make(GetParam());
  RayTrainer one(*test::g_context, self, *a, *scene_, o);
  RayTrainer many(*test::g_context, world(), *b, *scene_, o);
  test::expect_bitwise(train_trace(many), train_trace(one),
                       GetParam() + ", 2 units on " + std::to_string(world().size()) + " ranks",
                       world());
}

// Without run.deterministic the same comparison fails on more than one rank (the float sums of
// the gradient sync and of each rank's batch reassociate): what the test above would catch if an
// order-dependent float sum came back into a reduction.
TEST_P(NerfInvariantsByModel, FloatPathDiffersAcrossWorldSizes) {
  if (world().size() == 1) GTEST_SKIP() << "one rank: nothing to reassociate";
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  auto a = make(GetParam()), b = make(GetParam());
  RayTrainer one(*test::g_context, self, *a, *scene_, deterministic_options(false));
  RayTrainer many(*test::g_context, world(), *b, *scene_, deterministic_options(false));
  EXPECT_FALSE(torch::equal(train_trace(one).state, train_trace(many).state));
}

// A snapshot written on N ranks at step 10 resumes on one rank to the bits of 20 steps straight.
TEST_P(NerfInvariantsByModel, DeterministicResumeAtAnotherWorldSizeIsBitwise) {
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  RayTrainerOptions o = deterministic_options(true);
  o.out_dir = dir_ + "/resume-" + GetParam();
  o.stop_after = kSteps / 2;
  std::string snapshot;
  {
    auto model = make(GetParam());
    RayTrainer first(*test::g_context, world(), *model, *scene_, o);
    snapshot = first.run().last_snapshot;
  }
  auto a = make(GetParam()), b = make(GetParam());
  RayTrainer straight(*test::g_context, self, *a, *scene_, deterministic_options(true));
  RayTrainer resumed(*test::g_context, self, *b, *scene_, deterministic_options(true));
  resumed.load_snapshot(snapshot);
  EXPECT_EQ(resumed.next_step(), kSteps / 2);
  const test::Trace want = train_trace(straight), got = train_trace(resumed);
  EXPECT_TRUE(torch::equal(got.state, want.state))
      << got.state.ne(want.state).sum().item<int64_t>() << " values differ";
}

INSTANTIATE_TEST_SUITE_P(Models, NerfInvariantsByModel,
                         testing::Values("nerf-hash", "nerf-mlp", "nerf-hash+proposal"),
                         [](const auto& info) {
                           if (info.param == "nerf-hash") return std::string("hash");
                           return info.param == "nerf-mlp" ? std::string("mlp") : std::string("hash_proposal");
                         });

// Invariant 3: checkpointing every segment changes no value, with random sample jitter.
TEST_F(NerfInvariantsTest, CheckpointingIsExactMlp) {
  auto plain = make("nerf-mlp"), ckpt = make("nerf-mlp");
  ASSERT_FALSE(ckpt->segment_names().empty());
  ckpt->set_checkpointed_segments(ckpt->segment_names());
  // Gradients of one step's loss, bitwise.
  {
    RaySamplerOptions so;
    so.rays_per_step = 256;
    so.seed = 5;
    RaySampler sampler(*scene_, so, [](int64_t) { return 1.0; });
    const RayBatch batch = sampler.rank_batch(3, world().rank(), world().size(), torch::kCPU);
    StepContext ctx;
    ctx.step = 3;
    ctx.seed = 5;
    ctx.training = true;
    for (Model* m : {plain.get(), ckpt.get()}) {
      const RenderResult r = m->render(batch, ctx);
      (r.rgb - batch.target_rgb).pow(2).mean().backward();
    }
    const torch::Tensor g_plain = concat_grads(*plain), g_ckpt = concat_grads(*ckpt);
    EXPECT_GT(g_plain.abs().max().item<double>(), 0.0);
    EXPECT_TRUE(torch::equal(g_plain, g_ckpt)) << "max abs diff " << max_abs_diff(g_plain, g_ckpt);
    // Render twice at different steps differs (the jitter is drawn), so the test has teeth.
    StepContext other = ctx;
    other.step = 4;
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(torch::equal(plain->render(batch, ctx).rgb, plain->render(batch, other).rgb));
    for (Model* m : {plain.get(), ckpt.get()})
      for (auto& g : m->parameter_groups())
        for (auto& p : g.params)
          if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
  }
  // Parameters after 3 RayTrainer steps, bitwise.
  auto a = make("nerf-mlp"), b = make("nerf-mlp");
  b->set_checkpointed_segments(b->segment_names());
  RayTrainerOptions o = options();
  o.steps = 3;
  RayTrainer ta(*test::g_context, world(), *a, *scene_, o);
  RayTrainer tb(*test::g_context, world(), *b, *scene_, o);
  for (int64_t t = 0; t < o.steps; ++t) {
    ta.train_step(t);
    tb.train_step(t);
  }
  const torch::Tensor pa = concat_params(*a), pb = concat_params(*b);
  EXPECT_TRUE(torch::equal(pa, pb)) << "max abs diff " << max_abs_diff(pa, pb);
}

// Invariant 5: with check_agreement on and a linear sampling schedule 1 -> 0.5, six steps raise
// no agreement error and every rank reports the same rate (and lr, scale, skip) at every step.
TEST_F(NerfInvariantsTest, RateAgreementMlp) {
  RayTrainerOptions o = options();
  o.steps = 6;
  o.nerf.rays_per_step = 2048;  // epochs of 1-2 steps over 4608 pixels, so the rate changes in 6 steps
  o.check_agreement = true;
  o.sampling.name = "linear";
  o.sampling.rate_max = 1.0;
  o.sampling.rate_min = 0.5;
  o.sampling.total_steps = 6;
  auto model = make("nerf-mlp");
  RayTrainer trainer(*test::g_context, world(), *model, *scene_, o);
  std::vector<double> rows;
  for (int64_t t = 0; t < o.steps; ++t) {
    StepRecord r;
    ASSERT_NO_THROW(r = trainer.train_step(t)) << "step " << t;
    rows.insert(rows.end(), {r.fields.at("sampling_rate").get<double>(),
                             r.fields.at("lr").get<double>(), r.loss_scale,
                             r.skipped ? 1.0 : 0.0, r.loss});
  }
  const torch::Tensor mine =
      torch::tensor(rows, torch::kFloat64).reshape({o.steps, 5});
  const torch::Tensor all = world().allgather(mine);
  for (int r = 0; r < world().size(); ++r) EXPECT_TRUE(torch::equal(all[r], mine)) << "rank " << r;
  if (world().rank() == 0) {
    std::string rates;
    for (int64_t t = 0; t < o.steps; ++t) rates += " " + std::to_string(mine[t][0].item<double>());
    std::fprintf(stderr, "rates per step on %d ranks:%s\n", world().size(), rates.c_str());
  }
  EXPECT_EQ(mine[0][0].item<double>(), 1.0);
  EXPECT_LT(mine[o.steps - 1][0].item<double>(), 1.0);  // the schedule took effect
  EXPECT_GE(mine[o.steps - 1][0].item<double>(), 0.5);
}

}  // namespace
}  // namespace tessera
