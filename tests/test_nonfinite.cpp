// Tests of kernels::count_nonfinite against the plain-LibTorch reference (~isfinite(x)).sum():
// every floating dtype, many shapes (empty, 0-dim, odd, > 1e6), strided inputs, and CUDA vs CPU.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "kernels/nonfinite.h"
#include "tests/cuda_skip.h"

namespace tessera::kernels {
namespace {

// The reference: plain LibTorch, on the CPU.
int64_t reference_count(const torch::Tensor& values) {
  return (~torch::isfinite(values.cpu())).sum().item<int64_t>();
}

std::string describe(const torch::Tensor& t) {
  std::string shape = "[";
  for (int64_t i = 0; i < t.dim(); ++i) shape += (i ? "," : "") + std::to_string(t.size(i));
  return std::string(c10::toString(t.scalar_type())) + " " + shape + "]";
}

// Checks the contract of the result: an int64 0-dim tensor on `device`, and returns its value.
int64_t checked_count(const torch::Tensor& values, const torch::Device& device) {
  const torch::Tensor result = count_nonfinite(values);
  EXPECT_EQ(result.scalar_type(), torch::kInt64) << describe(values);
  EXPECT_EQ(result.dim(), 0) << describe(values);
  EXPECT_EQ(result.device(), device) << describe(values);
  return result.cpu().item<int64_t>();
}

// A tensor of `shape` and `dtype` with finite random values and NaN, +Inf and -Inf planted at
// positions drawn from a fixed seed (some positions may be hit twice: the reference decides).
torch::Tensor planted(const std::vector<int64_t>& shape, torch::ScalarType dtype, uint64_t seed,
                      int64_t plants_per_kind) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn(shape, torch::dtype(torch::kFloat64));
  const int64_t n = x.numel();
  if (n > 0 && plants_per_kind > 0) {
    torch::Tensor flat = x.view({-1});
    const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity()};
    for (double special : specials) {
      const torch::Tensor where = torch::randint(n, {plants_per_kind}, torch::dtype(torch::kInt64));
      flat.index_fill_(0, where, special);
    }
  }
  return x.to(dtype);
}

const std::vector<torch::ScalarType> kFloatTypes = {torch::kFloat32, torch::kFloat64,
                                                    torch::kFloat16, torch::kBFloat16};

const std::vector<std::vector<int64_t>> kShapes = {
    {0}, {3, 0, 5}, {}, {1}, {7}, {31, 3}, {2, 3, 5, 7}, {33333}, {1000003}, {1 << 21}};

TEST(CountNonfinite, MatchesReferenceOnEveryDtypeAndShape) {
  uint64_t seed = 1;
  for (const auto dtype : kFloatTypes) {
    for (const auto& shape : kShapes) {
      int64_t numel = 1;
      for (int64_t s : shape) numel *= s;
      // About one special value in 50, at least one of each kind where there is room.
      const int64_t plants = numel == 0 ? 0 : std::max<int64_t>(1, numel / 150);
      const torch::Tensor x = planted(shape, dtype, seed++, plants);
      const int64_t expected = reference_count(x);
      if (numel > 0) {
        EXPECT_GT(expected, 0) << describe(x);  // the test plants something to find
      }
      EXPECT_EQ(checked_count(x, torch::kCPU), expected) << describe(x);
    }
  }
}

TEST(CountNonfinite, AllFiniteCountsZero) {
  for (const auto dtype : kFloatTypes) {
    torch::manual_seed(7);
    const torch::Tensor x = torch::randn({100001}, torch::dtype(torch::kFloat32)).to(dtype);
    ASSERT_EQ(reference_count(x), 0);
    EXPECT_EQ(checked_count(x, torch::kCPU), 0) << describe(x);
  }
}

TEST(CountNonfinite, AllNonfiniteCountsEveryElement) {
  for (const auto dtype : kFloatTypes) {
    const torch::Tensor x =
        torch::full({4099}, std::numeric_limits<double>::quiet_NaN(), torch::dtype(dtype));
    EXPECT_EQ(checked_count(x, torch::kCPU), 4099) << describe(x);
    const torch::Tensor inf = torch::full({5, 0x1001}, -std::numeric_limits<double>::infinity(),
                                          torch::dtype(dtype));
    EXPECT_EQ(checked_count(inf, torch::kCPU), 5 * 0x1001) << describe(inf);
  }
}

TEST(CountNonfinite, ScalarTensors) {
  for (const auto dtype : kFloatTypes) {
    EXPECT_EQ(checked_count(torch::tensor(1.5, torch::dtype(dtype)), torch::kCPU), 0);
    EXPECT_EQ(checked_count(torch::tensor(std::numeric_limits<double>::quiet_NaN(),
                                          torch::dtype(dtype)),
                            torch::kCPU),
              1);
    EXPECT_EQ(checked_count(torch::tensor(-std::numeric_limits<double>::infinity(),
                                          torch::dtype(dtype)),
                            torch::kCPU),
              1);
  }
}

// Values that overflow the narrower types become Inf there: the count follows the stored dtype.
TEST(CountNonfinite, OverflowOnConversionIsCounted) {
  const torch::Tensor big = torch::tensor({1e5, 1.0, -1e5, 6e4}, torch::dtype(torch::kFloat32));
  const torch::Tensor half = big.to(torch::kFloat16);  // max finite half is 65504
  EXPECT_EQ(reference_count(half), 2);
  EXPECT_EQ(checked_count(half, torch::kCPU), 2);
  EXPECT_EQ(checked_count(big, torch::kCPU), 0);
}

// A finite float64 beyond FLT_MAX (~3.4e38) must not turn into Inf by a cast to float.
TEST(CountNonfinite, LargeFiniteDoublesAreFinite) {
  const double max = std::numeric_limits<double>::max();
  const torch::Tensor x = torch::tensor({1e300, -1e39, max, -max, 3.5e38, 1.0, 1e-320},
                                        torch::dtype(torch::kFloat64));
  ASSERT_EQ(reference_count(x), 0);
  EXPECT_EQ(checked_count(x, torch::kCPU), 0) << "finite doubles beyond the float range";
  torch::Tensor mixed = x.clone();
  mixed[1] = std::numeric_limits<double>::quiet_NaN();
  ASSERT_EQ(reference_count(mixed), 1);
  EXPECT_EQ(checked_count(mixed, torch::kCPU), 1);
}

TEST(CountNonfinite, NonContiguousInputs) {
  uint64_t seed = 100;
  for (const auto dtype : kFloatTypes) {
    const torch::Tensor base = planted({257, 129}, dtype, seed++, 300);
    const std::vector<torch::Tensor> views = {
        base.t(),                                                     // transposed
        base.slice(1, 1, 128, 3),                                     // strided columns
        base.slice(0, 0, 257, 2).slice(1, 5, 100),                    // strided rows, offset
        base.unsqueeze(0).expand({3, 257, 129}),                      // zero stride
        base.select(1, 64),                                           // one column
    };
    for (const auto& view : views) {
      const int64_t expected = reference_count(view);
      EXPECT_EQ(checked_count(view, torch::kCPU), expected) << describe(view);
    }
    // The planted values are not all inside a small view: the count must follow the view.
    EXPECT_NE(reference_count(base.slice(1, 1, 128, 3)), reference_count(base)) << describe(base);
  }
}

TEST(CountNonfinite, IntegerAndBoolTensorsCountZero) {
  const std::vector<torch::ScalarType> types = {torch::kUInt8, torch::kInt8,  torch::kInt16,
                                                torch::kInt32, torch::kInt64, torch::kBool};
  for (const auto dtype : types) {
    const torch::Tensor x = torch::arange(0, 1001).to(dtype);
    EXPECT_EQ(checked_count(x, torch::kCPU), 0) << describe(x);
    EXPECT_EQ(checked_count(torch::zeros({}, torch::dtype(dtype)), torch::kCPU), 0);
    EXPECT_EQ(checked_count(torch::zeros({0}, torch::dtype(dtype)), torch::kCPU), 0);
  }
}

TEST(CountNonfinite, DispatchMatchesCpuImplementation) {
  const torch::Tensor x = planted({12345}, torch::kFloat32, 55, 40);
  EXPECT_EQ(count_nonfinite(x).item<int64_t>(), cpu::count_nonfinite(x).item<int64_t>());
}

// --- CUDA ------------------------------------------------------------------------------------

TEST(CountNonfiniteCuda, MatchesCpuOnEveryDtypeAndShape) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  uint64_t seed = 1000;
  for (const auto dtype : kFloatTypes) {
    for (const auto& shape : kShapes) {
      int64_t numel = 1;
      for (int64_t s : shape) numel *= s;
      const int64_t plants = numel == 0 ? 0 : std::max<int64_t>(1, numel / 150);
      const torch::Tensor x = planted(shape, dtype, seed++, plants);
      const int64_t on_cpu = cpu::count_nonfinite(x).item<int64_t>();
      EXPECT_EQ(on_cpu, reference_count(x)) << describe(x);
      EXPECT_EQ(checked_count(x.to(device), device), on_cpu) << describe(x);
    }
  }
}

TEST(CountNonfiniteCuda, LargeInputUsesGridStride) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  // More elements than kMaxBlocks * kThreads (4096 * 256), so every thread loops.
  const torch::Tensor x = planted({5000017}, torch::kFloat32, 77, 20000);
  EXPECT_EQ(checked_count(x.to(device), device), cpu::count_nonfinite(x).item<int64_t>());
  const torch::Tensor all_nan =
      torch::full({3000001}, std::numeric_limits<float>::quiet_NaN(), torch::dtype(torch::kFloat16));
  EXPECT_EQ(checked_count(all_nan.to(device), device), 3000001);
}

TEST(CountNonfiniteCuda, NonContiguousScalarAndIntegerInputs) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  uint64_t seed = 2000;
  for (const auto dtype : kFloatTypes) {
    const torch::Tensor base = planted({257, 129}, dtype, seed++, 300).to(device);
    for (const auto& view : {base.t(), base.slice(1, 1, 128, 3), base.select(1, 64)})
      EXPECT_EQ(checked_count(view, device), reference_count(view)) << describe(view);
    EXPECT_EQ(checked_count(torch::tensor(std::numeric_limits<double>::infinity(),
                                          torch::dtype(dtype).device(device)),
                            device),
              1);
  }
  EXPECT_EQ(checked_count(torch::arange(0, 1001, torch::dtype(torch::kInt32).device(device)), device),
            0);
}

// As CountNonfinite.LargeFiniteDoublesAreFinite, for the CUDA implementation.
TEST(CountNonfiniteCuda, LargeFiniteDoublesAreFinite) {
  TESSERA_SKIP_UNLESS_CUDA_KERNELS();
  const torch::Device device(torch::kCUDA, 0);
  const double max = std::numeric_limits<double>::max();
  const torch::Tensor x =
      torch::tensor({1e300, -1e39, max, -max, 3.5e38, 1.0}, torch::dtype(torch::kFloat64));
  ASSERT_EQ(reference_count(x), 0);
  EXPECT_EQ(checked_count(x.to(device), device), 0);
}

// tests/cuda_skip.h: a CUDA case skips where CUDA is missing, but fails on a GPU machine (a device
// node, or TESSERA_REQUIRE_CUDA set to anything but 0), where a skip would have tested nothing.
TEST(CudaSkipRule, SkipsOnlyOffGpuMachines) {
  using test::missing_cuda_verdict;
  using test::MissingCuda;
  EXPECT_EQ(missing_cuda_verdict(nullptr, false), MissingCuda::Skip);
  EXPECT_EQ(missing_cuda_verdict("", false), MissingCuda::Skip);
  EXPECT_EQ(missing_cuda_verdict(nullptr, true), MissingCuda::Fail);
  EXPECT_EQ(missing_cuda_verdict("1", false), MissingCuda::Fail);
  EXPECT_EQ(missing_cuda_verdict("yes", false), MissingCuda::Fail);
  EXPECT_EQ(missing_cuda_verdict("0", true), MissingCuda::Skip);
  EXPECT_EQ(missing_cuda_verdict("1", true), MissingCuda::Fail);
}

}  // namespace
}  // namespace tessera::kernels
