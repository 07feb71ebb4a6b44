// ExactSum (framework/exact_sum.h) and the fixed-point kernels under it (kernels/fixed_point.h),
// under mpiexec -n 1, 2, 3, 4: the same values added in any order and grouping, on one rank or
// split across ranks, give the same bits, the exact sum rounded; values it cannot hold make the
// sum NaN. And torch's ops on the bitwise path (framework/thread_invariance.h) give the same bits
// at any thread count. The families' bitwise runs are tested with them (test_nerf_invariants,
// test_diffusion: "Deterministic*").
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/mpi_communicator.h"
#include "framework/exact_sum.h"
#include "framework/thread_invariance.h"
#include "kernels/cpu/parallel.h"
#include "kernels/fixed_point.h"
#include "tests/bitwise_trace.h"
#include "tests/cuda_skip.h"
#include "tests/mpi_test_env.h"

namespace tessera {
namespace {

distributed::Communicator& world() { return test::cpu_world(); }

// The same values added in any order and grouping, on one rank or split over ranks, give the
// same bits; and the sum is the exact one rounded (checked against float64 on values whose exact
// sum float64 holds).
TEST(ExactSum, AnyOrderAndGroupingGiveTheSameBits) {
  torch::manual_seed(3);
  const int64_t n = 1000, k = 12;
  // Magnitudes from 1e-12 to 1e4, both signs, and zeros.
  const torch::Tensor values =
      (torch::randn({k, n}) * torch::pow(10.0, torch::randint(-12, 5, {k, n}).to(torch::kFloat32)))
          .mul(torch::rand({k, n}).gt(0.1));
  auto sum_in = [&](const std::vector<int64_t>& order, distributed::Communicator& comm) {
    ExactSum s({{n}, {}}, torch::kCPU);
    const int64_t first = k * comm.rank() / comm.size(), last = k * (comm.rank() + 1) / comm.size();
    for (int64_t i = first; i < last; ++i) s.add(0, values[order[i]]);
    s.allreduce(comm);
    return s.value(0);
  };
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  std::vector<int64_t> forward(k), backward(k);
  for (int64_t i = 0; i < k; ++i) forward[i] = i, backward[i] = k - 1 - i;
  const torch::Tensor a = sum_in(forward, self), b = sum_in(backward, self),
                      c = sum_in(backward, world());
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_TRUE(torch::equal(a, c));
  // The float sums in those orders differ (so the test above can tell).
  EXPECT_FALSE(torch::equal(values.sum(0), values.flip(0).cumsum(0)[k - 1]));
  // Exact: 12 floats between 1e-3 and 1e4 in magnitude span under 53 bits, so their float64 sum
  // is exact in any order; the fixed-point sum read as float64 is that sum.
  const torch::Tensor moderate =
      torch::where(values.abs().ge(1e-3), values, torch::zeros_like(values));
  ExactSum s({{n}}, torch::kCPU);
  for (int64_t i = 0; i < k; ++i) s.add(0, moderate[i]);
  s.allreduce(self);
  EXPECT_TRUE(torch::equal(s.value(0, torch::kFloat64), moderate.to(torch::kFloat64).sum(0)));
}

TEST(ExactSum, ValuesItCannotHoldMakeTheSumNaN) {
  distributed::MpiCommunicator self(*test::g_context, MPI_COMM_SELF);
  ExactSum s({{3}, {2}}, torch::kCPU);
  s.add(0, torch::tensor({1.0f, std::nanf(""), 2.0f}));
  s.add(1, torch::tensor({1e20f, 0.5f}));  // 1e20 >= 2^47
  s.add(1, torch::tensor({-1e20f, 0.25f}));
  s.allreduce(self);
  EXPECT_TRUE(torch::isnan(s.value(0)).all().item<bool>());
  EXPECT_TRUE(torch::isnan(s.value(1)).all().item<bool>());
  ExactSum ok({{2}}, torch::kCPU);
  ok.add(0, torch::tensor({1e14f, -1e-30f}));  // below 2^47; below 2^-97 rounds to 0
  ok.add(0, torch::tensor({-1e14f, 1e-30f}));
  ok.allreduce(self);
  EXPECT_TRUE(torch::equal(ok.value(0), torch::zeros({2})));
  // Each value rounded by itself to a multiple of 2^-96, ties away from zero: 2^-97 is 2^-96,
  // 1.5 * 2^-98 is 0, -2^-97 is -2^-96.
  ExactSum tiny({{3}}, torch::kCPU);
  tiny.add(0, torch::tensor({std::ldexp(1.0f, -97), std::ldexp(1.5f, -98), -std::ldexp(1.0f, -97)}));
  tiny.allreduce(self);
  EXPECT_TRUE(torch::equal(tiny.value(0, torch::kFloat64),
                           torch::tensor({std::ldexp(1.0, -96), 0.0, -std::ldexp(1.0, -96)},
                                         torch::kFloat64)));
}

// Under TorchOnOneThread (framework/thread_invariance.h) torch's ops give the same bits whatever
// the thread count torch had: a layer's forward and both gradient GEMMs for six shapes, and on a
// million values the transcendentals whose scalar tail differs from their vector code (sigmoid,
// softplus, silu, exp) and a full sum. Without the guard two of the GEMM shapes (oneMKL's split
// row sums, strict mode or not), sigmoid, softplus and silu (the scalar tail of each thread's
// range) and the sum (per-thread partial sums) differ at 2 to 4 threads. Tessera's own loops keep every thread meanwhile.
TEST(ThreadInvariance, TorchOpsAreTheSameAtAnyThreadCountOnTheBitwisePath) {
  const char* env = std::getenv("MKL_CBWR");
  EXPECT_NE(blas_mode(), BlasMode::NotReproducible)
      << "MKL_CBWR=" << (env != nullptr ? env : "unset");
  struct Shape {
    int64_t rows, in, out;
  };
  const std::vector<Shape> shapes = {{8192, 64, 6}, {8192, 6, 64}, {4093, 37, 5},
                                     {100000, 32, 16}, {2048, 256, 1024}, {7, 100000, 3}};
  auto results = [&](int threads) {
    test::IntraOpThreads pinned(threads);
    TorchOnOneThread one;
    std::vector<torch::Tensor> out;
    torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    for (const Shape& s : shapes) {
      const torch::Tensor x = torch::randn({s.rows, s.in}, gen);
      const torch::Tensor w = torch::randn({s.out, s.in}, gen);
      const torch::Tensor dy = torch::randn({s.rows, s.out}, gen);
      out.push_back(torch::linear(x, w));  // forward
      out.push_back(dy.t().mm(x));         // weight gradient
      out.push_back(dy.mm(w));             // input gradient
    }
    const torch::Tensor v = torch::randn({1000003}, gen) * 4;
    out.push_back(torch::sigmoid(v));
    out.push_back(torch::softplus(v));
    out.push_back(torch::silu(v));
    out.push_back(torch::exp(v));
    out.push_back(v.sum());
    return out;
  };
  const std::vector<torch::Tensor> one = results(1);
  for (int threads = 2; threads <= 4; ++threads) {
    const std::vector<torch::Tensor> many = results(threads);
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(torch::equal(one[i], many[i])) << "result " << i << " at " << threads << " threads";
  }
#ifdef _OPENMP
  // Tessera's loops still split over the threads torch had.
  test::IntraOpThreads three(3);
  TorchOnOneThread one_thread;
  EXPECT_EQ(at::get_num_threads(), 1);
  std::vector<int> seen(64, 0);
  tessera::parallel_for(0, 3000, 1, [&](int64_t, int64_t) { seen.at(omp_get_thread_num()) = 1; });
  EXPECT_EQ(std::accumulate(seen.begin(), seen.end(), 0), 3);
#endif
}

// The CUDA kernels give the CPU's bits: the same digits added, the same normalization, the same
// read-back (launch/gpu-check runs this on a GPU; it skips elsewhere).
TEST(FixedPoint, CudaMatchesTheCpuBitwise) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  torch::manual_seed(4);
  const int64_t n = 100000;
  const torch::Tensor values =
      torch::randn({8, n}) * torch::pow(10.0, torch::randint(-30, 14, {8, n}).to(torch::kFloat32));
  values[0][0] = std::nanf("");  // one value it cannot hold, in row 0
  auto run = [&](torch::Device device) {
    torch::Tensor acc = torch::zeros({n, kernels::kFixedPointLimbs},
                                     torch::TensorOptions().dtype(torch::kInt64).device(device));
    torch::Tensor bad = torch::zeros({1}, acc.options());
    for (int64_t k = 0; k < 8; ++k) kernels::fixed_point_add(acc, values[k].to(device), bad);
    kernels::fixed_point_normalize(acc);
    return std::make_tuple(acc.cpu(), bad.cpu(),
                           kernels::fixed_point_to_float(acc, torch::kFloat32).cpu(),
                           kernels::fixed_point_to_float(acc, torch::kFloat64).cpu());
  };
  const auto [cpu_acc, cpu_bad, cpu_f32, cpu_f64] = run(torch::kCPU);
  const auto [gpu_acc, gpu_bad, gpu_f32, gpu_f64] = run(torch::Device(torch::kCUDA));
  EXPECT_EQ(cpu_bad.item<int64_t>(), 1);
  EXPECT_TRUE(torch::equal(cpu_bad, gpu_bad));
  EXPECT_TRUE(torch::equal(cpu_acc, gpu_acc));
  EXPECT_TRUE(torch::equal(cpu_f32, gpu_f32));
  EXPECT_TRUE(torch::equal(cpu_f64, gpu_f64));
}

}  // namespace
}  // namespace tessera
