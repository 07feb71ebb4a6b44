// A separable filter over planes with zero 'same' padding, for the Gaussian window of the 3DGS
// training loss's SSIM. CPU only: on other devices the caller uses two depthwise torch::conv2d,
// which compute the same.
#pragma once

#include <torch/types.h>

namespace tessera::kernels {

// planes [K, H, W] and window [L] (L odd), both float32 or both float64 on the CPU: each plane
// correlated with the window along W, then along H, zero outside the plane, so the output
// [K, H, W] has the planes' shape (tap i of the window reads offset i - L/2). Planes run in
// parallel (at::parallel_for). Throws std::invalid_argument on other shapes, dtypes or devices.
torch::Tensor separable_blur_cpu(const torch::Tensor& planes, const torch::Tensor& window);

}  // namespace tessera::kernels
