// The sharded 3DGS trainer (models/gaussians/gaussian_trainer.h) under mpiexec -n 1, 2, 3, 4 on a
// tiny synthetic scene: N ranks equal one rank (the reference runs on MPI_COMM_SELF on every rank).
#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "distributed/mpi_communicator.h"
#include "framework/data/scene.h"
#include "framework/data/synth.h"
#include "framework/memory.h"
#include "framework/config.h"
#include "framework/run.h"
#include "models/builtin.h"
#include "models/gaussians/gaussian_family.h"
#include "models/gaussians/gaussian_trainer.h"
#include "models/gaussians/ply.h"
#include "tests/bitwise_trace.h"
#include "tests/mpi_test_env.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

namespace gs = models::gaussians;

distributed::Communicator& world() { return test::cpu_world(); }

// Float reassociation bound: a Gaussian whose tiles lie in two ranks' blocks gets its gradient
// summed in another grouping; everything else is computed in the same order as on one rank.
constexpr double kTolerance = 1e-5;

// max |got - want| / max |want| (0 when both are all zero).
double relative_diff(const torch::Tensor& got, const torch::Tensor& want) {
  const torch::Tensor a = got.detach().to(torch::kFloat64), b = want.detach().to(torch::kFloat64);
  const double diff = a.numel() ? (a - b).abs().max().item<double>() : 0.0;
  const double scale = b.numel() ? b.abs().max().item<double>() : 0.0;
  return scale > 0 ? diff / scale : diff;
}

// Order-independent checksum of rows: sum over rows of (row index-free) float64 contents
// weighted by a per-id factor, so a lost, duplicated or misaligned row changes it.
double checksum(const torch::Tensor& ids, const torch::Tensor& rows) {
  const torch::Tensor w = (ids.to(torch::kFloat64) * 0.618034).frac() + 1.0;  // [N]
  return (rows.detach().to(torch::kFloat64).reshape({rows.size(0), -1}).sum(1) * w)
      .sum()
      .item<double>();
}

// 8 views (6 train) at 48x32 of the 'objects' preset, 4000 surface points: 4000 Gaussians.
class GaussianTrainerTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::make_shared_temp_dir("tessera-gtrain", [](const std::string& dir) {
      data::synth::SynthOptions so;
      so.preset = "objects";
      so.views = 8;
      so.width = 48;
      so.height = 32;
      data::synth::write_synth_scene(so, dir + "/scene.h5");
    });
    scene_ = std::make_unique<data::SceneReader>(dir_ + "/scene.h5");
  }
  static void TearDownTestSuite() {
    scene_.reset();
    test::remove_shared_temp_dir(dir_);
  }
  static gs::GaussianTrainerOptions options() {
    gs::GaussianTrainerOptions o;
    o.views_per_step = 2;
    o.seed = 3;
    o.sh_degree_interval = 1;  // degree 1 from the first step, 2 from the second, ...
    o.tile_size = 8;           // 6 x 4 tiles per view: blocks split inside views
    o.densify.densify_from = 1000000;  // off unless a test turns it on
    o.densify.opacity_reset_every = 1000000;
    o.rebalance_every = 0;
    // Adam with eps 1e-15 (INRIA) is sign descent: a gradient that is rounding noise (the quats'
    // at the isotropic init, |g| ~ 1e-11) moves its parameter by +-lr with a sign set by the
    // summation order, so N ranks and one rank would differ by 2 lr there after one step.
    // eps = 1e-8 bounds that amplification to lr |dg| / eps while leaving real gradients
    // (>= 1e-6 here) nearly sign-descent, so the comparison measures the sharding.
    o.rates.adam_eps = 1e-8;
    return o;
  }
  // Densification at s = 5 (from 4, every 5, until 9) with a threshold low enough that the
  // tiny images clone and split, and rebalancing checks every 3 steps.
  static gs::GaussianTrainerOptions densify_options() {
    gs::GaussianTrainerOptions o = options();
    o.densify.densify_from = 4;
    o.densify.densify_every = 5;
    o.densify.densify_until = 9;
    o.densify.grad_threshold = 2e-5;
    o.densify.seed = 7;
    o.rebalance_every = 3;
    o.rebalance_threshold = 1.05;
    // Over ten steps Adam divides small, partly-noise gradients by sqrt(v) (sh_rest, whose values
    // are at most ~10 x its lr = 2e-3): with eps 1e-8 the parameters differed by 1.7e-5
    // (2 ranks) and 1.1e-4 (3 ranks) relative in sh_rest. eps 1e-6 bounds that amplification.
    o.rates.adam_eps = 1e-6;
    return o;
  }
  static std::string dir_;
  static std::unique_ptr<data::SceneReader> scene_;
};
std::string GaussianTrainerTest::dir_;
std::unique_ptr<data::SceneReader> GaussianTrainerTest::scene_;

// (1) After one step: the rendered image of a view and every parameter's gradient equal the
// single-process run's.
TEST_F(GaussianTrainerTest, OneStepImageAndGradientsEqualOneRank) {
  install_counting_cpu_allocator();  // for the peak-memory figure printed below
  gs::GaussianTrainer trainer(world(), *scene_, options());
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  gs::GaussianTrainer reference(self, *scene_, options());
  EXPECT_EQ(trainer.global_count(), reference.local_count());
  EXPECT_EQ(trainer.batch_views(0), reference.batch_views(0));
  // At the init every Gaussian is a sphere (INRIA's isotropic init), so the quats' exact gradient
  // is 0 and what the kernels return (|g| ~ 1e-11) is rounding noise that no two summation
  // orders share: it is checked to be noise-sized and its difference printed, not compared.
  double worst = 0, loss_diff = 0, quat_noise = 0;
  for (int64_t t = 0; t < 1; ++t) {
    const gs::GaussianStepResult got_step = trainer.step(t), want_step = reference.step(t);
    loss_diff = std::max(loss_diff, std::abs(got_step.loss - want_step.loss) / want_step.loss);
    EXPECT_LE(loss_diff, kTolerance) << t << ": " << got_step.loss << " vs " << want_step.loss;
    const auto got = trainer.canonical_grads(), want = reference.canonical_grads();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].sizes(), want[i].sizes()) << gs::kGroupNames[i];
      const double d = relative_diff(got[i], want[i]);
      if (t == 0 && i == 2) {
        quat_noise = (got[i] - want[i]).abs().max().item<double>();
        EXPECT_LT(want[i].abs().max().item<double>(), 1e-9);  // noise, as explained above
        continue;
      }
      worst = std::max(worst, d);
      const int64_t at = (got[i] - want[i]).abs().argmax().item<int64_t>();
      EXPECT_LE(d, kTolerance) << "step " << t << ", gradient of " << gs::kGroupNames[i]
                               << ", worst element " << at << ": "
                               << got[i].reshape({-1})[at].item<double>() << " vs "
                               << want[i].reshape({-1})[at].item<double>();
      EXPECT_GT(want[i].abs().max().item<double>(), 0) << gs::kGroupNames[i];
    }
  }
  // Learning rates: INRIA's at s = 1 times sqrt(views_per_step).
  const auto lrs = gs::group_learning_rates(options().rates, trainer.extent(), 1);
  for (size_t i = 0; i < lrs.size(); ++i)
    EXPECT_NEAR(static_cast<torch::optim::AdamOptions&>(
                    trainer.optimizer().param_groups()[i].options()).lr(),
                lrs[i] * std::sqrt(2.0), 1e-12 * lrs[i])
        << gs::kGroupNames[i];
  // The uniform tile split (another partition, same result).
  gs::GaussianTrainerOptions uniform = options();
  uniform.tile_cost = gs::TileCostKind::Uniform;
  gs::GaussianTrainer by_count(world(), *scene_, uniform);
  by_count.step(0);
  const auto got_u = by_count.canonical_grads(), want_u = reference.canonical_grads();
  for (size_t i = 0; i < got_u.size(); ++i) {
    if (i == 2) continue;  // quats: noise at the init, see above
    EXPECT_LE(relative_diff(got_u[i], want_u[i]), kTolerance) << gs::kGroupNames[i];
  }
  const int64_t view = scene_->indices(data::Split::Train)[0];
  const torch::Tensor image = trainer.render(view), ref_image = reference.render(view);
  const double image_diff = relative_diff(image, ref_image);
  EXPECT_LE(image_diff, kTolerance);
  // Every rank holds the same full image.
  const torch::Tensor all = world().allgather(image.contiguous());
  for (int r = 0; r < world().size(); ++r) EXPECT_TRUE(torch::equal(all[r], image)) << r;
  if (world().rank() == 0)
    std::printf("[ sharded ] %d ranks, one step: loss rel diff %.3g, max gradient rel diff "
                "%.3g (step-0 quats: noise, abs diff %.3g), image rel diff %.3g, %lld Gaussians, "
                "peak %s on rank 0\n",
                world().size(), loss_diff, worst, quat_noise, image_diff,
                static_cast<long long>(reference.local_count()),
                format_bytes(trainer.memory().peak_bytes).c_str());
}

// gaussians.opacity_reg adds w x mean(sigmoid(logit)) over every Gaussian to the loss: each
// opacity logit's gradient gains (w / N) sigmoid'(logit), at any world size, and no other
// gradient changes.
TEST_F(GaussianTrainerTest, OpacityRegularizerAddsItsGradientAtAnyWorldSize) {
  gs::GaussianTrainerOptions reg = options();
  reg.opacity_reg = 0.5;
  gs::GaussianTrainer trainer(world(), *scene_, reg);
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  gs::GaussianTrainer plain(self, *scene_, options());
  const gs::GaussianStepResult with = trainer.forward_backward(0);
  const gs::GaussianStepResult without = plain.forward_backward(0);
  EXPECT_NEAR(with.loss, without.loss, kTolerance * without.loss)
      << "the reported loss is photometric";
  const auto got = trainer.canonical_grads(), want = plain.canonical_grads();
  const torch::Tensor o = torch::sigmoid(plain.canonical_params().opacity_logits);
  const double n = static_cast<double>(plain.local_count());
  const torch::Tensor added = o * (1 - o) * (0.5 / n);
  const torch::Tensor expected = want[3] + added;
  EXPECT_LE(relative_diff(got[3], expected), kTolerance);
  // The regularizer's part is not lost in the photometric one: it moves the gradient.
  EXPECT_GT(relative_diff(want[3], expected), 100 * kTolerance);
  for (size_t i : {0, 1, 4, 5})
    EXPECT_LE(relative_diff(got[i], want[i]), kTolerance) << gs::kGroupNames[i];
}

// (2) Ten steps with one densification and rebalancing: canonical parameters equal.
TEST_F(GaussianTrainerTest, TenStepsWithDensificationEqualOneRank) {
  gs::GaussianTrainer trainer(world(), *scene_, densify_options());
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  gs::GaussianTrainer reference(self, *scene_, densify_options());
  const gs::GaussianParams initial = reference.canonical_params();
  bool densified = false;
  for (int64_t t = 0; t < 10; ++t) {
    const gs::GaussianStepResult a = trainer.step(t), b = reference.step(t);
    densified = densified || a.densified;
    EXPECT_EQ(a.densified, b.densified) << t;
    EXPECT_EQ(a.cloned, b.cloned) << t;
    EXPECT_EQ(a.split, b.split) << t;
    EXPECT_EQ(a.pruned, b.pruned) << t;
    EXPECT_EQ(a.global_count, b.global_count) << t;
  }
  EXPECT_TRUE(densified);
  EXPECT_GT(trainer.global_count(), initial.size());  // clones and children were added
  const gs::GaussianParams got = trainer.canonical_params(), want = reference.canonical_params();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(torch::equal(trainer.canonical_ids(), reference.canonical_ids()));
  // Per Gaussian, its largest difference over the fields, relative to each field's scale. The
  // ranks sum a Gaussian's per-tile gradients in another order than one rank (float32, ~1e-7),
  // and the rasterizer's rules are steps: a pixel whose alpha sits at 1/255 or whose
  // transmittance sits at 1e-4 can be decided either way by that rounding, which changes the
  // gradients of the few Gaussians under that pixel discontinuously (seen: one Gaussian's sh_rest
  // gradient 1% apart at step 10, by 1, 2 ranks vs 3 ranks, with every other parameter within
  // 2e-7). Such a flip is allowed to 0.1% of the Gaussians and bounded (kFlipBound); a sharding
  // error (a misrouted row, a lost Adam moment) moves far more Gaussians, or one by far more.
  constexpr double kFlipBound = 1e-3;
  const auto gf = got.fields();
  const auto wf = want.fields();
  torch::Tensor per_gaussian = torch::zeros({want.size()}, torch::kFloat64);
  for (size_t i = 0; i < gf.size(); ++i) {
    const torch::Tensor a = gf[i]->detach().to(torch::kFloat64).reshape({want.size(), -1});
    const torch::Tensor b = wf[i]->detach().to(torch::kFloat64).reshape({want.size(), -1});
    const double scale = std::max(b.abs().max().item<double>(), 1e-30);
    per_gaussian = torch::maximum(per_gaussian, std::get<0>((a - b).abs().max(1)) / scale);
  }
  const torch::Tensor flipped = per_gaussian > kTolerance;
  const int64_t flips = flipped.sum().item<int64_t>();
  const double worst = per_gaussian.max().item<double>();
  const double rest = torch::where(flipped, torch::zeros_like(per_gaussian), per_gaussian)
                          .max()
                          .item<double>();
  EXPECT_LE(flips, std::max<int64_t>(1, want.size() / 1000));
  EXPECT_LE(worst, kFlipBound);
  EXPECT_FALSE(torch::equal(want.means.slice(0, 0, initial.size()), initial.means));  // trained
  if (world().rank() == 0)
    std::printf("[ sharded ] %d ranks, 10 steps: %lld -> %lld Gaussians, max parameter rel diff "
                "%.3g (%lld Gaussian(s) above %.0e: threshold flips; the rest within %.3g)\n",
                world().size(), static_cast<long long>(initial.size()),
                static_cast<long long>(want.size()), worst, static_cast<long long>(flips),
                kTolerance, rest);
}

// (3) A rebalance keeps every Gaussian exactly once, with its parameters and Adam moments.
TEST_F(GaussianTrainerTest, RebalanceKeepsEveryGaussianOnce) {
  gs::GaussianTrainerOptions o = densify_options();
  o.rebalance_every = 0;
  o.rebalance_threshold = 100;  // no automatic migration: densified rows stay where they are
  install_counting_cpu_allocator();
  gs::GaussianTrainer trainer(world(), *scene_, o);
  for (int64_t t = 0; t < 5; ++t) trainer.step(t);  // densifies at s = 5
  auto moments = [&] {
    std::vector<torch::Tensor> m;
    for (const torch::Tensor* f : trainer.local_params().fields()) {
      auto it = trainer.optimizer().state().find(f->unsafeGetTensorImpl());
      EXPECT_NE(it, trainer.optimizer().state().end());
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*it->second);
      m.push_back(torch::cat({s.exp_avg().reshape({f->size(0), -1}),
                              s.exp_avg_sq().reshape({f->size(0), -1})},
                             1));
    }
    return gs::gather_canonical(world(), trainer.global_ids(), torch::cat(m, 1), -1);
  };
  auto rows = [&] {
    std::vector<torch::Tensor> v;
    for (const torch::Tensor* f : trainer.local_params().fields())
      v.push_back(f->detach().reshape({f->size(0), -1}));
    return gs::gather_canonical(world(), trainer.global_ids(), torch::cat(v, 1), -1);
  };
  const int64_t count = trainer.global_count();
  const torch::Tensor ids = trainer.canonical_ids(), before = rows(), before_m = moments();
  const double sum_before = checksum(ids, before);
  // The rows move one tensor (and one 64-byte slice of a row) at a time while the trainer has
  // let go of its own references, so the rebalance holds little above the state it moves: the
  // state (parameters, two Adam moments, statistics) is about 720 bytes per Gaussian, and a copy
  // of it all, as a migration of every tensor at once makes, would be 100% of it. (The counting
  // allocator is installed before the trainer is made, so that the old rows' frees are counted.)
  const int64_t local = trainer.local_count();
  const int64_t state_bytes = local * (3 * 59 + 3) * 4;
  const int64_t start_bytes = memory_stats(torch::kCPU).current_bytes;
  reset_peak(torch::kCPU);
  const gs::RebalanceReport report = trainer.rebalance(true);
  const int64_t rise = memory_stats(torch::kCPU).peak_bytes - start_bytes;
  EXPECT_LT(rise, state_bytes / 2) << local << " Gaussians here, " << state_bytes
                                   << " bytes of state";
  if (world().rank() == 0)
    std::printf("[ memory  ] rebalance peak above its start: %lld bytes for %lld bytes of state\n",
                static_cast<long long>(rise), static_cast<long long>(state_bytes));
  EXPECT_TRUE(report.migrated);
  EXPECT_EQ(report.global_rows, count);
  EXPECT_EQ(trainer.global_count(), count);
  // gather_canonical throws on a duplicated id; equal ids and rows mean none was lost.
  EXPECT_TRUE(torch::equal(trainer.canonical_ids(), ids));
  const torch::Tensor after = rows();
  EXPECT_EQ(checksum(ids, after), sum_before);
  EXPECT_TRUE(torch::equal(after, before));
  EXPECT_TRUE(torch::equal(moments(), before_m));
  // Ids are unique and below the next id to assign.
  EXPECT_EQ(std::get<0>(torch::_unique(ids)).size(0), count);
  EXPECT_LT(ids.max().item<int64_t>(), trainer.next_global_id());
  // Training continues after the migration.
  const gs::GaussianStepResult r = trainer.step(5);
  EXPECT_TRUE(std::isfinite(r.loss));
  // The PLY export (rank 0) holds the canonical set.
  const std::string ply = dir_ + "/export.ply";
  trainer.export_ply(ply);
  const gs::GaussianParams canonical = trainer.canonical_params(0);
  if (world().rank() == 0) {
    const gs::GaussianParams read = gs::read_ply(ply);
    const auto a = read.fields();
    const auto b = canonical.fields();
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i]->detach(), *b[i])) << gs::kGroupNames[i];
  }
  // Gathered in chunks of 97 rows (after densification the ids have gaps): the same file, byte
  // for byte, and no temporary file left behind.
  const std::string chunked = dir_ + "/export-chunked.ply";
  const int64_t export_start = memory_stats(torch::kCPU).current_bytes;
  reset_peak(torch::kCPU);
  trainer.export_ply(chunked, 97);
  // No rank held the set: the whole set's parameters are 236 bytes per Gaussian (the default
  // chunk holds them all at this size, and every rank held them all before chunking).
  const int64_t export_rise = memory_stats(torch::kCPU).peak_bytes - export_start;
  EXPECT_LT(export_rise, trainer.global_count() * 236 / 4) << "export of 97-row chunks";
  if (world().rank() == 0) {
    EXPECT_EQ(test::read_file(chunked), test::read_file(ply));
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir_))
      files += entry.path().filename().string().rfind("export", 0) == 0;
    EXPECT_EQ(files, 2);
  }
  if (world().rank() == 0)
    std::printf("[ sharded ] %d ranks: rebalance of %lld Gaussians, rank 0 sent %lld received "
                "%lld, checksum %.17g\n",
                world().size(), static_cast<long long>(count),
                static_cast<long long>(report.rows_sent),
                static_cast<long long>(report.rows_received), sum_before);
}

// (4) Densification decides the same Gaussians as on one rank: the same set of global ids.
TEST_F(GaussianTrainerTest, DensificationDecisionsEqualOneRank) {
  gs::GaussianTrainer trainer(world(), *scene_, densify_options());
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  gs::GaussianTrainer reference(self, *scene_, densify_options());
  const int64_t first_new = reference.next_global_id();
  gs::GaussianStepResult a, b;
  for (int64_t t = 0; t < 5; ++t) {
    a = trainer.step(t);
    b = reference.step(t);
  }
  ASSERT_TRUE(a.densified);
  EXPECT_GT(b.cloned + b.split, 0);
  EXPECT_EQ(a.cloned, b.cloned);
  EXPECT_EQ(a.split, b.split);
  EXPECT_EQ(a.pruned, b.pruned);
  const torch::Tensor got = trainer.canonical_ids(), want = reference.canonical_ids();
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ((got != want).sum().item<int64_t>(), 0);
  EXPECT_EQ(trainer.next_global_id(), reference.next_global_id());
  const int64_t new_rows = (want >= first_new).sum().item<int64_t>();
  EXPECT_GT(new_rows, 0);
  if (world().rank() == 0)
    std::printf("[ sharded ] %d ranks: densification cloned %lld, split %lld, pruned %lld; "
                "%lld new ids, all equal to the 1-rank ids\n",
                world().size(), static_cast<long long>(b.cloned),
                static_cast<long long>(b.split), static_cast<long long>(b.pruned),
                static_cast<long long>(new_rows));
}


// ---- Snapshots and resume (models/gaussians/gaussian_trainer_snapshot.cpp) ------------------

// The trainer's parameters, Adam moments (zeros without state) and densify statistics, each
// [N, *] in canonical order, then the ids: comparable bitwise whatever the ownership.
std::vector<torch::Tensor> canonical_state(gs::GaussianTrainer& trainer,
                                           distributed::Communicator& comm) {
  std::vector<torch::Tensor> out;
  const torch::Tensor& ids = trainer.global_ids();
  for (const torch::Tensor* f : trainer.local_params().fields()) {
    out.push_back(gs::gather_canonical(comm, ids, f->detach(), -1));
    auto it = trainer.optimizer().state().find(f->unsafeGetTensorImpl());
    const bool has = it != trainer.optimizer().state().end();
    const auto* st = has ? static_cast<const torch::optim::AdamParamState*>(it->second.get())
                         : nullptr;
    for (int m = 0; m < 2; ++m) {
      const torch::Tensor v = st ? (m == 0 ? st->exp_avg() : st->exp_avg_sq())
                                 : torch::zeros_like(f->detach());
      out.push_back(gs::gather_canonical(comm, ids, v, -1));
    }
  }
  out.push_back(trainer.canonical_ids());
  return out;
}

// (6) run.deterministic (docs/training_loop.md, "Bitwise at any world size"): 20 steps with
// densification at s = 5, rebalancing every 3 steps and 2 views a step, at INRIA's Adam eps 1e-15,
// on N ranks at 3 threads each equal one rank at 1 thread bit for bit: every step's loss and
// counts, and every parameter, Adam moment and global id; with a memory budget of one view a
// pass too. The float path on the same options is not bitwise across world sizes (what this test
// would catch if a float sum came back into the gradient's path).
std::vector<torch::Tensor> canonical_state(gs::GaussianTrainer& trainer,
                                           distributed::Communicator& comm);

struct GaussianTrace {
  std::vector<double> numbers;  // each step's loss and counts
  std::vector<torch::Tensor> state;
};

GaussianTrace trace_of(distributed::Communicator& comm, const data::SceneReader& scene,
                       const gs::GaussianTrainerOptions& o, int threads) {
  test::IntraOpThreads pinned(threads);
  gs::GaussianTrainer trainer(comm, scene, o);
  GaussianTrace trace;
  for (int64_t t = 0; t < 20; ++t) {
    const gs::GaussianStepResult r = trainer.step(t);
    trace.numbers.insert(trace.numbers.end(),
                         {r.loss, static_cast<double>(r.cloned), static_cast<double>(r.split),
                          static_cast<double>(r.pruned), static_cast<double>(r.global_count),
                          static_cast<double>(r.views_per_pass)});
  }
  trace.state = canonical_state(trainer, comm);
  return trace;
}

bool same_state(const GaussianTrace& a, const GaussianTrace& b) {
  if (a.state.size() != b.state.size()) return false;
  for (size_t i = 0; i < a.state.size(); ++i)
    if (!a.state[i].sizes().equals(b.state[i].sizes()) || !torch::equal(a.state[i], b.state[i]))
      return false;
  return true;
}

TEST_F(GaussianTrainerTest, DeterministicNRanksEqualOneRankBitwise) {
  gs::GaussianTrainerOptions o = densify_options();
  o.rates.adam_eps = 1e-15;
  o.deterministic = true;
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  const GaussianTrace want = trace_of(self, *scene_, o, 1);
  const GaussianTrace got = trace_of(world(), *scene_, o, 3);
  ASSERT_EQ(got.numbers.size(), want.numbers.size());
  for (size_t i = 0; i < want.numbers.size(); ++i)
    EXPECT_EQ(got.numbers[i], want.numbers[i]) << "step " << i / 6 << ", number " << i % 6;
  ASSERT_EQ(got.state.size(), want.state.size());
  for (size_t i = 0; i < want.state.size(); ++i) {
    ASSERT_EQ(got.state[i].sizes(), want.state[i].sizes()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(got.state[i], want.state[i]))
        << "tensor " << i << " (field i / 3, then its two moments; last: ids): "
        << got.state[i].ne(want.state[i]).sum().item<int64_t>() << " values differ";
  }
  double added = 0;  // clones and split children over the run
  for (size_t i = 0; i < want.numbers.size(); i += 6) added += want.numbers[i + 1] + want.numbers[i + 2];
  EXPECT_GT(added, 0) << "the run densified";
  // A memory budget (checkpoint.policy budget) that fits one view a pass of every Gaussian but
  // two of a share of them: on this path the split is the one rank's at any world size, so the
  // bits are too (each rank's own share would give N ranks passes of 2 views).
  gs::GaussianTrainerOptions budget = o;
  const int64_t pixels =
      static_cast<int64_t>(scene_->cameras()[0].width) * scene_->cameras()[0].height;
  budget.memory_budget_bytes =
      2 * gs::GaussianTrainer::estimate_view_bytes(scene_->read_points_xyz().size(0), pixels) - 1;
  const GaussianTrace budget_one = trace_of(self, *scene_, budget, 1);
  EXPECT_EQ(budget_one.numbers[5], 1) << "one view a pass";
  const GaussianTrace budget_many = trace_of(world(), *scene_, budget, 2);
  EXPECT_EQ(budget_many.numbers, budget_one.numbers);
  EXPECT_TRUE(same_state(budget_many, budget_one));
  if (world().size() > 1) {
    o.deterministic = false;
    EXPECT_FALSE(same_state(trace_of(self, *scene_, o, 1), trace_of(world(), *scene_, o, 1)));
  }
}

// A GaussianFamily trained by the framework's TrainingRun, as `tessera train` runs it;
// snapshots in `out_dir` ("" = none written).
struct GaussianRun {
  gs::GaussianFamily family;
  TrainingRun run;
  GaussianRun(distributed::Communicator& comm, const data::SceneReader& scene,
              const gs::GaussianTrainerOptions& o, int64_t steps, const std::string& out_dir = "",
              bool parallel = true)
      : family(comm, scene, o), run(*test::g_context, comm, family, scene,
                                    run_options(o, steps, out_dir, parallel)) {}
  static RunOptions run_options(const gs::GaussianTrainerOptions& o, int64_t steps,
                                const std::string& out_dir, bool parallel) {
    RunOptions r;
    r.steps = steps;
    r.seed = o.seed;
    r.out_dir = out_dir;
    r.progress = false;
    r.not_learning_steps = 0;
    r.snapshot_parallel = parallel;
    r.snapshot_keep = 0;
    return r;
  }
  gs::GaussianTrainer& trainer() { return family.trainer(); }
};

// (5) Snapshots (the TrainingRun's, the family's state in them) at step 3 (before the
// densification at s = 5, so the resumed run densifies from restored statistics) and at step 6
// (after it and a rebalance; written gathered, not in parallel), each resumed by a fresh run and
// trained to step 8: at the same world size every parameter, Adam moment and id equals the
// uninterrupted run's bitwise. A one-rank run (MPI_COMM_SELF: another world size when N > 1)
// resuming the N-rank snapshot agrees within the reassociation tolerance.
// read_snapshot_params gives the canonical set of the step the snapshot was written at.
TEST_F(GaussianTrainerTest, SnapshotResumeIsExact) {
  constexpr int64_t kEnd = 8;
  GaussianRun straight(world(), *scene_, densify_options(), kEnd, dir_ + "/resume-run");
  for (int64_t t = 0; t < 3; ++t) straight.run.train_step(t);
  const std::string early = straight.run.save_snapshot();
  bool densified = false;
  for (int64_t t = 3; t < 6; ++t)
    densified = straight.run.train_step(t).fields.contains("densified") || densified;
  ASSERT_TRUE(densified);
  GaussianRun gathered(world(), *scene_, densify_options(), kEnd, dir_ + "/resume-run-gathered",
                       /*parallel=*/false);
  for (int64_t t = 0; t < 6; ++t) gathered.run.train_step(t);
  const std::string late = gathered.run.save_snapshot();
  const gs::GaussianParams at_late = straight.trainer().canonical_params();
  for (int64_t t = 6; t < kEnd; ++t) straight.run.train_step(t);
  const std::vector<torch::Tensor> want = canonical_state(straight.trainer(), world());
  const char* names[] = {"means", "m.exp_avg", "m.exp_avg_sq", "scales", "s.exp_avg",
                         "s.exp_avg_sq", "quats", "q.exp_avg", "q.exp_avg_sq", "opacities",
                         "o.exp_avg", "o.exp_avg_sq", "sh_dc", "dc.exp_avg", "dc.exp_avg_sq",
                         "sh_rest", "r.exp_avg", "r.exp_avg_sq", "ids"};

  // The snapshot's canonical set (no MPI involved: every rank reads the file).
  int64_t step = -1;
  const gs::GaussianParams read = gs::read_snapshot_params(late, &step);
  EXPECT_EQ(step, 6);
  for (size_t i = 0; i < 6; ++i)
    EXPECT_TRUE(torch::equal(read.fields()[i]->detach(), *at_late.fields()[i]))
        << gs::kGroupNames[i];

  for (const auto& [path, from] :
       {std::make_pair(early, int64_t{3}), std::make_pair(late, int64_t{6})}) {
    GaussianRun resumed(world(), *scene_, densify_options(), kEnd);
    resumed.run.load_snapshot(path);
    EXPECT_EQ(resumed.run.next_step(), from);
    EXPECT_EQ(resumed.trainer().steps_done(), from);
    for (int64_t t = from; t < kEnd; ++t) resumed.run.train_step(t);
    EXPECT_EQ(resumed.trainer().next_global_id(), straight.trainer().next_global_id());
    const std::vector<torch::Tensor> got = canonical_state(resumed.trainer(), world());
    ASSERT_EQ(got.size(), want.size());
    int differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].sizes(), want[i].sizes()) << names[i] << " from step " << from;
      const bool same = torch::equal(got[i], want[i]);
      differ += same ? 0 : 1;
      EXPECT_TRUE(same) << names[i] << " from step " << from << ": relative difference "
                        << relative_diff(got[i], want[i]);
    }
    if (world().rank() == 0)
      std::printf("[ resume  ] %d ranks, snapshot at step %lld resumed to step %lld: %d of %zu "
                  "tensors differ bitwise\n",
                  world().size(), static_cast<long long>(from), static_cast<long long>(kEnd),
                  differ, got.size());
  }

  // Another world size: one rank resumes the N-rank snapshot of step 3.
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  GaussianRun single(self, *scene_, densify_options(), kEnd);
  single.run.load_snapshot(early);
  EXPECT_EQ(single.run.next_step(), 3);
  for (int64_t t = 3; t < kEnd; ++t) single.run.train_step(t);
  const std::vector<torch::Tensor> got = canonical_state(single.trainer(), self);
  ASSERT_EQ(got.back().sizes(), want.back().sizes());
  EXPECT_TRUE(torch::equal(got.back(), want.back())) << "ids";
  double worst = 0;
  for (size_t i = 0; i < got.size(); i += 3) {  // the parameters
    const double d = relative_diff(got[i], want[i]);
    worst = std::max(worst, d);
    EXPECT_LE(d, kTolerance) << names[i];
  }
  if (world().rank() == 0)
    std::printf("[ resume  ] %d-rank snapshot resumed on 1 rank: max parameter rel diff %.3g\n",
                world().size(), worst);

  // A missing snapshot: the same error on every rank, nothing changed.
  try {
    single.run.load_snapshot(dir_ + "/missing.h5");
    ADD_FAILURE() << "no error for a missing snapshot";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("missing.h5"), std::string::npos) << e.what();
  }
  EXPECT_EQ(single.run.next_step(), kEnd);
  EXPECT_EQ(single.trainer().steps_done(), kEnd);
}

// (5b) run.deterministic: the N-rank snapshot of step 3 (before the densification at s = 5 and
// the rebalances) resumed on one rank continues to step 8 with every parameter, Adam moment,
// densification statistic and id of the uninterrupted N-rank run, bit for bit.
TEST_F(GaussianTrainerTest, DeterministicResumeAtAnotherWorldSizeIsBitwise) {
  constexpr int64_t kEnd = 8;
  gs::GaussianTrainerOptions o = densify_options();
  o.rates.adam_eps = 1e-15;
  o.deterministic = true;
  GaussianRun straight(world(), *scene_, o, kEnd, dir_ + "/resume-deterministic");
  for (int64_t t = 0; t < 3; ++t) straight.run.train_step(t);
  const std::string early = straight.run.save_snapshot();
  for (int64_t t = 3; t < kEnd; ++t) straight.run.train_step(t);
  const std::vector<torch::Tensor> want = canonical_state(straight.trainer(), world());
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  GaussianRun single(self, *scene_, o, kEnd);
  single.run.load_snapshot(early);
  ASSERT_EQ(single.run.next_step(), 3);
  for (int64_t t = 3; t < kEnd; ++t) single.run.train_step(t);
  const std::vector<torch::Tensor> got = canonical_state(single.trainer(), self);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << "tensor " << i;
    EXPECT_TRUE(torch::equal(got[i], want[i]))
        << "tensor " << i << ": " << got[i].ne(want[i]).sum().item<int64_t>() << " values differ";
  }
}

}  // namespace
}  // namespace tessera

// ---- Dynamic sampling, coarse to fine and per-pass accumulation ----
namespace tessera {
namespace {

// Largest relative difference over the six canonical fields of two trainers.
double worst_param_diff(gs::GaussianTrainer& a, gs::GaussianTrainer& b) {
  const gs::GaussianParams x = a.canonical_params(), y = b.canonical_params();
  if (x.size() != y.size()) return 1e30;
  const auto xf = x.fields();
  const auto yf = y.fields();
  double worst = 0;
  for (size_t i = 0; i < xf.size(); ++i) worst = std::max(worst, relative_diff(*xf[i], *yf[i]));
  return worst;
}

// The view sampling schedule: an epoch starting at step s visits ceil(r(s) n) distinct views of
// its permutation, batches wrap inside the pool, and the batches are a pure function of
// (seed, step), not of the trainer's history.
TEST_F(GaussianTrainerTest, ViewSamplingVisitsTheScheduledFractionPerEpoch) {
  gs::GaussianTrainerOptions o = options();
  o.views_per_step = 1;
  o.steps = 40;
  o.sampling.name = "step";  // rate 1 for steps 0..9, 0.5 from 10, 0.25 from 20 (min 1/3)
  o.sampling.rate_max = 1.0;
  o.sampling.rate_min = 1.0 / 3.0;
  o.sampling.step_every = 10;
  o.sampling.step_factor = 0.5;
  gs::GaussianTrainer trainer(world(), *scene_, o);
  gs::GaussianTrainer fresh(world(), *scene_, o);
  // 6 train views. Epochs: [0, 6) rate 1 pool 6; [6, 12) rate r(6) = 1 pool 6;
  // [12, 15) rate r(12) = 0.5 pool 3; [15, 18) ...; from step 21 r = 1/3: pool 2.
  const std::vector<std::pair<int64_t, int64_t>> epochs = {{0, 6}, {6, 6}, {12, 3}, {15, 3},
                                                           {18, 3}, {21, 2}, {23, 2}};
  std::vector<std::vector<int64_t>> seen;
  for (const auto& [first, pool] : epochs) {
    std::vector<int64_t> views;
    for (int64_t t = first; t < first + pool; ++t) views.push_back(trainer.batch_views(t)[0]);
    std::vector<int64_t> sorted = views;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::unique(sorted.begin(), sorted.end()) - sorted.begin(), pool)
        << "epoch at " << first << " repeats a view";
    EXPECT_NEAR(trainer.sampling_rate_at(first), o.sampling.rate_max * std::max(
        std::pow(0.5, static_cast<double>(first / 10)), 1.0 / 3.0), 1e-12) << first;
    seen.push_back(sorted);
  }
  EXPECT_NE(seen[2], seen[3]);  // a new subset each epoch (fixed seed: they differ)
  // Asked for late steps first, a fresh trainer draws the same batches.
  for (int64_t t : {30, 3, 22, 12})
    EXPECT_EQ(fresh.batch_views(t), trainer.batch_views(t)) << t;
}

// Coarse to fine with reduced view sampling still gives N ranks = one rank, at the scheduled
// resolution.
TEST_F(GaussianTrainerTest, CoarseToFineAndSamplingEqualOneRank) {
  gs::GaussianTrainerOptions o = options();
  o.num_downscales = 1;
  o.resolution_schedule = 2;  // scale 2 for steps 0 and 1, then 1
  o.sampling.name = "linear";
  o.sampling.rate_max = 1.0;
  o.sampling.rate_min = 0.5;
  o.steps = 4;
  o.rates.adam_eps = 1e-6;  // as in densify_options(): 1e-8 gave 9.7e-5 on 3 ranks (sh_rest)
  gs::GaussianTrainer trainer(world(), *scene_, o);
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  gs::GaussianTrainer reference(self, *scene_, o);
  for (int64_t t = 0; t < 4; ++t) {
    const gs::GaussianStepResult a = trainer.step(t), b = reference.step(t);
    EXPECT_EQ(a.resolution_scale, t < 2 ? 2.0 : 1.0) << t;
    EXPECT_EQ(a.views, b.views) << t;
    EXPECT_NEAR(a.loss, b.loss, 1e-6 * std::abs(b.loss)) << t;
  }
  EXPECT_LE(worst_param_diff(trainer, reference), kTolerance);
}

// A budget's plan (framework/budget.h) rescales the schedules written for `steps` and keeps
// the periods; each plan scales the constructed values, not the last plan's. step_cost follows
// the resolution: a quarter of the pixels at half resolution.
TEST_F(GaussianTrainerTest, APlanRescalesTheSchedulesAndStepCostFollowsTheResolution) {
  gs::GaussianTrainerOptions o = options();
  o.steps = 100;
  o.num_downscales = 2;
  o.resolution_schedule = 20;
  o.sh_degree_interval = 30;
  o.rates.means_decay_steps = 100;
  o.densify.densify_from = 10;
  o.densify.densify_until = 50;
  o.densify.densify_every = 7;
  o.densify.opacity_reset_every = 40;
  o.sampling.total_steps = 100;
  gs::GaussianTrainer trainer(world(), *scene_, o);
  EXPECT_DOUBLE_EQ(trainer.step_cost(0), 2.0 / 16.0);  // 2 views a step at 1/4 the size
  EXPECT_DOUBLE_EQ(trainer.step_cost(20), 2.0 / 4.0);
  EXPECT_DOUBLE_EQ(trainer.step_cost(40), 2.0);
  for (const auto& [steps, factor] : {std::pair<int64_t, double>{250, 2.5}, {50, 0.5}}) {
    trainer.set_total_steps(steps);
    const gs::GaussianTrainerOptions& p = trainer.options();
    EXPECT_EQ(p.steps, steps);
    EXPECT_EQ(p.resolution_schedule, std::llround(20 * factor));
    EXPECT_EQ(p.sh_degree_interval, std::llround(30 * factor));
    EXPECT_EQ(p.rates.means_decay_steps, std::llround(100 * factor));
    EXPECT_EQ(p.densify.densify_from, std::llround(10 * factor));
    EXPECT_EQ(p.densify.densify_until, std::llround(50 * factor));
    EXPECT_EQ(p.sampling.total_steps, steps);
    EXPECT_EQ(p.densify.densify_every, 7);  // periods stay
    EXPECT_EQ(p.densify.opacity_reset_every, 40);
    EXPECT_DOUBLE_EQ(trainer.step_cost(p.resolution_schedule - 1), 2.0 / 16.0);
    EXPECT_DOUBLE_EQ(trainer.step_cost(p.resolution_schedule), 2.0 / 4.0);
  }
}

// Views processed one per pass against a memory budget: the same gradients as one pass (they
// add up), the same training, a lower peak, and estimate_view_bytes above what a view
// measurably holds (the budget is kept) but not wildly so.
TEST_F(GaussianTrainerTest, OneViewPerPassMatchesOnePassWithLowerPeak) {
  install_counting_cpu_allocator();
  gs::GaussianTrainerOptions all = options();
  all.views_per_step = 4;
  all.rates.adam_eps = 1e-6;  // as in densify_options(): bounds Adam's amplification of rounding
  gs::GaussianTrainerOptions budget = all;
  gs::GaussianTrainer whole(world(), *scene_, all);
  // The budget admits one view (of the largest rank) but not two.
  const data::Camera& cam = scene_->cameras()[0];
  torch::Tensor local = torch::tensor({whole.local_count()}, torch::kInt64);
  world().allreduce(local, distributed::ReduceOp::Max);
  budget.memory_budget_bytes = gs::GaussianTrainer::estimate_view_bytes(
      local.item<int64_t>() + 1, int64_t{cam.width} * cam.height) * 3 / 2;
  gs::GaussianTrainer passes(world(), *scene_, budget);
  int64_t peak[2] = {0, 0};
  for (int64_t t = 0; t < 3; ++t) {
    gs::GaussianTrainer* trainers[2] = {&whole, &passes};
    gs::GaussianStepResult r[2];
    for (int k = 0; k < 2; ++k) {
      reset_peak(torch::kCPU);
      const int64_t before = trainers[k]->memory().current_bytes;
      r[k] = trainers[k]->step(t);
      peak[k] = std::max(peak[k], trainers[k]->memory().peak_bytes - before);
    }
    EXPECT_EQ(r[0].views_per_pass, 4);
    EXPECT_EQ(r[1].views_per_pass, 1);
    EXPECT_NEAR(r[1].loss, r[0].loss, 1e-6 * r[0].loss) << t;
    if (t == 0) {
      const auto g1 = passes.canonical_grads(), g4 = whole.canonical_grads();
      for (size_t i = 0; i < g1.size(); ++i) {
        if (i == 2) continue;  // quats: rounding noise at the isotropic init (first test)
        EXPECT_LE(relative_diff(g1[i], g4[i]), kTolerance) << gs::kGroupNames[i];
      }
    }
  }
  EXPECT_LE(worst_param_diff(passes, whole), kTolerance);
  // Four views at once hold about three views more than one at a time.
  const double per_view = static_cast<double>(peak[0] - peak[1]) / 3.0;
  const double estimate = static_cast<double>(gs::GaussianTrainer::estimate_view_bytes(
      passes.local_count(), int64_t{cam.width} * cam.height));
  EXPECT_LT(peak[1], peak[0]);
  if (world().size() == 1) {  // the estimate models one rank's view; sharded, it is conservative
    EXPECT_GE(estimate, per_view);
    EXPECT_LE(estimate, 4.0 * per_view);
  }
  if (world().rank() == 0)
    std::printf("[ passes  ] %d ranks: step peak one pass %lld B, one view per pass %lld B "
                "(%.2fx); measured %.0f B per view, estimated %.0f B\n",
                world().size(), static_cast<long long>(peak[0]), static_cast<long long>(peak[1]),
                static_cast<double>(peak[1]) / peak[0], per_view, estimate);
}

// Training can start from a PLY: the trainer's initial set is the file's Gaussians, bit for bit
// and in the file's order as global ids, whatever the world size; a bad file is a UserError.
TEST_F(GaussianTrainerTest, StartsFromAPly) {
  gs::GaussianTrainer trained(world(), *scene_, options());
  for (int64_t t = 0; t < 2; ++t) trained.step(t);
  const std::string ply = dir_ + "/start-" + std::to_string(world().size()) + ".ply";
  trained.export_ply(ply);
  world().barrier();
  gs::GaussianTrainerOptions o = options();
  o.init_ply = ply;
  gs::GaussianTrainer started(world(), *scene_, o);
  const gs::GaussianParams want = gs::read_ply(ply), got = started.canonical_params();
  ASSERT_EQ(got.size(), want.size());
  const auto gf = got.fields();
  const auto wf = want.fields();
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_TRUE(torch::equal(gf[i]->detach(), wf[i]->detach())) << gs::kGroupNames[i];
  EXPECT_TRUE(torch::equal(started.canonical_ids(), torch::arange(want.size(), torch::kInt64)));
  EXPECT_EQ(started.next_global_id(), want.size());
  o.init_ply = dir_ + "/missing.ply";
  EXPECT_THROW(gs::GaussianTrainer(world(), *scene_, o), UserError);
}

// Without points the initial set is the stereo points of the train views, then random ones up
// to random_count, the same rows at every world size (each rank matches a slice of the views);
// with stereo_init = false it is random_count random ones.
TEST_F(GaussianTrainerTest, WithoutPointsStartsFromStereoPointsAtAnyWorldSize) {
  const std::string path = dir_ + "/no-points-" + std::to_string(world().size()) + ".h5";
  if (world().rank() == 0) {  // this suite's scene without its /points
    data::SceneWriter writer(path, scene_->meta(), scene_->cameras(), scene_->has_alpha());
    for (size_t i = 0; i < scene_->cameras().size(); ++i)
      writer.write_image(i, scene_->read_image(i),
                         scene_->has_alpha() ? scene_->read_alpha(i) : torch::Tensor());
    writer.commit();
  }
  world().barrier();
  const data::SceneReader bare(path);
  ASSERT_FALSE(bare.has_points());
  gs::GaussianTrainerOptions o = options();
  o.init.random_count = 600;
  gs::GaussianTrainer trainer(world(), bare, o);
  const gs::GaussianParams got = trainer.canonical_params();

  std::vector<int64_t> train;
  for (size_t i : bare.indices(data::Split::Train)) train.push_back(static_cast<int64_t>(i));
  gs::StereoOptions so;
  so.points = o.init.random_count * 3 / 4;
  const gs::StereoPoints stereo = gs::stereo_points(bare, train, so);  // one process, all views
  const int64_t s = stereo.xyz.size(0);
  ASSERT_GT(s, 0);
  gs::InitOptions io = o.init;
  const gs::RandomPoints random = gs::random_points(bare.meta().scene_bounds, io, 600 - s);
  ASSERT_EQ(got.size(), 600);
  EXPECT_TRUE(torch::equal(got.means.detach().slice(0, 0, s), stereo.xyz));
  EXPECT_TRUE(torch::equal(got.means.detach().slice(0, s), random.means));

  o.stereo_init = false;
  gs::GaussianTrainer all_random(world(), bare, o);
  EXPECT_TRUE(torch::equal(all_random.canonical_params().means.detach(),
                           gs::random_points(bare.meta().scene_bounds, io, 600).means));
}

// ---- The gaussians family behind the framework's TrainingRun (framework/run.h) ------------------------

// A config of the gaussians family on this suite's scene; no run directory.
Config gaussian_run_config(const std::string& scene, int64_t steps) {
  FamilyRegistry families;  // [gaussians] joins the config schema
  models::register_builtin_families(families);
  return parse_config("[model]\nname = \"gaussians\"\n[gaussians]\nviews_per_step = 2\n"
                      "[train]\nsteps = " + std::to_string(steps) + "\n"
                      "[data]\npath = \"" + scene + "\"\n[run]\nseed = 3\n",
                      "gaussian-run test");
}

RunOptions quiet(const Config& config) {
  RunOptions o = run_options(config);
  o.out_dir = "";
  o.progress = false;
  o.log_every = 0;
  o.check_agreement = true;
  return o;
}

// Forwards every hook to a GaussianFamily, and at step `step` makes one gradient value of rank
// `rank` non-finite after the backward: the other ranks' gradients stay finite, so only the
// agreed flag can make them skip.
class PoisonOneRank : public ModelFamily {
 public:
  PoisonOneRank(gs::GaussianFamily& inner, int64_t step, int rank)
      : inner_(inner), step_(step), rank_(rank) {}
  std::string model_name() const override { return inner_.model_name(); }
  std::string work_unit() const override { return inner_.work_unit(); }
  StepRecord forward_backward(const StepControl& control) override {
    current_ = control.step;
    return inner_.forward_backward(control);
  }
  std::vector<torch::Tensor> gradients() override {
    std::vector<torch::Tensor> grads = inner_.gradients();
    torch::NoGradGuard no_grad;
    if (current_ == step_ && world().rank() == rank_) grads[0].view({-1})[0].fill_(std::nan(""));
    local_nonfinite_ = 0;
    for (const torch::Tensor& g : grads)
      if (g.defined()) local_nonfinite_ += (~torch::isfinite(g)).sum().item<int64_t>();
    return grads;
  }
  void apply_step(const StepControl& c, bool skipped, StepRecord& r) override {
    inner_.apply_step(c, skipped, r);
  }
  EvalScores evaluate(int64_t step, const std::vector<size_t>& views,
                      const ImageSink& on_image) override {
    return inner_.evaluate(step, views, on_image);
  }
  void save_state(SnapshotWriter& writer) override { inner_.save_state(writer); }
  void load_state(const SnapshotReader& reader) override { inner_.load_state(reader); }
  int64_t local_nonfinite_ = 0;  // of the last gradients() call on this rank

 private:
  gs::GaussianFamily& inner_;
  int64_t step_ = 0, current_ = -1;
  int rank_ = 0;
};

// A non-finite gradient on one rank skips the step on every rank (the agreed flag): no row and
// no Adam moment changes on any rank, the next step trains, and the loss scaler counts the skip.
TEST_F(GaussianTrainerTest, RunSkipsANonFiniteStepOnEveryRank) {
  const Config config = gaussian_run_config(dir_ + "/scene.h5", 6);
  gs::GaussianFamily family(FamilyContext{config, *test::g_context, world(), *scene_,
                                          torch::Device(torch::kCPU)});
  const int last = world().size() - 1;
  PoisonOneRank poisoned(family, /*step=*/2, last);
  TrainingRun run(*test::g_context, world(), poisoned, *scene_, quiet(config));
  for (int64_t t = 0; t < 2; ++t) EXPECT_FALSE(run.train_step(t).skipped) << t;
  const gs::GaussianParams before = family.trainer().canonical_params();
  const torch::Tensor& means = family.trainer().local_params().means;
  auto moment = [&] {
    const auto& state = family.trainer().optimizer().state();
    const auto it = state.find(means.unsafeGetTensorImpl());
    return it == state.end() ? torch::Tensor()
                             : static_cast<torch::optim::AdamParamState&>(*it->second).exp_avg().clone();
  };
  const torch::Tensor moment_before = moment();
  const StepRecord skipped = run.train_step(2);
  EXPECT_TRUE(skipped.skipped);
  if (world().rank() != last) {
    EXPECT_EQ(poisoned.local_nonfinite_, 0) << "this rank skipped on the agreed flag alone";
  }
  const gs::GaussianParams after = family.trainer().canonical_params();
  const auto b = before.fields(), a = after.fields();
  for (size_t i = 0; i < b.size(); ++i) EXPECT_TRUE(torch::equal(*a[i], *b[i])) << "field " << i;
  ASSERT_TRUE(moment_before.defined());
  EXPECT_TRUE(torch::equal(moment(), moment_before)) << "Adam's first moment changed";
  const StepRecord next = run.train_step(3);
  EXPECT_FALSE(next.skipped);
  EXPECT_TRUE(std::isfinite(next.loss));
  EXPECT_EQ(run.loss_scaler().skipped_steps(), 1);
  EXPECT_EQ(family.trainer().steps_done(), 4);
  const gs::GaussianParams trained = family.trainer().canonical_params();
  EXPECT_FALSE(torch::equal(trained.means, after.means)) << "the step after the skip trained";
  EXPECT_TRUE(torch::isfinite(trained.means).all().item<bool>());
}

// train.max_skipped_steps non-finite steps in a row stop a Gaussian run with an error.
TEST_F(GaussianTrainerTest, RepeatedNonFiniteStepsStopAGaussianRun) {
  const Config config = gaussian_run_config(dir_ + "/scene.h5", 50);
  gs::GaussianFamily family(FamilyContext{config, *test::g_context, world(), *scene_,
                                          torch::Device(torch::kCPU)});
  RunOptions o = quiet(config);
  o.max_skipped_steps = 3;
  TrainingRun run(*test::g_context, world(), family, *scene_, o);
  family.trainer().loss_hook = [&](int64_t step, torch::Tensor& loss) {
    if (step >= 3 && world().rank() == 0) loss = loss * std::numeric_limits<float>::quiet_NaN();
  };
  try {
    run.run();
    ADD_FAILURE() << "the run did not stop";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("training stopped at step 6"), std::string::npos)
        << e.what();
  }
}

// train.precision = "bf16" on a Gaussian run: the render runs under autocast, but its kernels
// compute in float32 and the loss (SSIM's variances cancel in bf16) is kept in float32, so the
// run equals the fp32 run exactly. A change that lets autocast reach the loss fails here.
TEST_F(GaussianTrainerTest, Bf16RunKeepsTheLossAndKernelsInFloat32) {
  const Config config = gaussian_run_config(dir_ + "/scene.h5", 3);
  const FamilyContext context{config, *test::g_context, world(), *scene_,
                              torch::Device(torch::kCPU)};
  gs::GaussianFamily fp32(context), bf16(context);
  TrainingRun reference(*test::g_context, world(), fp32, *scene_, quiet(config));
  RunOptions o = quiet(config);
  o.precision = "bf16";
  TrainingRun mixed(*test::g_context, world(), bf16, *scene_, o);
  for (int64_t t = 0; t < 3; ++t) {
    const StepRecord a = reference.train_step(t), b = mixed.train_step(t);
    EXPECT_FALSE(b.skipped) << t;
    EXPECT_EQ(b.loss, a.loss) << "step " << t;
  }
  const gs::GaussianParams got = bf16.trainer().canonical_params(),
                           want = fp32.trainer().canonical_params();
  const auto g = got.fields(), w = want.fields();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(torch::equal(*g[i], *w[i])) << "field " << i;
}

}  // namespace
}  // namespace tessera
