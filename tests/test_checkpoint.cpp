// Tests of activation checkpointing (exactness incl. RNG and autocast replay), checkpoint
// policies, and memory accounting (counting CPU allocator, CUDA caching allocator stats).
#include <ATen/autocast_mode.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/nn.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "distributed/errors.h"
#include "framework/checkpoint.h"
#include "framework/checkpoint_policy.h"
#include "framework/memory.h"
#include "framework/phase_timer.h"
#include "tests/cuda_skip.h"

namespace {

using tessera::CheckpointOptions;
using tessera::CheckpointPlan;
using tessera::CheckpointPolicyOptions;
using tessera::SegmentFn;
using tessera::SegmentInfo;

constexpr int64_t kMiB = 1024 * 1024;

// Allocated during static initialization, i.e. before any test can install the counting
// allocator: freeing them later must not touch the counts (or crash).
torch::Tensor* g_tensor_before_install = new torch::Tensor(torch::ones({1 << 18}));  // 1 MiB
void* g_raw_before_install = c10::GetCPUAllocator()->raw_allocate(64 * 1024);

// An MLP as a sequence of segments; each segment is Linear -> ReLU [-> Dropout].
std::vector<torch::nn::Sequential> make_segments(int64_t width, int64_t num_segments,
                                                 int64_t layers_per_segment, double dropout,
                                                 torch::Device device) {
  torch::manual_seed(1234);
  std::vector<torch::nn::Sequential> segments;
  for (int64_t s = 0; s < num_segments; ++s) {
    torch::nn::Sequential seq;
    for (int64_t l = 0; l < layers_per_segment; ++l) {
      seq->push_back(torch::nn::Linear(width, width));
      seq->push_back(torch::nn::ReLU());
      if (dropout > 0) seq->push_back(torch::nn::Dropout(dropout));
    }
    seq->to(device);
    seq->train();
    segments.push_back(seq);
  }
  return segments;
}

struct RunResult {
  torch::Tensor output;
  torch::Tensor input_grad;
  std::vector<torch::Tensor> param_grads;
  torch::Tensor next_random;  // first draw after backward: the outer RNG stream must go on
};

// Forward + backward through all segments; checkpoint segment i when checkpointed[i].
RunResult run_mlp(std::vector<torch::nn::Sequential>& segments, const torch::Tensor& input,
                  const std::vector<bool>& checkpointed, const CheckpointOptions& options,
                  bool input_requires_grad = true) {
  for (auto& seg : segments)
    for (auto& p : seg->parameters()) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(42);
  if (input.is_cuda()) torch::cuda::manual_seed_all(42);
  torch::Tensor x = input.detach().clone().requires_grad_(input_requires_grad);
  torch::Tensor h = x;
  for (size_t i = 0; i < segments.size(); ++i) {
    torch::nn::Sequential seg = segments[i];
    if (checkpointed[i]) {
      h = tessera::checkpoint(
          [seg](const std::vector<torch::Tensor>& in) mutable {
            return std::vector<torch::Tensor>{seg->forward(in[0])};
          },
          {h}, options)[0];
    } else {
      h = seg->forward(h);
    }
  }
  // Fixed loss weights that draw no random numbers.
  torch::Tensor w = torch::linspace(-1.0, 1.0, h.numel(), h.options()).reshape(h.sizes());
  (h * w).sum().backward();

  RunResult r;
  r.output = h.detach();
  if (input_requires_grad) r.input_grad = x.grad();
  for (auto& seg : segments)
    for (auto& p : seg->parameters()) r.param_grads.push_back(p.grad().defined() ? p.grad().clone()
                                                                             : torch::Tensor());
  r.next_random = torch::rand({8}, input.options());
  return r;
}

size_t count_unequal_grads(const RunResult& a, const RunResult& b) {
  size_t unequal = 0;
  for (size_t i = 0; i < a.param_grads.size(); ++i) {
    if (!a.param_grads[i].defined() || !b.param_grads[i].defined()) {
      ++unequal;
      continue;
    }
    if (!torch::equal(a.param_grads[i], b.param_grads[i])) ++unequal;
  }
  return unequal;
}

// ---- checkpoint(): exactness ------------------------------------------------------------------

TEST(Checkpoint, DropoutMlpGradientsAndOutputsMatchBitwise) {
  auto segments = make_segments(32, 4, 2, 0.3, torch::kCPU);
  torch::Tensor input = torch::randn({64, 32});
  const RunResult plain = run_mlp(segments, input, {false, false, false, false}, {});
  const RunResult all = run_mlp(segments, input, {true, true, true, true}, {});
  const RunResult some = run_mlp(segments, input, {false, true, false, true}, {});

  for (const RunResult* r : {&all, &some}) {
    EXPECT_TRUE(torch::equal(r->output, plain.output));
    EXPECT_TRUE(torch::equal(r->input_grad, plain.input_grad));
    ASSERT_EQ(r->param_grads.size(), plain.param_grads.size());
    EXPECT_EQ(count_unequal_grads(*r, plain), 0u) << "parameter grads differ";
    // The recompute replays the stashed RNG and then puts the outer state back.
    EXPECT_TRUE(torch::equal(r->next_random, plain.next_random));
  }
  // Dropout really drew: the output has exact zeros beyond what ReLU alone gives.
  EXPECT_GT((plain.output == 0).sum().item<int64_t>(), 0);
}

TEST(Checkpoint, WithoutRngRestoreGradientsDiffer) {
  auto segments = make_segments(32, 4, 2, 0.3, torch::kCPU);
  torch::Tensor input = torch::randn({64, 32});
  const RunResult plain = run_mlp(segments, input, {false, false, false, false}, {});
  CheckpointOptions no_restore;
  no_restore.preserve_rng_state = false;
  const RunResult broken = run_mlp(segments, input, {true, true, true, true}, no_restore);
  // Forward is the same computation; only the recompute draws other dropout masks.
  EXPECT_TRUE(torch::equal(broken.output, plain.output));
  EXPECT_GT(count_unequal_grads(broken, plain), 0u)
      << "without the RNG replay the dropout masks must differ";
  EXPECT_FALSE(torch::equal(broken.input_grad, plain.input_grad));
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  auto segments = make_segments(16, 3, 1, 0.3, torch::kCPU);
  torch::Tensor input = torch::randn({8, 16});
  const RunResult plain = run_mlp(segments, input, {false, false, false}, {}, false);
  const RunResult cp = run_mlp(segments, input, {true, true, true}, {}, false);
  EXPECT_TRUE(torch::equal(cp.output, plain.output));
  EXPECT_EQ(count_unequal_grads(cp, plain), 0u);
}

TEST(Checkpoint, SeveralInputsOutputsIntegerAndUndefinedOutputs) {
  torch::Tensor a0 = torch::randn({5, 3});
  torch::Tensor b0 = torch::randn({5, 3});
  torch::Tensor c = torch::randn({5, 3});  // does not require grad
  torch::nn::Linear lin(3, 3);
  auto fn = [lin, c](const std::vector<torch::Tensor>& in) mutable {
    torch::Tensor y = lin->forward(in[0] * in[1]) + in[2];
    torch::Tensor idx = y.argmax(1);  // int64: not differentiable
    return std::vector<torch::Tensor>{y, idx, torch::Tensor(), in[0].sin()};
  };
  auto grads_of = [&](bool use_checkpoint) {
    lin->zero_grad();
    torch::Tensor a = a0.clone().requires_grad_(true);
    torch::Tensor b = b0.clone().requires_grad_(true);
    const std::vector<torch::Tensor> in{a, b, c, torch::Tensor()};  // last one: "no tensor"
    std::vector<torch::Tensor> out = use_checkpoint ? tessera::checkpoint(fn, in) : fn(in);
    EXPECT_EQ(out.size(), 4u);
    EXPECT_FALSE(out[1].requires_grad());
    EXPECT_EQ(out[1].scalar_type(), torch::kLong);
    EXPECT_FALSE(out[2].defined());
    (out[0].square().sum() + out[3].sum()).backward();
    return std::vector<torch::Tensor>{out[0].detach(), out[1], a.grad(), b.grad(),
                                      lin->weight.grad().clone(), lin->bias.grad().clone()};
  };
  auto plain = grads_of(false);
  auto cp = grads_of(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(cp[i], plain[i])) << i;
}

TEST(Checkpoint, AutocastStateIsReplayedInRecompute) {
  auto segments = make_segments(32, 2, 2, 0.0, torch::kCPU);
  torch::Tensor input = torch::randn({16, 32});
  auto run = [&](bool use_checkpoint) {
    for (auto& seg : segments) seg->zero_grad();
    torch::Tensor x = input.clone().requires_grad_(true);
    torch::Tensor h = x;
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::increment_nesting();
    for (auto& seg : segments) {
      auto seg_copy = seg;
      h = use_checkpoint ? tessera::checkpoint(
                               [seg_copy](const std::vector<torch::Tensor>& in) mutable {
                                 return std::vector<torch::Tensor>{seg_copy->forward(in[0])};
                               },
                               {h})[0]
                         : seg->forward(h);
    }
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    EXPECT_EQ(h.scalar_type(), torch::kBFloat16);
    h.to(torch::kFloat).sum().backward();  // backward (and so the recompute) runs outside autocast
    std::vector<torch::Tensor> grads{h.detach(), x.grad()};
    for (auto& seg : segments)
      for (auto& p : seg->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  auto plain = run(false);
  auto cp = run(true);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(cp[i], plain[i])) << i;
}

TEST(Checkpoint, WithoutGradModeJustCallsTheSegment) {
  torch::nn::Linear lin(4, 4);
  torch::NoGradGuard no_grad;
  torch::Tensor x = torch::randn({3, 4});
  auto out = tessera::checkpoint(
      [lin](const std::vector<torch::Tensor>& in) mutable {
        return std::vector<torch::Tensor>{lin->forward(in[0])};
      },
      {x});
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_TRUE(torch::equal(out[0], lin->forward(x)));
}

// ---- memory accounting --------------------------------------------------------------------------

TEST(Memory, CountingAllocatorCountsAndResetsPeak) {
  tessera::install_counting_cpu_allocator();
  tessera::install_counting_cpu_allocator();  // idempotent
  ASSERT_TRUE(tessera::counting_cpu_allocator_installed());
  const torch::Device cpu(torch::kCPU);
  ASSERT_TRUE(tessera::memory_stats(cpu).available);

  // Freed through the original allocator's deleter: counts unchanged, never negative.
  const int64_t before_free = tessera::memory_stats(cpu).current_bytes;
  delete g_tensor_before_install;
  g_tensor_before_install = nullptr;
  if (g_raw_before_install) c10::GetCPUAllocator()->raw_deallocate(g_raw_before_install);
  g_raw_before_install = nullptr;  // (it reached our raw deleter, which is not the owner)
  EXPECT_EQ(tessera::memory_stats(cpu).current_bytes, before_free);
  EXPECT_GE(tessera::memory_stats(cpu).current_bytes, 0);

  const int64_t bytes = 8 * kMiB;
  tessera::reset_peak(cpu);
  const auto s0 = tessera::memory_stats(cpu);
  EXPECT_EQ(s0.peak_bytes, s0.current_bytes);
  {
    torch::Tensor t = torch::empty({bytes / 4}, torch::kFloat32);
    const auto s1 = tessera::memory_stats(cpu);
    EXPECT_GE(s1.current_bytes - s0.current_bytes, bytes);
    EXPECT_GE(s1.peak_bytes - s0.current_bytes, bytes);
  }
  const auto s2 = tessera::memory_stats(cpu);
  EXPECT_EQ(s2.current_bytes, s0.current_bytes);  // freed
  EXPECT_GE(s2.peak_bytes - s0.current_bytes, bytes);  // peak remembers
  tessera::reset_peak(cpu);
  EXPECT_EQ(tessera::memory_stats(cpu).peak_bytes, tessera::memory_stats(cpu).current_bytes);

  // The raw interface (used by oneDNN) is counted too.
  void* raw = c10::GetCPUAllocator()->raw_allocate(kMiB);
  EXPECT_EQ(tessera::memory_stats(cpu).current_bytes - s0.current_bytes, kMiB);
  c10::GetCPUAllocator()->raw_deallocate(raw);
  EXPECT_EQ(tessera::memory_stats(cpu).current_bytes, s0.current_bytes);
}

// Peak bytes above the start of forward + backward of an MLP.
int64_t mlp_peak_bytes(std::vector<torch::nn::Sequential>& segments, const torch::Tensor& input,
                       const std::vector<bool>& checkpointed, torch::Device device) {
  for (auto& seg : segments)
    for (auto& p : seg->parameters()) p.mutable_grad() = torch::Tensor();
  const int64_t start = tessera::memory_stats(device).current_bytes;
  tessera::reset_peak(device);
  {
    torch::Tensor h = input;
    for (size_t i = 0; i < segments.size(); ++i) {
      torch::nn::Sequential seg = segments[i];
      h = checkpointed[i] ? tessera::checkpoint(
                                [seg](const std::vector<torch::Tensor>& in) mutable {
                                  return std::vector<torch::Tensor>{seg->forward(in[0])};
                                },
                                {h})[0]
                          : seg->forward(h);
    }
    h.sum().backward();
  }
  return tessera::memory_stats(device).peak_bytes - start;
}

TEST(Memory, CheckpointingLowersPeakCpuMemory) {
  tessera::install_counting_cpu_allocator();
  const torch::Device cpu(torch::kCPU);
  // Linear -> ReLU -> Dropout per segment: each stores ~3 activations of batch x width (ReLU
  // output, dropout mask, dropout output); checkpointed, only the segment's output stays.
  constexpr int64_t kBatch = 4096, kWidth = 1024, kSegments = 8, kLayersPerSegment = 1;
  auto segments = make_segments(kWidth, kSegments, kLayersPerSegment, 0.1, cpu);
  torch::Tensor input = torch::randn({kBatch, kWidth}).requires_grad_(true);
  const int64_t none = mlp_peak_bytes(segments, input, std::vector<bool>(kSegments, false), cpu);
  const int64_t all = mlp_peak_bytes(segments, input, std::vector<bool>(kSegments, true), cpu);
  std::cout << "[ memory ] MLP batch " << kBatch << " width " << kWidth << ", " << kSegments
            << " segments x " << kLayersPerSegment
            << " layer(s) + dropout: peak CPU forward+backward "
            << tessera::format_bytes(none) << " without checkpointing, "
            << tessera::format_bytes(all) << " with every segment checkpointed" << std::endl;
  RecordProperty("peak_bytes_none", std::to_string(none));
  RecordProperty("peak_bytes_all", std::to_string(all));
  EXPECT_GT(none, 0);
  EXPECT_LT(all, none);
  // One activation is batch*width*4 bytes; checkpointing must save many of them (~2 per segment).
  EXPECT_GE(none - all, kSegments * kBatch * kWidth * 4);
}

TEST(Memory, MeasureSegmentSeesActivationsAndOutputs) {
  const torch::Device cpu(torch::kCPU);
  torch::nn::Sequential seg(torch::nn::Linear(256, 256), torch::nn::ReLU(),
                            torch::nn::Linear(256, 128));
  torch::Tensor x = torch::randn({512, 256});
  const auto m = tessera::measure_segment(
      [seg](const std::vector<torch::Tensor>& in) mutable {
        return std::vector<torch::Tensor>{seg->forward(in[0])};
      },
      {x}, cpu);
  EXPECT_EQ(m.output_bytes, 512 * 128 * 4);
  // The ReLU output (saved for the second Linear) is held besides the output.
  EXPECT_GE(m.activation_bytes, m.output_bytes + 512 * 256 * 4);
  EXPECT_GE(m.peak_bytes, m.activation_bytes);
}

// A timer in CheckpointOptions is charged the recompute as "recompute", and the phase around it
// ("backward") is not.
TEST(Checkpoint, RecomputeIsChargedToItsOwnPhase) {
  constexpr double kSleep = 0.1;
  const SegmentFn slow = [&](const std::vector<torch::Tensor>& in) {
    std::this_thread::sleep_for(std::chrono::duration<double>(kSleep));
    return std::vector<torch::Tensor>{in[0] * 2};
  };
  tessera::PhaseTimer timer;
  tessera::CheckpointOptions options;
  options.phases = &timer;
  torch::Tensor x = torch::ones({4}, torch::requires_grad());
  const auto before = std::chrono::steady_clock::now();
  timer.start();
  const torch::Tensor y = tessera::checkpoint(slow, {x}, options)[0];
  timer.lap("forward");
  y.sum().backward();
  timer.lap("backward");
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  double forward = -1, backward = -1, recompute = -1;
  for (const auto& [phase, seconds] : timer.times()) {
    if (phase == "forward") forward = seconds;
    if (phase == "backward") backward = seconds;
    if (phase == "recompute") recompute = seconds;
  }
  EXPECT_GE(forward, kSleep);
  EXPECT_GE(recompute, kSleep);
  EXPECT_GE(backward, 0.0) << "charged less than the recompute it contains";
  // The phases split the timed interval: charged to "backward" as well, the recompute would
  // count twice and the sum would pass the wall time by its >= kSleep, however fast the machine.
  EXPECT_LE(forward + backward + recompute, wall + 1e-9) << "the recompute was charged twice";
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({4}, 2.0f)));
}

// ---- policies ----------------------------------------------------------------------------------

std::vector<SegmentInfo> synthetic_segments() {
  // name, bytes stored when kept, bytes stored when checkpointed (outputs)
  return {{"encoder", 10 * kMiB, 1 * kMiB},
          {"trunk0", 40 * kMiB, 1 * kMiB},
          {"trunk1", 25 * kMiB, 1 * kMiB},
          {"head", 5 * kMiB, 1 * kMiB}};
}

std::unique_ptr<tessera::CheckpointPolicy> budget_policy(double mib) {
  CheckpointPolicyOptions o;
  o.budget_mib = mib;
  return tessera::make_checkpoint_policy("budget", o);
}

void expect_plan_names_every_segment(const CheckpointPlan& plan,
                                     const std::vector<SegmentInfo>& segments) {
  for (const SegmentInfo& s : segments)
    EXPECT_NE(plan.text.find(s.name), std::string::npos) << s.name << " missing in\n" << plan.text;
}

TEST(CheckpointPolicy, NoneCheckpointsNothing) {
  auto segments = synthetic_segments();
  auto plan = tessera::make_checkpoint_policy("none")->plan(segments);
  EXPECT_EQ(plan.checkpointed, std::vector<bool>(4, false));
  EXPECT_EQ(plan.stored_bytes, 80 * kMiB);
  expect_plan_names_every_segment(plan, segments);
}

TEST(CheckpointPolicy, SegmentsByNameAndEveryNth) {
  auto segments = synthetic_segments();
  CheckpointPolicyOptions by_name;
  by_name.segments = {"head", "encoder"};
  EXPECT_EQ(tessera::make_checkpoint_policy("segments", by_name)->plan(segments).checkpointed,
            (std::vector<bool>{true, false, false, true}));
  CheckpointPolicyOptions every2;
  every2.every = 2;  // the 2nd; the 4th is the last, which `every` leaves kept
  EXPECT_EQ(tessera::make_checkpoint_policy("segments", every2)->plan(segments).checkpointed,
            (std::vector<bool>{false, true, false, false}));
  CheckpointPolicyOptions every1;
  every1.every = 1;
  EXPECT_EQ(tessera::make_checkpoint_policy("segments", every1)->plan(segments).checkpointed,
            (std::vector<bool>{true, true, true, false}));
  CheckpointPolicyOptions both = by_name;
  both.every = 3;
  auto plan = tessera::make_checkpoint_policy("segments", both)->plan(segments);
  EXPECT_EQ(plan.checkpointed, (std::vector<bool>{true, false, true, true}));
  expect_plan_names_every_segment(plan, segments);

  CheckpointPolicyOptions unknown;
  unknown.segments = {"trunk7"};
  try {
    tessera::make_checkpoint_policy("segments", unknown)->plan(segments);
    ADD_FAILURE() << "unknown segment accepted";
  } catch (const tessera::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("trunk7"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("trunk1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(tessera::make_checkpoint_policy("segments", {}), tessera::UserError);
}

TEST(CheckpointPolicy, BudgetCountsTheRecomputeTransient) {
  auto segments = synthetic_segments();  // kept total 80 MiB
  auto loose = budget_policy(100)->plan(segments);
  EXPECT_EQ(loose.num_checkpointed(), 0u);
  EXPECT_EQ(loose.peak_bytes, 80 * kMiB);
  EXPECT_TRUE(loose.fits);

  // trunk0 alone: 41 MiB stored at the end of forward, 10 + 40 while trunk0 is recomputed.
  auto one = budget_policy(50)->plan(segments);
  EXPECT_EQ(one.checkpointed, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(one.stored_bytes, 41 * kMiB);
  EXPECT_EQ(one.peak_bytes, 50 * kMiB);
  EXPECT_TRUE(one.fits);

  // At 45 MiB trunk0 alone stores 41 but peaks at 50 while recomputed: the encoder must be
  // checkpointed too, so that only its output (1 MiB) is held under trunk0's recompute.
  auto two = budget_policy(45)->plan(segments);
  EXPECT_EQ(two.checkpointed, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(two.stored_bytes, 32 * kMiB);
  EXPECT_EQ(two.peak_bytes, 41 * kMiB);
  EXPECT_TRUE(two.fits);
  expect_plan_names_every_segment(two, segments);
  std::cout << two.text;
}

TEST(CheckpointPolicy, BudgetPrefersTheCheaperRecompute) {
  auto segments = synthetic_segments();
  const std::vector<double> seconds = {0.01, 1.0, 0.5, 0.1};
  for (size_t i = 0; i < segments.size(); ++i) segments[i].recompute_seconds = seconds[i];
  // At 70 MiB trunk0 alone fits (peak 50) but costs 1 s; the encoder and trunk1 fit too
  // (47 MiB stored, 41 + 25 while trunk1 is recomputed) for 0.51 s.
  auto plan = budget_policy(70)->plan(segments);
  EXPECT_EQ(plan.checkpointed, (std::vector<bool>{true, false, true, false})) << plan.text;
  EXPECT_DOUBLE_EQ(plan.recompute_seconds, 0.51);
  EXPECT_EQ(plan.peak_bytes, 66 * kMiB);
  EXPECT_NE(plan.text.find("510.0 ms"), std::string::npos) << plan.text;
  // Without times the fewest segments win.
  for (auto& s : segments) s.recompute_seconds = 0;
  EXPECT_EQ(budget_policy(70)->plan(segments).checkpointed,
            (std::vector<bool>{false, true, false, false}));
}

// The model of checkpoint_policy.h, written out again: (stored at the end of forward, peak).
std::pair<int64_t, int64_t> brute_force_memory(const std::vector<SegmentInfo>& segments,
                                               uint32_t mask) {
  int64_t stored = 0, peak = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const int64_t kept = segments[i].activation_bytes;
    if (mask >> i & 1) {
      peak = std::max(peak, stored + kept);
      stored += std::min(segments[i].boundary_bytes, kept);
    } else {
      stored += kept;
    }
  }
  return {stored, std::max(peak, stored)};
}

TEST(CheckpointPolicy, BudgetIsOptimalAgainstBruteForce) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> act(0, 64), bound(0, 8), budget(1, 200), quarter(0, 8);
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 1 + trial % 9;
    const bool timed = trial % 2 == 1;
    std::vector<SegmentInfo> segments;
    for (int i = 0; i < n; ++i)
      segments.push_back({"s" + std::to_string(i), act(rng) * kMiB, bound(rng) * kMiB,
                          timed ? 0.25 * static_cast<double>(quarter(rng)) : 0.0});
    const int64_t b = budget(rng) * kMiB;
    // Every subset: the cheapest (seconds, then count, then peak) that fits, and the lowest peak.
    bool any_fits = false;
    double best_seconds = 0;
    int best_count = 0;
    int64_t best_peak = 0, lowest_peak = -1;
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      const int64_t peak = brute_force_memory(segments, mask).second;
      if (lowest_peak < 0 || peak < lowest_peak) lowest_peak = peak;
      if (peak > b) continue;
      double sec = 0;
      for (int i = 0; i < n; ++i)
        if (mask >> i & 1) sec += segments[i].recompute_seconds;
      const int count = __builtin_popcount(mask);
      if (!any_fits || std::tie(sec, count, peak) < std::tie(best_seconds, best_count, best_peak)) {
        any_fits = true;
        best_seconds = sec;
        best_count = count;
        best_peak = peak;
      }
    }
    const auto plan = budget_policy(static_cast<double>(b) / kMiB)->plan(segments);
    uint32_t mask = 0;
    for (int i = 0; i < n; ++i) mask |= plan.checkpointed[i] ? 1u << i : 0u;
    const auto [stored, peak] = brute_force_memory(segments, mask);
    EXPECT_EQ(plan.stored_bytes, stored) << plan.text;
    EXPECT_EQ(plan.peak_bytes, peak) << plan.text;
    EXPECT_EQ(plan.fits, any_fits) << plan.text;
    if (any_fits) {
      EXPECT_LE(plan.peak_bytes, b) << plan.text;
      EXPECT_DOUBLE_EQ(plan.recompute_seconds, best_seconds) << plan.text;
      EXPECT_EQ(plan.num_checkpointed(), static_cast<size_t>(best_count)) << plan.text;
      EXPECT_EQ(plan.peak_bytes, best_peak) << plan.text;
    } else {
      EXPECT_EQ(plan.peak_bytes, lowest_peak) << plan.text;
    }
  }
}

TEST(CheckpointPolicy, ImpossibleBudgetTakesTheLowestPeak) {
  auto segments = synthetic_segments();  // trunk0 alone holds 40 MiB, stored or recomputed
  auto plan = budget_policy(20)->plan(segments);
  // Encoder and trunk0 checkpointed: 1 + 40 while trunk0 is recomputed, 32 stored at the end of
  // forward. Checkpointing trunk1 or the head too would add recompute for no lower peak.
  EXPECT_EQ(plan.checkpointed, (std::vector<bool>{true, true, false, false}));
  EXPECT_FALSE(plan.fits);
  EXPECT_EQ(plan.peak_bytes, 41 * kMiB);
  EXPECT_EQ(plan.stored_bytes, 32 * kMiB);
  EXPECT_NE(plan.text.find("cannot be met"), std::string::npos) << plan.text;
  EXPECT_NE(plan.text.find("DOES NOT FIT"), std::string::npos) << plan.text;
  expect_plan_names_every_segment(plan, segments);
}

TEST(CheckpointPolicy, CheckpointingTheLastSegmentIsNoted) {
  auto segments = synthetic_segments();
  CheckpointPolicyOptions all;
  all.segments = {"encoder", "trunk0", "trunk1", "head"};
  const auto plan = tessera::make_checkpoint_policy("segments", all)->plan(segments);
  // Every segment checkpointed: the peak is trunk0's recompute over the encoder's output, as
  // without the head checkpointed (the head's recompute holds 3 + 5 MiB).
  EXPECT_EQ(plan.peak_bytes, 40 * kMiB + 1 * kMiB);
  all.segments.pop_back();
  EXPECT_EQ(tessera::make_checkpoint_policy("segments", all)->plan(segments).peak_bytes,
            plan.peak_bytes);
  EXPECT_NE(plan.text.find("last segment ('head')"), std::string::npos) << plan.text;
  CheckpointPolicyOptions first;
  first.segments = {"encoder"};
  EXPECT_EQ(tessera::make_checkpoint_policy("segments", first)->plan(segments).text.find(
                "last segment"),
            std::string::npos);
}

TEST(CheckpointPolicy, UnknownNameListsKnownOnes) {
  try {
    tessera::make_checkpoint_policy("sometimes");
    ADD_FAILURE() << "unknown policy accepted";
  } catch (const tessera::UserError& e) {
    const std::string msg = e.what();
    for (const char* known : {"none", "segments", "budget", "sometimes"})
      EXPECT_NE(msg.find(known), std::string::npos) << msg;
  }
  EXPECT_THROW(budget_policy(0), tessera::UserError);
  EXPECT_THROW(budget_policy(-5), tessera::UserError);
}

TEST(CheckpointPolicy, PlanFromMeasuredSegments) {
  const torch::Device cpu(torch::kCPU);
  auto segments = make_segments(128, 3, 2, 0.0, cpu);
  torch::Tensor h = torch::randn({256, 128});
  std::vector<SegmentInfo> infos;
  for (size_t i = 0; i < segments.size(); ++i) {
    torch::nn::Sequential seg = segments[i];
    SegmentFn fn = [seg](const std::vector<torch::Tensor>& in) mutable {
      return std::vector<torch::Tensor>{seg->forward(in[0])};
    };
    const auto m = tessera::measure_segment(fn, {h}, cpu);
    infos.push_back({"mlp" + std::to_string(i), m.activation_bytes, m.output_bytes});
    torch::NoGradGuard no_grad;
    h = seg->forward(h);
  }
  int64_t total = 0;
  for (const auto& s : infos) total += s.activation_bytes;
  // A budget just under the total forces exactly one segment to be checkpointed.
  auto plan = budget_policy(static_cast<double>(total - 1) / kMiB)->plan(infos);
  EXPECT_EQ(plan.num_checkpointed(), 1u) << plan.text;
  EXPECT_TRUE(plan.fits);
}

// ---- CUDA --------------------------------------------------------------------------------------

TEST(CheckpointCuda, DropoutMlpGradientsMatch) {
  TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available(), "no CUDA device");
  const torch::Device cuda(torch::kCUDA, 0);
  auto segments = make_segments(64, 4, 2, 0.3, cuda);
  torch::Tensor input = torch::randn({128, 64}, torch::TensorOptions().device(cuda));
  const RunResult plain = run_mlp(segments, input, {false, false, false, false}, {});
  const RunResult cp = run_mlp(segments, input, {true, true, true, true}, {});
  EXPECT_TRUE(torch::equal(cp.output, plain.output));
  EXPECT_TRUE(torch::allclose(cp.input_grad, plain.input_grad, 1e-5, 1e-6));
  for (size_t i = 0; i < plain.param_grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(cp.param_grads[i], plain.param_grads[i], 1e-5, 1e-6)) << i;
  EXPECT_TRUE(torch::equal(cp.next_random, plain.next_random));

  CheckpointOptions no_restore;
  no_restore.preserve_rng_state = false;
  const RunResult broken = run_mlp(segments, input, {true, true, true, true}, no_restore);
  EXPECT_FALSE(torch::allclose(broken.input_grad, plain.input_grad, 1e-5, 1e-6));
}

// In a process that has made no CUDA tensor yet (a death test re-runs the binary for this case
// alone), reading and resetting the caching allocator's statistics must work: the allocator sizes
// its per-device state in CUDA's lazy initialization.
TEST(MemoryCuda, StatsBeforeAnyCudaTensor) {
  TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available(), "no CUDA device");
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const torch::Device cuda(torch::kCUDA, 0);
        tessera::reset_peak(cuda);
        const auto s = tessera::memory_stats(cuda);
        std::fprintf(stderr, "available %d current %lld\n", s.available ? 1 : 0,
                     static_cast<long long>(s.current_bytes));
        std::_Exit(s.available && s.current_bytes == 0 ? 0 : 1);
      },
      testing::ExitedWithCode(0), "available 1 current 0");
}

TEST(MemoryCuda, CachingAllocatorStatsAndCheckpointPeak) {
  TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available(), "no CUDA device");
  const torch::Device cuda(torch::kCUDA, 0);
  ASSERT_TRUE(tessera::memory_stats(cuda).available);
  tessera::reset_peak(cuda);
  const auto s0 = tessera::memory_stats(cuda);
  {
    torch::Tensor t = torch::empty({16 * kMiB}, torch::TensorOptions().device(cuda));  // 64 MiB
    EXPECT_GE(tessera::memory_stats(cuda).current_bytes - s0.current_bytes, 64 * kMiB);
  }
  const auto s1 = tessera::memory_stats(cuda);
  EXPECT_EQ(s1.current_bytes, s0.current_bytes);
  EXPECT_GE(s1.peak_bytes - s0.current_bytes, 64 * kMiB);
  tessera::reset_peak(cuda);
  EXPECT_EQ(tessera::memory_stats(cuda).peak_bytes, tessera::memory_stats(cuda).current_bytes);

  auto segments = make_segments(1024, 4, 2, 0.0, cuda);
  torch::Tensor input = torch::randn({4096, 1024}, torch::TensorOptions().device(cuda));
  const int64_t none = mlp_peak_bytes(segments, input, std::vector<bool>(4, false), cuda);
  const int64_t all = mlp_peak_bytes(segments, input, std::vector<bool>(4, true), cuda);
  std::cout << "[ memory ] CUDA peak " << tessera::format_bytes(none) << " without, "
            << tessera::format_bytes(all) << " with checkpointing" << std::endl;
  EXPECT_LT(all, none);
}

}  // namespace
