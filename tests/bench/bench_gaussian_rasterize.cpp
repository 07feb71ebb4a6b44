// Benchmark of kernels::bin_gaussians + rasterize_gaussians on the CPU: forward + backward against
// the dense plain-LibTorch reference on a small image, and the kernels alone at 256 x 256.
//
// Op_ / Reference_ pairs take the same arguments (width, height, Gaussians), so time(Reference) /
// time(Op) is the speed-up. Run: build/tests/bench_gaussian_rasterize [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>

#include "kernels/gaussian_rasterize.h"
#include "kernels/tile_binning.h"
#include "tests/reference/gaussian_raster_reference.h"

namespace {

// N float32 Gaussians over a width x height image, std devs 0.5-3% of the image width (so a
// 256 x 256 image with 100k Gaussians has ~15 per pixel before the stop), opacities 0.05-0.95.
struct Scene {
  torch::Tensor means2d, conics, colors, opacities, background, radii, depths;
  int64_t width = 0, height = 0;
};

Scene make_scene(int64_t width, int64_t height, int64_t n) {
  torch::manual_seed(2024);
  Scene s;
  s.width = width;
  s.height = height;
  s.means2d = torch::rand({n, 2}) * torch::tensor({static_cast<float>(width),
                                                   static_cast<float>(height)});
  const torch::Tensor sx = (0.005 + 0.025 * torch::rand({n})) * width;
  const torch::Tensor sy = (0.005 + 0.025 * torch::rand({n})) * width;
  const torch::Tensor th = 3.14159265f * torch::rand({n});
  const torch::Tensor cs = torch::cos(th), sn = torch::sin(th);
  const torch::Tensor cxx = cs * cs * sx * sx + sn * sn * sy * sy;
  const torch::Tensor cyy = sn * sn * sx * sx + cs * cs * sy * sy;
  const torch::Tensor cxy = cs * sn * (sx * sx - sy * sy);
  const torch::Tensor det = cxx * cyy - cxy * cxy;
  s.conics = torch::stack({cyy / det, -cxy / det, cxx / det}, 1);
  s.radii = torch::ceil(3 * torch::maximum(sx, sy)).to(torch::kInt32);
  s.colors = torch::rand({n, 3});
  s.opacities = 0.05 + 0.9 * torch::rand({n});
  s.background = torch::rand({3});
  s.depths = 1 + 10 * torch::rand({n});
  return s;
}

struct Leaves {
  torch::Tensor means2d, conics, colors, opacities;
};

Leaves leaves_of(const Scene& s) {
  return {s.means2d.clone().requires_grad_(true), s.conics.clone().requires_grad_(true),
          s.colors.clone().requires_grad_(true), s.opacities.clone().requires_grad_(true)};
}

void set_counters(benchmark::State& state, const Scene& s) {
  state.SetItemsProcessed(state.iterations() * s.width * s.height);  // pixels/s
  state.counters["gaussians"] = static_cast<double>(s.means2d.size(0));
}

// Binning, rasterization and backward of L = sum(colors) + sum(alphas).
void Op_ForwardBackward(benchmark::State& state) {
  const Scene s = make_scene(state.range(0), state.range(1), state.range(2));
  const Leaves l = leaves_of(s);
  for (auto _ : state) {
    const auto bins = tessera::kernels::bin_gaussians(l.means2d, s.radii, s.depths, s.width,
                                                      s.height);
    const auto out = tessera::kernels::rasterize_gaussians(
        l.means2d, l.conics, l.colors, l.opacities, s.background, bins.tile_offsets,
        bins.gaussian_ids, s.width, s.height);
    auto grads = torch::autograd::grad({out.colors.sum() + out.alphas.sum()},
                                       {l.means2d, l.conics, l.colors, l.opacities});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_counters(state, s);
}

void Reference_ForwardBackward(benchmark::State& state) {
  const Scene s = make_scene(state.range(0), state.range(1), state.range(2));
  const Leaves l = leaves_of(s);
  for (auto _ : state) {
    const auto out = tessera::test::reference_rasterize(l.means2d, l.conics, l.colors,
                                                        l.opacities, s.background, s.radii,
                                                        s.depths, s.width, s.height, 16);
    auto grads = torch::autograd::grad({out.colors.sum() + out.alphas.sum()},
                                       {l.means2d, l.conics, l.colors, l.opacities});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  set_counters(state, s);
}

void Op_Forward(benchmark::State& state) {
  const Scene s = make_scene(state.range(0), state.range(1), state.range(2));
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    const auto bins = tessera::kernels::bin_gaussians(s.means2d, s.radii, s.depths, s.width,
                                                      s.height);
    const auto out = tessera::kernels::rasterize_gaussians(
        s.means2d, s.conics, s.colors, s.opacities, s.background, bins.tile_offsets,
        bins.gaussian_ids, s.width, s.height);
    benchmark::DoNotOptimize(out.colors.data_ptr());
  }
  set_counters(state, s);
}

void Op_Binning(benchmark::State& state) {
  const Scene s = make_scene(state.range(0), state.range(1), state.range(2));
  for (auto _ : state) {
    const auto bins = tessera::kernels::bin_gaussians(s.means2d, s.radii, s.depths, s.width,
                                                      s.height);
    benchmark::DoNotOptimize(bins.gaussian_ids.data_ptr());
  }
  set_counters(state, s);
}

void small(benchmark::internal::Benchmark* b) {
  b->ArgNames({"w", "h", "n"})->Args({64, 48, 500})->Unit(benchmark::kMillisecond)->UseRealTime();
}

void large(benchmark::internal::Benchmark* b) {
  b->ArgNames({"w", "h", "n"})
      ->Args({256, 256, 100000})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
}

BENCHMARK(Op_ForwardBackward)->Apply(small);
BENCHMARK(Reference_ForwardBackward)->Apply(small);
BENCHMARK(Op_Binning)->Apply(large);
BENCHMARK(Op_Forward)->Apply(large);
BENCHMARK(Op_ForwardBackward)->Apply(large);

}  // namespace
