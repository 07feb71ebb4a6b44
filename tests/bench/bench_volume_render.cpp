// Benchmark of kernels::volume_render on the CPU against the plain-LibTorch way of writing it
// (rays padded to a [R, N] block, cumprod for transmittance), forward and forward + backward.
//
// Benchmarks come in pairs named Op / Reference with the same arguments (rays, samples per ray,
// threshold: 0 = no early termination, 1 = the default 1e-4), so time(Reference) / time(Op) is
// the speed-up. Run: build/tests/bench_volume_render [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdint>

#include "kernels/volume_render.h"

namespace {

using tessera::kernels::kDefaultTransmittanceThreshold;

// A batch of `rays` x `per_ray` float32 samples. Densities mix empty space (0), soft media and
// surfaces, so that about half of the rays terminate early at the default threshold.
struct Batch {
  torch::Tensor sigmas, rgbs, deltas, ts, offsets;  // [S], [S, 3], [S], [S], [R + 1]
  int64_t rays = 0, per_ray = 0;
};

Batch make_batch(int64_t rays, int64_t per_ray) {
  torch::manual_seed(2024);
  const int64_t n = rays * per_ray;
  const torch::Tensor kind = torch::rand({n});
  Batch b;
  b.rays = rays;
  b.per_ray = per_ray;
  b.sigmas = torch::where(kind < 0.4, torch::zeros({n}),
                          torch::where(kind < 0.97, 5 * torch::rand({n}), 200 * torch::rand({n})));
  b.rgbs = torch::rand({n, 3});
  b.deltas = torch::full({n}, 4.0 / static_cast<double>(per_ray));  // rays 4 units long
  b.ts = 2.0 + torch::arange(per_ray, torch::kFloat32).repeat({rays}) * b.deltas;
  b.offsets = torch::arange(0, n + 1, per_ray, torch::kInt64);
  return b;
}

double threshold_of(const benchmark::State& state) {
  return state.range(2) ? kDefaultTransmittanceThreshold : 0.0;
}

// The plain-LibTorch compositing: what one writes without a custom op, for rays of equal length.
std::vector<torch::Tensor> reference(const Batch& b, const torch::Tensor& sigmas,
                                     const torch::Tensor& rgbs, double threshold) {
  const torch::Tensor survive = torch::exp(-(sigmas * b.deltas).view({b.rays, b.per_ray}));
  const torch::Tensor alpha = 1 - survive;
  const torch::Tensor before = torch::cat(
      {torch::ones({b.rays, 1}), torch::cumprod(survive, 1).slice(1, 0, b.per_ray - 1)}, 1);
  const torch::Tensor w = before * alpha * (before.detach() >= threshold);
  const torch::Tensor rgb = (w.unsqueeze(2) * rgbs.view({b.rays, b.per_ray, 3})).sum(1);
  const torch::Tensor opacity = w.sum(1);
  const torch::Tensor depth = (w * b.ts.view({b.rays, b.per_ray})).sum(1);
  return {rgb, opacity, depth, w.view(-1)};
}

void set_counters(benchmark::State& state, const Batch& b) {
  state.SetItemsProcessed(state.iterations() * b.rays * b.per_ray);  // samples/s
}

void Op_Forward(benchmark::State& state) {
  const Batch b = make_batch(state.range(0), state.range(1));
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = tessera::kernels::volume_render(b.sigmas, b.rgbs, b.deltas, b.ts, b.offsets,
                                               threshold_of(state));
    benchmark::DoNotOptimize(out.rgb.data_ptr());
  }
  set_counters(state, b);
}

void Reference_Forward(benchmark::State& state) {
  const Batch b = make_batch(state.range(0), state.range(1));
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = reference(b, b.sigmas, b.rgbs, threshold_of(state));
    benchmark::DoNotOptimize(out[0].data_ptr());
  }
  set_counters(state, b);
}

// Forward and backward of L = sum(rgb) + sum(opacity) + sum(depth) with respect to sigmas, rgbs.
void Op_ForwardBackward(benchmark::State& state) {
  const Batch b = make_batch(state.range(0), state.range(1));
  const torch::Tensor sigmas = b.sigmas.clone().requires_grad_(true);
  const torch::Tensor rgbs = b.rgbs.clone().requires_grad_(true);
  for (auto _ : state) {
    auto out = tessera::kernels::volume_render(sigmas, rgbs, b.deltas, b.ts, b.offsets,
                                               threshold_of(state));
    auto grads = torch::autograd::grad({out.rgb.sum() + out.opacity.sum() + out.depth.sum()},
                                       {sigmas, rgbs});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_counters(state, b);
}

void Reference_ForwardBackward(benchmark::State& state) {
  const Batch b = make_batch(state.range(0), state.range(1));
  const torch::Tensor sigmas = b.sigmas.clone().requires_grad_(true);
  const torch::Tensor rgbs = b.rgbs.clone().requires_grad_(true);
  for (auto _ : state) {
    auto out = reference(b, sigmas, rgbs, threshold_of(state));
    auto grads = torch::autograd::grad({out[0].sum() + out[1].sum() + out[2].sum()},
                                       {sigmas, rgbs});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_counters(state, b);
}

// {rays, samples per ray, early termination}: the task's 4096 x 64 batch, and longer rays.
void batch_sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rays", "per_ray", "term"});
  for (int64_t term : {0, 1}) {
    b->Args({4096, 64, term});
    b->Args({1024, 256, term});
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(Op_Forward)->Apply(batch_sizes);
BENCHMARK(Reference_Forward)->Apply(batch_sizes);
BENCHMARK(Op_ForwardBackward)->Apply(batch_sizes);
BENCHMARK(Reference_ForwardBackward)->Apply(batch_sizes);

}  // namespace
