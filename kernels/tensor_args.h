// Argument helpers shared by the CPU and CUDA kernel launchers (host code only).
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera::kernels {

// The data pointer of an optional tensor, nullptr when it is undefined.
template <typename T>
const T* optional_ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// t.contiguous(), or the undefined tensor itself.
inline at::Tensor contiguous_or_undefined(const at::Tensor& t) {
  return t.defined() ? t.contiguous() : t;
}

}  // namespace tessera::kernels
