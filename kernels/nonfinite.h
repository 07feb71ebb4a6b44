// count_nonfinite: how many elements of a tensor are NaN or +-Inf. The loss scaler's found-inf
// flag and the skip-step decision reduce this across ranks.
#pragma once

#include <torch/types.h>

namespace tessera::kernels {

// Returns an int64 scalar tensor on the input's device. Integer tensors count 0.
torch::Tensor count_nonfinite(const torch::Tensor& values);  // [any] -> []

namespace cpu {
torch::Tensor count_nonfinite(const torch::Tensor& values);  // [any] -> []
}
namespace cuda {
// Defined only in builds with CUDA (TESSERA_WITH_CUDA).
torch::Tensor count_nonfinite(const torch::Tensor& values);  // [any] -> []
}

// True when this build compiled the CUDA kernels.
bool cuda_kernels_built();

}  // namespace tessera::kernels
