// Tolerance comparison for kernel tests: counts the elements out of |a - e| <= rtol*|e| +
// atol*max(1, max|e|), reports the worst one, and fails on NaN or Inf in the result.
#pragma once

#include <gtest/gtest.h>
#include <torch/types.h>

#include <algorithm>
#include <string>

#include "kernels/nonfinite.h"

namespace tessera::test {

inline void expect_close(const torch::Tensor& actual, const torch::Tensor& expected, double rtol,
                         double atol, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_EQ(actual.scalar_type(), expected.scalar_type()) << what;
  if (expected.numel() == 0) return;
  const torch::Tensor a = actual.detach().cpu().to(torch::kFloat64);
  const torch::Tensor e = expected.detach().cpu().to(torch::kFloat64);
  ASSERT_EQ(kernels::count_nonfinite(a).item<int64_t>(), 0) << what << " has NaN or Inf";
  const double scale = std::max(1.0, e.abs().max().item<double>());
  const torch::Tensor err = (a - e).abs();
  const torch::Tensor bad = err > rtol * e.abs() + atol * scale;
  const int64_t worst = err.argmax().item<int64_t>();
  EXPECT_EQ(bad.sum().item<int64_t>(), 0)
      << what << ": " << bad.sum().item<int64_t>() << " of " << e.numel()
      << " elements out of tolerance; worst at " << worst << ": "
      << a.view(-1)[worst].item<double>() << " vs " << e.view(-1)[worst].item<double>();
}

}  // namespace tessera::test
