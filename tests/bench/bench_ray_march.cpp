// Benchmark of kernels::ray_march on the CPU against the plain-LibTorch way of writing it: every
// step of every ray as a dense [R, N] block, occupancy gathered, then masked into packed samples.
//
// Benchmarks come in pairs named Op / Reference with the same arguments (rays, grid resolution,
// scene: 0 = a solid sphere of radius 0.5 in the [-1, 1]^3 box, ~6.5% of cells occupied; 1 = a
// fully occupied grid), so time(Reference) / time(Op) is the speed-up. The step is
// instant-ngp's: 1024 steps along the box diagonal. Run: build/tests/bench_ray_march
#include <benchmark/benchmark.h>
#include <torch/nn/functional.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>

#include "kernels/ray_march.h"

namespace {

constexpr float kStep = 2.0f * 1.7320508f / 1024;  // instant-ngp: 1024 steps across the diagonal
constexpr int64_t kMaxSamples = 1024;

struct Scene {
  torch::Tensor origins, directions, near, far;  // [R, 3], [R, 3], [R], [R]
  torch::Tensor aabb;                            // [6]
  torch::Tensor occupancy;                       // [G, G, G] uint8
};

// Cameras on a sphere of radius 3 looking at points near the centre, as a NeRF batch does.
Scene make_scene(int64_t rays, int64_t res, bool full) {
  torch::manual_seed(2024);
  Scene s;
  const torch::Tensor eye = torch::nn::functional::normalize(
      torch::randn({rays, 3}), torch::nn::functional::NormalizeFuncOptions().dim(1)) * 3;
  const torch::Tensor target = (torch::rand({rays, 3}) - 0.5) * 1.5;
  s.origins = eye;
  s.directions = torch::nn::functional::normalize(
      target - eye, torch::nn::functional::NormalizeFuncOptions().dim(1));
  s.near = torch::zeros({rays});
  s.far = torch::full({rays}, 100.0f);
  s.aabb = torch::tensor({-1.0f, -1.0f, -1.0f, 1.0f, 1.0f, 1.0f});
  if (full) {
    s.occupancy = torch::ones({res, res, res}, torch::kUInt8);
  } else {
    const torch::Tensor c = (torch::arange(res, torch::kFloat32) + 0.5) / res * 2 - 1;
    const torch::Tensor r2 = c.view({-1, 1, 1}).square() + c.view({1, -1, 1}).square() +
                             c.view({1, 1, -1}).square();
    s.occupancy = (r2 < 0.25).to(torch::kUInt8);
  }
  return s;
}

// The plain-LibTorch marcher: t_k = t_start + k * dt for every k up to the longest ray, the
// whole-step rule, occupancy gathered per step, the per-ray cap by cumsum, then boolean masks.
// It uses t_start + k * dt instead of repeated addition, so it may differ from the op in the
// last bit; it is here for its cost, not its bits.
std::vector<torch::Tensor> reference(const Scene& s) {
  const torch::Tensor lo = s.aabb.slice(0, 0, 3), hi = s.aabb.slice(0, 3, 6);
  const torch::Tensor inv = 1 / s.directions;  // +-inf for zero components
  const torch::Tensor t0 = (lo - s.origins) * inv, t1 = (hi - s.origins) * inv;
  const torch::Tensor t_enter = torch::minimum(t0, t1).amax(1);
  const torch::Tensor t_exit = torch::maximum(t0, t1).amin(1);
  const torch::Tensor t_start = torch::maximum(s.near, t_enter);
  const torch::Tensor t_end = torch::minimum(s.far, t_exit);
  const int64_t steps = static_cast<int64_t>(
      std::ceil((t_end - t_start).clamp_min(0).max().item<float>() / kStep));
  const torch::Tensor k = torch::arange(steps, torch::kFloat32);
  const torch::Tensor t = t_start.unsqueeze(1) + k * kStep;                    // [R, N]
  const torch::Tensor valid = (t + kStep) <= t_end.unsqueeze(1);               // [R, N]
  const torch::Tensor t_mid = t + 0.5f * kStep;
  const torch::Tensor p = s.origins.unsqueeze(1) + t_mid.unsqueeze(2) * s.directions.unsqueeze(1);
  const int64_t res = s.occupancy.size(0);
  const torch::Tensor cell =
      ((p - lo) * (static_cast<float>(res) / (hi - lo))).floor().clamp(0, res - 1).to(torch::kLong);
  const torch::Tensor flat = (cell.select(2, 0) * res + cell.select(2, 1)) * res + cell.select(2, 2);
  const torch::Tensor occupied = s.occupancy.view(-1).index({flat}).to(torch::kBool);
  torch::Tensor keep = valid & occupied;
  keep = keep & (keep.cumsum(1) <= kMaxSamples);
  const torch::Tensor counts = keep.sum(1);
  const torch::Tensor offsets = torch::cat({torch::zeros({1}, torch::kLong), counts.cumsum(0)});
  const torch::Tensor ts = t_mid.masked_select(keep);
  const torch::Tensor positions = p.index({keep});
  const torch::Tensor ray_indices = torch::nonzero(keep).select(1, 0);
  return {offsets, ts, torch::full_like(ts, kStep), positions, ray_indices};
}

void set_counters(benchmark::State& state, const Scene& s, int64_t samples) {
  state.SetItemsProcessed(state.iterations() * s.origins.size(0));  // rays/s
  state.counters["samples"] = static_cast<double>(samples);
}

void Op(benchmark::State& state) {
  const Scene s = make_scene(state.range(0), state.range(1), state.range(2));
  tessera::kernels::RayMarchParams params;
  params.step_size = kStep;
  params.max_samples_per_ray = kMaxSamples;
  int64_t samples = 0;
  for (auto _ : state) {
    auto out = tessera::kernels::ray_march(s.origins, s.directions, s.near, s.far, s.aabb,
                                           s.occupancy, params);
    samples = out.ts.size(0);
    benchmark::DoNotOptimize(out.ts.data_ptr());
  }
  set_counters(state, s, samples);
}

void Reference(benchmark::State& state) {
  const Scene s = make_scene(state.range(0), state.range(1), state.range(2));
  int64_t samples = 0;
  for (auto _ : state) {
    auto out = reference(s);
    samples = out[1].size(0);
    benchmark::DoNotOptimize(out[1].data_ptr());
  }
  set_counters(state, s, samples);
}

// {rays, grid resolution, scene}: the task's 4096 rays through a 128^3 grid, sparse and full.
void sizes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rays", "grid", "full"});
  b->Args({4096, 128, 0});
  b->Args({4096, 128, 1});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(Op)->Apply(sizes);
BENCHMARK(Reference)->Apply(sizes);

}  // namespace
