// Argument helpers shared by the CPU and CUDA kernel launchers (host code only).
#pragma once

#include <torch/torch.h>

namespace tessera::kernels {

// The data pointer of an optional tensor, nullptr when it is undefined.
template <typename T>
const T* optional_ptr(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// t.contiguous(), or the undefined tensor itself.
inline torch::Tensor contiguous_or_undefined(const torch::Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

}  // namespace tessera::kernels
