// Benchmark of kernels::project_gaussians and kernels::spherical_harmonics on the CPU against
// their plain-LibTorch references (tests/reference/gaussian_projection_reference.h).
//
// Benchmarks come in pairs named Op / Reference with the same arguments (Gaussians; SH degree),
// so time(Reference) / time(Op) is the speed-up. Run:
//   build/tests/bench_gaussian_projection [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdint>

#include "kernels/gaussian_projection.h"
#include "kernels/spherical_harmonics.h"
#include "tests/reference/gaussian_projection_reference.h"

namespace {

// A 1280 x 720 camera at the origin looking down +z; Gaussians spread over a frustum-shaped
// box in front of it (about 80% on screen), random rotations and scales, float32.
constexpr double kFx = 1000, kFy = 1000, kCx = 640, kCy = 360;
constexpr int64_t kWidth = 1280, kHeight = 720;

struct Scene {
  torch::Tensor means, quats, scales, viewmat;  // [N, 3], [N, 4], [N, 3], [4, 4]
};

Scene make_scene(int64_t n) {
  torch::manual_seed(2024);
  Scene s;
  const torch::Tensor z = 1 + 9 * torch::rand({n});
  s.means = torch::stack(
      {(torch::rand({n}) * 2 - 1) * 0.8 * z, (torch::rand({n}) * 2 - 1) * 0.45 * z, z}, 1);
  s.quats = torch::randn({n, 4});
  s.scales = torch::exp(torch::empty({n, 3}).uniform_(std::log(0.005), std::log(0.1)));
  s.viewmat = torch::eye(4);
  return s;
}

void project_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N"})->Arg(100000)->Unit(benchmark::kMillisecond)->UseRealTime();
}

void Op_ProjectForward(benchmark::State& state) {
  const Scene s = make_scene(state.range(0));
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = tessera::kernels::project_gaussians(s.means, s.quats, s.scales, s.viewmat, kFx, kFy,
                                                   kCx, kCy, kWidth, kHeight);
    benchmark::DoNotOptimize(out.conics.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void Reference_ProjectForward(benchmark::State& state) {
  const Scene s = make_scene(state.range(0));
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = tessera::test::reference_project_gaussians(s.means, s.quats, s.scales, s.viewmat,
                                                          kFx, kFy, kCx, kCy, kWidth, kHeight);
    benchmark::DoNotOptimize(out.conics.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// Forward and backward of L = sum(means2d) + sum(depths) + sum(conics).
template <typename Project>
void project_forward_backward(benchmark::State& state, Project project) {
  const Scene s = make_scene(state.range(0));
  const torch::Tensor means = s.means.clone().requires_grad_(true);
  const torch::Tensor quats = s.quats.clone().requires_grad_(true);
  const torch::Tensor scales = s.scales.clone().requires_grad_(true);
  for (auto _ : state) {
    auto out = project(means, quats, scales, s.viewmat);
    auto grads = torch::autograd::grad(
        {out.means2d.sum() + out.depths.sum() + out.conics.sum()}, {means, quats, scales});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void Op_ProjectForwardBackward(benchmark::State& state) {
  project_forward_backward(state, [](const torch::Tensor& m, const torch::Tensor& q,
                                     const torch::Tensor& s, const torch::Tensor& v) {
    return tessera::kernels::project_gaussians(m, q, s, v, kFx, kFy, kCx, kCy, kWidth, kHeight);
  });
}

void Reference_ProjectForwardBackward(benchmark::State& state) {
  project_forward_backward(state, [](const torch::Tensor& m, const torch::Tensor& q,
                                     const torch::Tensor& s, const torch::Tensor& v) {
    return tessera::test::reference_project_gaussians(m, q, s, v, kFx, kFy, kCx, kCy, kWidth,
                                                      kHeight);
  });
}

// --- spherical harmonics: {N, degree}, 16 coefficients per channel ---------------------------

void sh_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "degree"})->Args({100000, 3})->Args({100000, 1});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

// The coefficients as a 3DGS model holds them, sh_dc [N, 1, 3] and sh_rest [N, 15, 3]: the op
// reads them as they are, the plain-LibTorch reference concatenates them first.
template <typename Evaluate>
void sh_forward(benchmark::State& state, Evaluate evaluate) {
  torch::manual_seed(7);
  const torch::Tensor dirs = torch::randn({state.range(0), 3});
  const torch::Tensor dc = torch::randn({state.range(0), 1, 3});
  const torch::Tensor rest = torch::randn({state.range(0), 15, 3});
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto colors = evaluate(state.range(1), dirs, dc, rest);
    benchmark::DoNotOptimize(colors.data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

template <typename Evaluate>
void sh_forward_backward(benchmark::State& state, Evaluate evaluate) {
  torch::manual_seed(7);
  const torch::Tensor dirs = torch::randn({state.range(0), 3}).requires_grad_(true);
  const torch::Tensor dc = torch::randn({state.range(0), 1, 3}).requires_grad_(true);
  const torch::Tensor rest = torch::randn({state.range(0), 15, 3}).requires_grad_(true);
  for (auto _ : state) {
    auto colors = evaluate(state.range(1), dirs, dc, rest);
    auto grads = torch::autograd::grad({colors.sum()}, {dirs, dc, rest});
    benchmark::DoNotOptimize(grads[0].data_ptr());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

torch::Tensor op_sh(int64_t degree, const torch::Tensor& d, const torch::Tensor& dc,
                    const torch::Tensor& rest) {
  return tessera::kernels::spherical_harmonics(degree, d, dc, rest);
}
torch::Tensor ref_sh(int64_t degree, const torch::Tensor& d, const torch::Tensor& dc,
                     const torch::Tensor& rest) {
  return tessera::test::reference_spherical_harmonics(degree, d, torch::cat({dc, rest}, 1));
}

void Op_ShForward(benchmark::State& state) { sh_forward(state, op_sh); }
void Reference_ShForward(benchmark::State& state) { sh_forward(state, ref_sh); }
void Op_ShForwardBackward(benchmark::State& state) { sh_forward_backward(state, op_sh); }
void Reference_ShForwardBackward(benchmark::State& state) { sh_forward_backward(state, ref_sh); }

BENCHMARK(Op_ProjectForward)->Apply(project_args);
BENCHMARK(Reference_ProjectForward)->Apply(project_args);
BENCHMARK(Op_ProjectForwardBackward)->Apply(project_args);
BENCHMARK(Reference_ProjectForwardBackward)->Apply(project_args);
BENCHMARK(Op_ShForward)->Apply(sh_args);
BENCHMARK(Reference_ShForward)->Apply(sh_args);
BENCHMARK(Op_ShForwardBackward)->Apply(sh_args);
BENCHMARK(Reference_ShForwardBackward)->Apply(sh_args);

}  // namespace
