// exp, sigmoid, log and logit whose value at an element depends on that element alone. torch's CPU
// kernels compute the last values of each thread's range (and of the tensor) with scalar code whose
// transcendentals can differ from the vectorized code's in the last bit, so there a value's bits
// follow its place in the tensor and the thread count; a sharded model's rows (3DGS Gaussians) sit
// at places that follow the world size. On the CPU these run the scalar code on every element;
// elsewhere they are torch's ops (a GPU runs the same code on every element).
#pragma once

#include <ATen/core/Tensor.h>

namespace tessera::kernels::pointwise {

at::Tensor exp(const at::Tensor& x);      // differentiable: d/dx = exp(x)
at::Tensor sigmoid(const at::Tensor& x);  // differentiable: d/dx = s (1 - s)
at::Tensor log(const at::Tensor& x);      // not differentiated
at::Tensor logit(const at::Tensor& x);    // not differentiated: log(x / (1 - x))

}  // namespace tessera::kernels::pointwise
