// count_nonfinite: how many elements of a tensor are NaN or +-Inf. The loss scaler's found-inf
// flag and the skip-step decision reduce this across ranks.
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera::kernels {

// Returns an int64 scalar tensor on the input's device. Integer tensors count 0.
at::Tensor count_nonfinite(const at::Tensor& values);  // [any] -> []

namespace cpu {
at::Tensor count_nonfinite(const at::Tensor& values);  // [any] -> []
}
namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA).
at::Tensor count_nonfinite(const at::Tensor& values);  // [any] -> []
}

// True when this build compiled the CUDA kernels.
bool cuda_kernels_built();

}  // namespace tessera::kernels
