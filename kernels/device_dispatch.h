// The one rule for which implementation of a kernel op runs: the CPU one for CPU tensors, the CUDA
// one for CUDA tensors in a build with the CUDA kernels (TESSERA_WITH_CUDA); any other device, or
// a CUDA tensor in a build without them, is an error that names the op.
#pragma once

#include <c10/util/Exception.h>
#include <torch/types.h>

namespace tessera::kernels {

#ifdef TESSERA_WITH_CUDA
inline constexpr bool kCudaKernelsBuilt = true;
#else
inline constexpr bool kCudaKernelsBuilt = false;
#endif

// Returns cpu() or cuda() by the device of `t`. The cuda lambda may name the cuda:: entry points
// in every build: they are declared always and defined only with CUDA, and a build without it
// never calls the lambda.
template <typename CpuFn, typename CudaFn>
decltype(auto) on_device(const char* op, const torch::Tensor& t, CpuFn&& cpu, CudaFn&& cuda) {
  if (t.is_cpu()) return cpu();
  if constexpr (kCudaKernelsBuilt) {
    if (t.is_cuda()) return cuda();
  }
  TORCH_CHECK(false, op, ": no implementation for device ", t.device(), " in this build");
  return cpu();  // not reached
}

}  // namespace tessera::kernels
