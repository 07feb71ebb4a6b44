// Benchmark of kernels::hash_encoding on the CPU against the plain-LibTorch way of writing it
// (int64 index arithmetic, index_select per corner), forward and forward + backward.
//
// Benchmarks come in pairs named Op / Reference with the same arguments (points, levels, features
// per level, log2 table size), so time(Reference) / time(Op) is the speed-up.
// Run: build/tests/bench_hash_encoding [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/hash_encoding.h"
#include "tests/reference/hash_encoding_reference.h"

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
    auto out = tessera::test::reference_encoding(p.positions, p.embeddings, p.config);
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
    auto out = tessera::test::reference_encoding(p.positions, table, p.config);
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
