// Benchmark of kernels::hash_encoding on the CPU against the plain-LibTorch way of writing it
// (int64 index arithmetic, index_select per corner), forward and forward + backward.
//
// Benchmarks come in pairs named Op / Reference with the same arguments (points, levels, features
// per level, log2 table size), so time(Reference) / time(Op) is the speed-up.
// Run: build/tests/bench_hash_encoding [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/hash_encoding.h"

namespace {

using tessera::kernels::HashEncodingConfig;

struct Problem {
  HashEncodingConfig config;
  torch::Tensor positions;   // [N, 3]
  torch::Tensor embeddings;  // [L, T, F]
};

// instant-ngp's defaults: levels from 16 to 2048 cells per axis, the table initialized in
// [-1e-4, 1e-4]; uniform points in the unit cube.
Problem make_problem(const benchmark::State& state) {
  Problem p;
  p.config.levels = static_cast<int>(state.range(1));
  p.config.features_per_level = static_cast<int>(state.range(2));
  p.config.log2_hashmap_size = static_cast<int>(state.range(3));
  p.config.base_resolution = 16;
  p.config.per_level_scale =
      tessera::kernels::hash_encoding_per_level_scale(16, 2048, p.config.levels);
  torch::manual_seed(2024);
  p.positions = torch::rand({state.range(0), 3});
  p.embeddings = (torch::rand({p.config.levels, int64_t{1} << p.config.log2_hashmap_size,
                               p.config.features_per_level}) * 2 - 1) * 1e-4;
  return p;
}

// The plain-LibTorch encoding: what one writes without a custom op (the test's reference).
torch::Tensor reference(const torch::Tensor& positions, const torch::Tensor& embeddings,
                        const HashEncodingConfig& c) {
  const int64_t table_size = int64_t{1} << c.log2_hashmap_size;
  const torch::Tensor unit = positions.clamp(0.0, 1.0);
  std::vector<torch::Tensor> per_level;
  for (int l = 0; l < c.levels; ++l) {
    const int64_t n = static_cast<int64_t>(
        std::floor(c.base_resolution * std::pow(c.per_level_scale, l) + 1e-6));
    const int64_t stride = n + 1;
    const bool dense = stride * stride * stride <= table_size;
    const torch::Tensor pos = unit * static_cast<float>(n);
    const torch::Tensor lower = pos.floor().clamp_max(static_cast<double>(n - 1));
    const torch::Tensor frac = pos - lower;
    const torch::Tensor corner = lower.to(torch::kInt64);
    const torch::Tensor table = embeddings.select(0, l);
    torch::Tensor level;
    for (int k = 0; k < 8; ++k) {
      const int64_t d[3] = {k & 1, (k >> 1) & 1, (k >> 2) & 1};
      const torch::Tensor x = corner.select(1, 0) + d[0];
      const torch::Tensor y = corner.select(1, 1) + d[1];
      const torch::Tensor z = corner.select(1, 2) + d[2];
      const torch::Tensor row =
          dense ? x + y * stride + z * stride * stride
                : torch::bitwise_and(
                      torch::bitwise_xor(
                          torch::bitwise_xor(x, torch::bitwise_and(y * 2654435761ll, 0xFFFFFFFFll)),
                          torch::bitwise_and(z * 805459861ll, 0xFFFFFFFFll)),
                      table_size - 1);
      const torch::Tensor w = (d[0] ? frac.select(1, 0) : 1 - frac.select(1, 0)) *
                              (d[1] ? frac.select(1, 1) : 1 - frac.select(1, 1)) *
                              (d[2] ? frac.select(1, 2) : 1 - frac.select(1, 2));
      const torch::Tensor term = w.unsqueeze(1) * table.index_select(0, row);
      level = level.defined() ? level + term : term;
    }
    per_level.push_back(level);
  }
  return torch::cat(per_level, 1);
}

void set_counters(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations() * state.range(0));  // points/s
}

void Op_Forward(benchmark::State& state) {
  const Problem p = make_problem(state);
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = tessera::kernels::hash_encoding(p.positions, p.embeddings, p.config);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  set_counters(state);
}

void Reference_Forward(benchmark::State& state) {
  const Problem p = make_problem(state);
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = reference(p.positions, p.embeddings, p.config);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  set_counters(state);
}

// Forward and backward of L = sum(encoding) with respect to the table (as a training step needs:
// the full [L, T, F] gradient is written each step).
void Op_ForwardBackward(benchmark::State& state) {
  const Problem p = make_problem(state);
  const torch::Tensor table = p.embeddings.clone().requires_grad_(true);
  for (auto _ : state) {
    auto out = tessera::kernels::hash_encoding(p.positions, table, p.config);
    auto grads = torch::autograd::grad({out.sum()}, {table});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_counters(state);
}

void Reference_ForwardBackward(benchmark::State& state) {
  const Problem p = make_problem(state);
  const torch::Tensor table = p.embeddings.clone().requires_grad_(true);
  for (auto _ : state) {
    auto out = reference(p.positions, table, p.config);
    auto grads = torch::autograd::grad({out.sum()}, {table});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_counters(state);
}

// {points, levels, features per level, log2 table size}: instant-ngp's default encoding on a
// 2^16-point batch, and a small table (2^14 rows) where the zeroing of v_embeddings matters less.
void problem_sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"points", "L", "F", "log2T"});
  b->Args({1 << 16, 16, 2, 19});
  b->Args({1 << 16, 16, 2, 14});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(Op_Forward)->Apply(problem_sizes);
BENCHMARK(Reference_Forward)->Apply(problem_sizes);
BENCHMARK(Op_ForwardBackward)->Apply(problem_sizes);
BENCHMARK(Reference_ForwardBackward)->Apply(problem_sizes);

}  // namespace
