// The one rule for a test case that needs CUDA (a device, the CUDA kernels, NCCL): where they are
// missing it skips, except on a GPU machine, where a skipped CUDA case has tested nothing and
// fails instead. A GPU machine is one with an NVIDIA device node (/dev/nvidia0), or any machine
// where TESSERA_REQUIRE_CUDA=1 (launch/gpu-check sets it); TESSERA_REQUIRE_CUDA=0 allows the skip
// on a GPU machine (a build made without CUDA there).
//
// Use: `TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available(), "no CUDA device");` (kernels:
// `TESSERA_SKIP_UNLESS_CUDA_KERNELS();`)
// at the top of the case (or in SetUp). Fewer GPUs than ranks is not a missing GPU: a
// multi-rank case that needs a device per rank skips with a plain GTEST_SKIP on a one-GPU machine.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "kernels/nonfinite.h"

namespace tessera::test {

// A CUDA device is visible and this build compiled the CUDA kernels.
inline bool cuda_usable() { return torch::cuda::is_available() && kernels::cuda_kernels_built(); }

enum class MissingCuda { Skip, Fail };

// The decision, from the value of TESSERA_REQUIRE_CUDA (null when unset) and whether the machine
// has an NVIDIA device node.
inline MissingCuda missing_cuda_verdict(const char* require_env, bool gpu_device_node) {
  if (require_env != nullptr && *require_env != '\0')
    return std::strcmp(require_env, "0") == 0 ? MissingCuda::Skip : MissingCuda::Fail;
  return gpu_device_node ? MissingCuda::Fail : MissingCuda::Skip;
}

inline MissingCuda missing_cuda_verdict() {
  std::error_code ignored;
  return missing_cuda_verdict(std::getenv("TESSERA_REQUIRE_CUDA"),
                              std::filesystem::exists("/dev/nvidia0", ignored));
}

}  // namespace tessera::test

// Skips (or, on a GPU machine, fails) the current test unless `available` is true.
#define TESSERA_SKIP_UNLESS_CUDA(available, reason)                                            \
  do {                                                                                          \
    if (!(available)) {                                                                         \
      if (::tessera::test::missing_cuda_verdict() == ::tessera::test::MissingCuda::Fail)        \
        GTEST_FAIL() << "a CUDA case could not run on a GPU machine (TESSERA_REQUIRE_CUDA or "  \
                        "/dev/nvidia0): "                                                       \
                     << (reason);                                                               \
      GTEST_SKIP() << (reason);                                                                 \
    }                                                                                           \
  } while (0)

// The kernels' CUDA cases: a visible device and a build with the CUDA kernels.
#define TESSERA_SKIP_UNLESS_CUDA_KERNELS()                 \
  TESSERA_SKIP_UNLESS_CUDA(::tessera::test::cuda_usable(), \
                           "no CUDA device visible or CUDA kernels not built")
