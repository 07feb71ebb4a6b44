// Benchmark of the fixed-point sums under run.deterministic (kernels/fixed_point.h) on the CPU
// against the float path's work on the same values: adding a unit's gradient into the exact
// accumulator (FixedPointAdd) against adding it into a float gradient (Reference: acc += values),
// and the per-step read-back (normalize, then to float32).
//
// Arguments: elements, and the percentage of them that are nonzero (a hash grid's gradient of one
// unit of rays touches a fraction of its table: 37% on the demo scene). Run:
// build/tests/bench_fixed_point [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <torch/types.h>

#include <cstdint>

#include "kernels/fixed_point.h"

namespace {

using tessera::kernels::kFixedPointLimbs;

torch::Tensor values_of(const benchmark::State& state) {
  torch::manual_seed(7);
  const int64_t n = state.range(0);
  const double nonzero = static_cast<double>(state.range(1)) / 100.0;
  return torch::randn({n}).mul(1e-4).mul(torch::rand({n}).lt(nonzero));
}

void FixedPointAdd(benchmark::State& state) {
  const torch::Tensor values = values_of(state);
  torch::Tensor acc = torch::zeros({values.numel(), kFixedPointLimbs}, torch::kInt64);
  torch::Tensor bad = torch::zeros({1}, torch::kInt64);
  for (auto _ : state) tessera::kernels::fixed_point_add(acc, values, bad);
  state.SetItemsProcessed(state.iterations() * values.numel());
}

void Reference(benchmark::State& state) {
  const torch::Tensor values = values_of(state);
  torch::Tensor acc = torch::zeros({values.numel()});
  for (auto _ : state) acc.add_(values);
  state.SetItemsProcessed(state.iterations() * values.numel());
}

void NormalizeAndRead(benchmark::State& state) {
  const torch::Tensor values = values_of(state);
  torch::Tensor acc = torch::zeros({values.numel(), kFixedPointLimbs}, torch::kInt64);
  torch::Tensor bad = torch::zeros({1}, torch::kInt64);
  tessera::kernels::fixed_point_add(acc, values, bad);
  for (auto _ : state) {
    tessera::kernels::fixed_point_normalize(acc);
    benchmark::DoNotOptimize(tessera::kernels::fixed_point_to_float(acc, torch::kFloat32));
  }
  state.SetItemsProcessed(state.iterations() * values.numel());
}

// The demo nerf-hash table (786,432 values), at the density of one unit's gradient and dense.
#define TESSERA_FIXED_POINT_ARGS Args({786432, 37})->Args({786432, 100})->Unit(benchmark::kMicrosecond)
BENCHMARK(FixedPointAdd)->TESSERA_FIXED_POINT_ARGS;
BENCHMARK(Reference)->TESSERA_FIXED_POINT_ARGS;
BENCHMARK(NormalizeAndRead)->TESSERA_FIXED_POINT_ARGS;

}  // namespace
