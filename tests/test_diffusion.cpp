// Tests of the point-diffusion family (models/diffusion/, docs/diffusion.md) on 1, 2 and 3 ranks:
// the cosine schedule, N ranks train like one, accumulation and checkpointing are exact, the
// checkpoint policies store less, samples do not depend on the ranks, resume is exact, the
// held-out denoising loss falls, and bad datasets or sizes are refused.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "distributed/errors.h"
#include "distributed/mpi_communicator.h"
#include "framework/config.h"
#include "framework/data/shapes.h"
#include "framework/data/synth.h"
#include "framework/run.h"
#include "framework/snapshot.h"
#include "models/builtin.h"
#include "models/diffusion/diffusion_family.h"
#include "models/diffusion/noise_schedule.h"
#include "models/diffusion/sampling.h"
#include "tests/bitwise_trace.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

namespace df = models::diffusion;

distributed::Communicator& world() { return test::cpu_world(); }

class DiffusionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_shared_temp_dir("tessera-diffusion", [](const std::string& dir) {
      data::shapes::write_generated_shapes({20, 64, 1}, dir + "/shapes.h5");
    });
    shapes_ = std::make_unique<data::shapes::ShapesReader>(dir_ + "/shapes.h5");
  }
  static void TearDownTestSuite() {
    shapes_.reset();
    test::remove_shared_temp_dir(dir_);
  }

  // A tiny denoiser: batch 6 splits evenly over 1, 2 and 3 ranks. Adam's epsilon 1e-4 as the NeRF
  // invariant tests: it bounds the amplification of float reassociation by Adam's division. The
  // float path (run.deterministic = false), whose invariants these tests hold within float
  // reassociation; the Deterministic* tests set it true.
  static Config config(const std::vector<std::string>& extra = {}) {
    FamilyRegistry families;  // [diffusion] joins the config schema
    models::register_builtin_families(families);
    std::vector<std::string> sets = {
        "model.name=point-diffusion", "data.path=" + dir_ + "/shapes.h5", "run.seed=5",
        "train.steps=20", "diffusion.width=32", "diffusion.depth=2", "diffusion.heads=2",
        "diffusion.tokens=48", "diffusion.batch=6", "diffusion.lr=1e-3",
        "diffusion.lr_schedule=constant", "diffusion.warmup_steps=0", "diffusion.timesteps=100",
        "diffusion.adam_eps=1e-4", "run.deterministic=false"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return parse_config("", "diffusion test", sets);
  }

  static RunOptions quiet(const Config& c) {
    RunOptions o = run_options(c);
    o.out_dir = "";
    o.progress = false;
    o.log_every = 0;
    o.check_agreement = true;
    return o;
  }

  static std::string dir_;
  static std::unique_ptr<data::shapes::ShapesReader> shapes_;
};

std::string DiffusionTest::dir_;
std::unique_ptr<data::shapes::ShapesReader> DiffusionTest::shapes_;

// A family and a TrainingRun over `comm`.
struct Trained {
  Trained(const Config& config, distributed::Communicator& comm, const data::Dataset& dataset,
          const RunOptions& options)
      : family(FamilyContext{config, *test::g_context, comm, dataset, torch::Device(torch::kCPU)}),
        run(*test::g_context, comm, family, dataset, options) {}
  df::DiffusionFamily family;
  TrainingRun run;
};

// The largest |a - b| relative to the largest |b| of any parameter.
double relative_difference(const df::PointDenoiser& a, const df::PointDenoiser& b) {
  double worst = 0.0;
  const auto& pa = a.named_parameters();
  const auto& pb = b.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const double scale = std::max(pb[i].second.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (pa[i].second - pb[i].second).abs().max().item<double>() / scale);
  }
  return worst;
}

TEST(NoiseSchedule, CosineScheduleFallsFromOneToZeroWithClippedBetas) {
  const df::NoiseSchedule s(1000);
  const torch::Tensor a = s.alphas_cumprod();
  EXPECT_GT(a[0].item<double>(), 0.999);
  EXPECT_LT(a[999].item<double>(), 1e-4);
  EXPECT_TRUE((a.slice(0, 1) < a.slice(0, 0, -1)).all().item<bool>()) << "alpha_bar decreases";
  EXPECT_LE(s.betas().max().item<double>(), 0.999);
  // Halfway, the cosine schedule keeps about half the signal: cos^2(pi/4 (1 + s')) ~ 0.49.
  EXPECT_NEAR(a[499].item<double>(), 0.49, 0.02);
  // x_t = sqrt(a) x0 + sqrt(1 - a) eps.
  const torch::Tensor x0 = torch::ones({2, 3, 6}), eps = torch::full({2, 3, 6}, 2.0);
  const torch::Tensor t = torch::tensor({0, 999}, torch::kInt64);
  const torch::Tensor xt = s.add_noise(x0, t, eps);
  const double a0 = a[0].item<double>(), a1 = a[999].item<double>();
  EXPECT_NEAR(xt[0][0][0].item<double>(), std::sqrt(a0) + 2 * std::sqrt(1 - a0), 1e-6);
  EXPECT_NEAR(xt[1][0][0].item<double>(), std::sqrt(a1) + 2 * std::sqrt(1 - a1), 1e-6);
}

// Invariant 1 on the float path: N ranks train like one (20 steps, within 1e-5 relative).
TEST_F(DiffusionTest, NRanksTrainLikeOne) {
  const Config c = config({"run.deterministic=false"});
  Trained ranks(c, world(), *shapes_, quiet(c));
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  Trained one(c, self, *shapes_, quiet(c));
  for (int64_t t = 0; t < 20; ++t) {
    const double a = ranks.run.train_step(t).loss, b = one.run.train_step(t).loss;
    EXPECT_NEAR(a, b, 1e-5 * std::abs(b)) << "step " << t;
  }
  EXPECT_LE(relative_difference(ranks.family.model(), one.family.model()), 1e-5);
  EXPECT_GT(relative_difference(ranks.family.model(),
                                df::PointDenoiser({32, 2, 2, 6, 0.0}, 5, torch::kCPU)),
            1e-3)
      << "the parameters trained";
}

// Invariant 6, run.deterministic (docs/training_loop.md, "Bitwise at any world size"): 20 steps on
// N ranks equal one rank bit for bit (parameters, Adam's moments, each step's loss, the eval's
// denoising loss and the generated clouds' MMD, coverage and 1-NNA), at Adam's default eps and
// with dropout (seeded per unit), a batch of 7 in units of at most 2 (uneven on every world size),
// and at another thread count: N ranks at 3 threads each against one rank at 1 (oneMKL's strict
// mode, which mpi_test_main asks for as the tessera binary does, and the denoiser's
// thread-invariant norms).
test::Trace deterministic_trace(const Config& c, distributed::Communicator& comm,
                                const data::Dataset& shapes, const RunOptions& options) {
  Trained t(c, comm, shapes, options);
  test::Trace trace;
  for (int64_t step = 0; step < 20; ++step) trace.add(t.run.train_step(step));
  // 18 items: two chunks of generated clouds (16 + 2), split whole across ranks.
  std::vector<size_t> items(18);
  for (size_t i = 0; i < items.size(); ++i) items[i] = i;
  trace.add(t.family.evaluate(20, items, {}));
  trace.state = test::adam_state_of(t.family.optimizer());
  return trace;
}

TEST_F(DiffusionTest, DeterministicNRanksEqualOneRankBitwise) {
  const Config c = config({"run.deterministic=true", "diffusion.adam_eps=1e-8",
                           "diffusion.batch=7", "diffusion.unit_shapes=2",
                           "diffusion.dropout=0.1", "diffusion.warmup_steps=2",
                           "diffusion.sample_steps=4"});
  ASSERT_TRUE(c.run.deterministic);
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  test::Trace want, got;
  {
    test::IntraOpThreads one(1);
    want = deterministic_trace(c, self, *shapes_, quiet(c));
  }
  {
    test::IntraOpThreads three(3);
    got = deterministic_trace(c, world(), *shapes_, quiet(c));
  }
  test::expect_bitwise(got, want,
                       "point-diffusion on " + std::to_string(world().size()) +
                           " ranks at 3 threads",
                       world());
  // The float path on the same config (without dropout, whose global generator alone would make
  // it differ) is not bitwise across world sizes: what the comparison above would catch if an
  // order-dependent float sum came back into a reduction.
  if (world().size() > 1) {
    const Config f = config({"diffusion.adam_eps=1e-8", "diffusion.batch=7",
                             "diffusion.warmup_steps=2", "diffusion.generative_eval=false"});
    ASSERT_FALSE(f.run.deterministic);
    EXPECT_FALSE(torch::equal(deterministic_trace(f, self, *shapes_, quiet(f)).state,
                              deterministic_trace(f, world(), *shapes_, quiet(f)).state));
  }
}

// Invariant 2: micro-batches add up to the batch.
TEST_F(DiffusionTest, AccumulationIsExact) {
  // A batch of 8: two micro-batches on each of up to 4 ranks.
  const Config whole = config({"diffusion.batch=8"}),
               split = config({"diffusion.batch=8", "diffusion.micro_batches=2"});
  Trained a(whole, world(), *shapes_, quiet(whole));
  Trained b(split, world(), *shapes_, quiet(split));
  for (int64_t t = 0; t < 5; ++t) {
    const double la = a.run.train_step(t).loss, lb = b.run.train_step(t).loss;
    EXPECT_NEAR(la, lb, 1e-6 * std::abs(la)) << t;
  }
  EXPECT_LE(relative_difference(a.family.model(), b.family.model()), 1e-5);
}

// The output layer starts at zero, which makes every other gradient of an untrained model zero:
// give it weights, the same for every family built with the same seed, so that a comparison of
// gradients covers every parameter.
void wake_output_layer(df::DiffusionFamily& family) {
  torch::NoGradGuard no_grad;
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(17);
  for (const auto& [name, p] : family.model().named_parameters())
    if (name == "output_w") p.copy_(torch::randn(p.sizes(), gen) * 0.1);
}

// The budget that keeps all blocks but one of `family`'s model: one block's activations fewer,
// its output more, in MiB.
double budget_for_one_recomputed_block(df::DiffusionFamily& family, int64_t depth) {
  const SegmentInfo block = family.measure_block("fp32");
  const double bytes = static_cast<double>((depth - 1) * block.activation_bytes +
                                           block.boundary_bytes);
  return bytes * 1.001 / (1024.0 * 1024.0);
}

// Invariant 3: recomputing blocks or attention cores gives the gradients of keeping everything,
// dropout included (the checkpoint replays the generator); the budget policy recomputes one
// block of two when that fits.
TEST_F(DiffusionTest, CheckpointingIsExactWithDropout) {
  // With dropout the attention core takes the unfused kernel and the attention policy
  // checkpoints the sublayer; without, it keeps the fused kernel's output (KeepAttentionOutput).
  for (const char* dropout : {"0.2", "0"}) {
    double budget_mib = 0;
    {
      const Config c = config({std::string("diffusion.dropout=") + dropout});
      df::DiffusionFamily family(
          FamilyContext{c, *test::g_context, world(), *shapes_, torch::Device(torch::kCPU)});
      budget_mib = budget_for_one_recomputed_block(family, 2);
    }
    std::vector<std::vector<torch::Tensor>> grads;
    for (const char* policy : {"none", "blocks", "attention", "budget"}) {
      const Config c = config({std::string("checkpoint.policy=") + policy,
                               std::string("diffusion.dropout=") + dropout,
                               "checkpoint.budget_mib=" + std::to_string(budget_mib)});
      df::DiffusionFamily family(
          FamilyContext{c, *test::g_context, world(), *shapes_, torch::Device(torch::kCPU)});
      if (std::string(policy) == "budget") {
        EXPECT_EQ(family.recompute().blocks, (std::vector<bool>{true, false})) << dropout;
      }
      wake_output_layer(family);
      torch::manual_seed(11);  // the same dropout masks for every policy
      StepControl control;
      control.step = 3;
      control.seed = 5;
      family.forward_backward(control);
      std::vector<torch::Tensor> g;
      for (const torch::Tensor& t : family.gradients()) {
        g.push_back(t.clone());
        EXPECT_GT(t.abs().max().item<double>(), 0.0) << "every parameter has a gradient";
      }
      grads.push_back(g);
    }
    for (size_t policy = 1; policy < grads.size(); ++policy)
      for (size_t i = 0; i < grads[0].size(); ++i)
        EXPECT_TRUE(torch::allclose(grads[policy][i], grads[0][i], 1e-6, 1e-9))
            << "dropout " << dropout << " policy " << policy << " parameter " << i
            << " differs by " << (grads[policy][i] - grads[0][i]).abs().max().item<double>();
  }
}

// bf16 autocast: the attention policy's recomputed Q, K, V have the forward's dtype.
TEST_F(DiffusionTest, AttentionRecomputationReplaysAutocast) {
  std::vector<std::vector<torch::Tensor>> grads;
  for (const char* policy : {"none", "attention"}) {
    const Config c = config({std::string("checkpoint.policy=") + policy});
    df::DiffusionFamily family(
        FamilyContext{c, *test::g_context, world(), *shapes_, torch::Device(torch::kCPU)});
    wake_output_layer(family);
    StepControl control;
    control.step = 2;
    control.precision = "bf16";
    family.forward_backward(control);
    std::vector<torch::Tensor> g;
    for (const torch::Tensor& t : family.gradients()) g.push_back(t.clone());
    grads.push_back(g);
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(torch::allclose(grads[1][i], grads[0][i], 1e-5, 1e-7))
        << "parameter " << i << " differs by " << (grads[1][i] - grads[0][i]).abs().max().item<double>();
}

// The policies store what they promise, measured on a dry forward of a micro-batch: recomputing
// blocks keeps only their inputs; a budget between keeps one block; a budget below every plan
// recomputes the blocks of the lowest peak; a generous one none.
TEST_F(DiffusionTest, CheckpointPoliciesStoreLessActivationMemory) {
  auto family_with = [&](const std::vector<std::string>& sets) {
    const Config c = config(sets);
    return std::make_unique<df::DiffusionFamily>(
        FamilyContext{c, *test::g_context, world(), *shapes_, torch::Device(torch::kCPU)});
  };
  const auto none = family_with({"diffusion.tokens=64"});
  const int64_t kept = none->measure_activation_bytes("fp32");
  const SegmentInfo block = none->measure_block("fp32");
  EXPECT_GT(block.activation_bytes, 4 * block.boundary_bytes) << "a block stores far more than its output";
  const int64_t blocks =
      family_with({"diffusion.tokens=64", "checkpoint.policy=blocks"})->measure_activation_bytes("fp32");
  EXPECT_LT(blocks, kept - 2 * (block.activation_bytes - block.boundary_bytes) * 9 / 10)
      << "none " << kept << " blocks " << blocks;
  const int64_t attention =
      family_with({"diffusion.tokens=64", "checkpoint.policy=attention"})->measure_activation_bytes("fp32");
  // The norm's output and the QKV projection (4 of about 17 widths per token) are not kept.
  EXPECT_LT(attention, kept * 9 / 10) << "none " << kept << " attention " << attention;
  EXPECT_GT(attention, blocks);
  const double one = budget_for_one_recomputed_block(*none, 2);
  const auto mid = family_with({"diffusion.tokens=64", "checkpoint.policy=budget",
                                "checkpoint.budget_mib=" + std::to_string(one)});
  EXPECT_EQ(mid->recompute().blocks, (std::vector<bool>{true, false}));
  const int64_t budget = mid->measure_activation_bytes("fp32");
  EXPECT_LT(budget, kept);
  EXPECT_GT(budget, blocks);
  // No plan fits: the lowest peak is recomputing block 0 (recomputing block 1 as well would
  // hold the same while it is recomputed, first in backward, and cost its forward again).
  EXPECT_EQ(family_with({"diffusion.tokens=64", "checkpoint.policy=budget",
                         "checkpoint.budget_mib=0.0001"})->recompute().blocks,
            (std::vector<bool>{true, false}));
  EXPECT_EQ(family_with({"diffusion.tokens=64", "checkpoint.policy=budget",
                         "checkpoint.budget_mib=10000"})->recompute().blocks,
            (std::vector<bool>{false, false}));
}

// Samples depend on (seed, index) only: N ranks draw what one rank draws, with DDPM's noise too;
// another seed draws other clouds.
TEST_F(DiffusionTest, SamplesDoNotDependOnTheRanks) {
  const Config c = config();
  Trained ranks(c, world(), *shapes_, quiet(c));
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  Trained one(c, self, *shapes_, quiet(c));
  for (int64_t t = 0; t < 10; ++t) {
    ranks.run.train_step(t);
    one.run.train_step(t);
  }
  for (const df::Sampler sampler : {df::Sampler::Ddpm, df::Sampler::Ddim}) {
    const torch::Tensor a = ranks.family.draw_samples(5, 10, sampler, 7, 1, {});
    const torch::Tensor b = one.family.draw_samples(5, 10, sampler, 7, 1, {});
    ASSERT_EQ(a.sizes(), (std::vector<int64_t>{5, 48, 6}));
    EXPECT_LE((a - b).abs().max().item<double>(), 1e-4 * b.abs().max().item<double>());
    const torch::Tensor other = one.family.draw_samples(5, 10, sampler, 8, 1, {});
    EXPECT_GT((other - b).abs().max().item<double>(), 0.1);
    EXPECT_LE(b.abs().max().item<double>(), 1.0 + 1e-6) << "x_0 is clipped to the data's range";
  }
}

// Invariant 4: 4 steps, a snapshot and 4 more equal 8 straight, bitwise.
TEST_F(DiffusionTest, ResumeIsExact) {
  const Config c = config({"train.steps=8"});
  const std::string out = dir_ + "/resume-" + std::to_string(world().size());
  RunOptions o = quiet(c);
  Trained straight(c, world(), *shapes_, o);
  for (int64_t t = 0; t < 8; ++t) straight.run.train_step(t);
  o.out_dir = out;
  std::string snapshot;
  {
    Trained first(c, world(), *shapes_, o);
    for (int64_t t = 0; t < 4; ++t) first.run.train_step(t);
    snapshot = first.run.save_snapshot();
  }
  Trained resumed(c, world(), *shapes_, o);
  resumed.run.load_snapshot(snapshot);
  for (int64_t t = 4; t < 8; ++t) resumed.run.train_step(t);
  const auto& a = resumed.family.model().named_parameters();
  const auto& b = straight.family.model().named_parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
}

// train.epochs: ceil(epochs x train shapes / batch) steps, and the learning-rate schedule,
// written for train.steps, ends at the planned step instead.
TEST_F(DiffusionTest, EpochsPlanTheStepsAndTheScheduleEndsThere) {
  const Config c = config({"train.steps=1000", "train.epochs=2", "diffusion.lr_schedule=exponential",
                           "diffusion.final_lr=1e-5"});
  Trained t(c, world(), *shapes_, quiet(c));
  const auto train = static_cast<int64_t>(shapes_->indices(data::Split::Train).size());
  const int64_t expected = (2 * train + 5) / 6;  // batch 6
  ASSERT_EQ(t.run.planned_steps(), expected);
  StepRecord last;
  for (int64_t s = 0; s < expected; ++s) last = t.run.train_step(s);
  LrScheduleOptions lr;
  lr.name = "exponential";
  lr.lr = 1e-3;
  lr.final_lr = 1e-5;
  lr.total_steps = expected;
  EXPECT_DOUBLE_EQ(last.fields.at("lr").get<double>(), LrSchedule(lr).at(expected - 1));
}

// The held-out denoising loss starts at 1 (the output layer starts at zero: no noise predicted)
// and falls as the model learns.
TEST_F(DiffusionTest, HeldOutDenoisingLossFalls) {
  const Config c = config({"train.steps=60"});
  Trained t(c, world(), *shapes_, quiet(c));
  const std::vector<size_t> val = shapes_->indices(data::Split::Val);
  const EvalScores before = t.family.evaluate(0, val, {});
  EXPECT_EQ(before.items, 2);
  EXPECT_EQ(before.unit, "shapes");
  EXPECT_NEAR(before.value("denoise_loss"), 1.0, 0.05);
  for (int64_t s = 0; s < 60; ++s) t.run.train_step(s);
  const EvalScores after = t.family.evaluate(60, val, {});
  EXPECT_LT(after.value("denoise_loss"), 0.8 * before.value("denoise_loss"));
  EXPECT_EQ(after.text().rfind("denoise_loss ", 0), 0u) << after.text();
  // The generative metrics of as many samples as shapes: shares in [0, 1], an MMD above 0.
  EXPECT_GT(after.value("mmd"), 0.0) << after.text();
  for (const char* share : {"cov", "1nna"}) {
    EXPECT_GE(after.value(share), 0.0) << after.text();
    EXPECT_LE(after.value(share), 1.0) << after.text();
  }
  const Config off = config({"diffusion.generative_eval=false"});
  Trained quiet_eval(off, world(), *shapes_, quiet(off));
  EXPECT_TRUE(std::isnan(quiet_eval.family.evaluate(0, val, {}).value("1nna")));
}

TEST_F(DiffusionTest, BadDatasetsAndSizesAreNamed) {
  const Config c = config({"diffusion.tokens=65"});
  EXPECT_NE(test::error_of([&] {
              df::DiffusionFamily f(
                  FamilyContext{c, *test::g_context, world(), *shapes_, torch::kCPU});
            }).find("diffusion.tokens = 65 is more than its 64 points per shape"),
            std::string::npos);
  const Config heads = config({"diffusion.width=30", "diffusion.heads=4"});
  FamilyRegistry families;
  models::register_builtin_families(families);
  EXPECT_NE(test::error_of([&] { families.get("point-diffusion", "t").check_config(heads); })
                .find("diffusion.width (30) must be a multiple of diffusion.heads (4)"),
            std::string::npos);
  // The policies are the family's (FamilyInfo::key_choices): refused at load, by the config.
  EXPECT_NE(test::error_of([&] { config({"checkpoint.policy=segments"}); })
                .find("is not one of model 'point-diffusion''s: none, blocks, attention, budget"),
            std::string::npos);
  const Config budget = config({"checkpoint.policy=budget"});
  EXPECT_NE(test::error_of([&] { families.get("point-diffusion", "t").check_config(budget); })
                .find("budget_mib = 0.000000 must be > 0"),
            std::string::npos);
  const Config steps = config({"diffusion.sample_steps=101"});
  EXPECT_NE(test::error_of([&] { families.get("point-diffusion", "t").check_config(steps); })
                .find("diffusion.sample_steps (101) must not exceed diffusion.timesteps (100)"),
            std::string::npos);
  // A scene is not a shape set.
  const std::string scene = test::make_shared_temp_dir("tessera-diffusion-scene", [](const std::string& d) {
    data::synth::SynthOptions so;
    so.views = 8;
    so.width = 16;
    so.height = 16;
    data::synth::write_synth_scene(so, d + "/scene.h5");
  });
  EXPECT_NE(test::error_of([&] {
              families.get("point-diffusion", "t").open_dataset(scene + "/scene.h5");
            }).find("not a tessera-shapes file (its format attribute is 'tessera-scene'"),
            std::string::npos);
  test::remove_shared_temp_dir(scene);
}

// With the exact noise predictor of a data set holding one cloud c, every estimate of x_0 is c:
// DDPM and DDIM return c from any start, for the full chain and a respaced one.
TEST(DiffusionSampling, TheOracleDenoiserGivesTheDataBack) {
  const df::NoiseSchedule schedule(100);
  torch::Generator data_gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const torch::Tensor c = torch::rand({2, 16, 6}, data_gen, torch::kFloat32) * 1.6 - 0.8;
  const torch::Tensor a = schedule.alphas_cumprod();
  const df::NoisePredictor oracle = [&](const torch::Tensor& x, const torch::Tensor& t) {
    const torch::Tensor at = a.index_select(0, t).to(torch::kFloat32).view({-1, 1, 1});
    return (x - at.sqrt() * c) / (1 - at).sqrt();
  };
  for (const df::Sampler sampler : {df::Sampler::Ddpm, df::Sampler::Ddim}) {
    for (const int64_t steps : {100, 10, 1}) {
      torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
      const torch::Tensor noise = torch::randn({2, 16, 6}, gen, torch::kFloat32);
      const torch::Tensor out = df::sample(oracle, schedule, noise, steps, sampler,
                                           {at::make_generator<at::CPUGeneratorImpl>(4),
                                            at::make_generator<at::CPUGeneratorImpl>(5)});
      // One step estimates x_0 at the last level only, dividing by sqrt(alpha_bar_{T-1}) ~ 5e-4:
      // float32 rounding of x (1.2e-7 relative) grows by that factor; more steps re-estimate x_0
      // at lower noise levels.
      const double rounding = 1.2e-7 * noise.abs().max().item<double>() /
                              std::sqrt(a[99].item<double>());
      EXPECT_LT((out - c).abs().max().item<double>(), steps == 1 ? 4 * rounding : 1e-4)
          << (sampler == df::Sampler::Ddpm ? "ddpm " : "ddim ") << steps << " steps";
    }
  }
  EXPECT_THROW(df::sample(oracle, schedule, c, 0, df::Sampler::Ddim, {}), UserError);
  EXPECT_THROW(df::sample(oracle, schedule, c, 101, df::Sampler::Ddim, {}), UserError);
  EXPECT_THROW(df::parse_sampler("euler"), UserError);
}

// MMD, COV and 1-NNA on one-point clouds, where every Chamfer distance is 2 |a - b|^2.
TEST(DiffusionMetrics, MatchHandComputedValues) {
  const torch::Tensor samples = torch::tensor({0.0, 0.0, 0.0, 1.0, 0.0, 0.0}, torch::kFloat64).view({2, 1, 3});
  const torch::Tensor refs = torch::tensor({0.1, 0.0, 0.0, 0.0, 3.0, 0.0}, torch::kFloat64).view({2, 1, 3});
  const torch::Tensor cd = df::chamfer_matrix(samples, refs);
  EXPECT_NEAR(cd[0][0].item<double>(), 0.02, 1e-12);
  EXPECT_NEAR(cd[1][1].item<double>(), 20.0, 1e-12);
  const df::GenerativeScores s = df::generative_scores(samples, refs);
  EXPECT_NEAR(s.mmd, (0.02 + 18.0) / 2, 1e-12);  // each reference's nearest sample
  EXPECT_DOUBLE_EQ(s.coverage, 0.5);             // both samples are nearest to reference 0
  EXPECT_DOUBLE_EQ(s.nna, 0.0);                  // every cloud's neighbour has the other label
  // Two sets far apart are told apart perfectly.
  torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const torch::Tensor near = torch::rand({4, 32, 3}, gen, torch::kFloat32);
  const df::GenerativeScores far = df::generative_scores(near, near + 10.0);
  EXPECT_DOUBLE_EQ(far.nna, 1.0);
  EXPECT_GT(far.mmd, 100.0);
  // Identical sets: no distance to the nearest, everything covered.
  const df::GenerativeScores same = df::generative_scores(near, near.clone());
  EXPECT_NEAR(same.mmd, 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(same.coverage, 1.0);
}

}  // namespace
}  // namespace tessera
