// Image metrics for eval: MSE, PSNR and SSIM on float images [H, W, C] in [0, 1], CPU or CUDA.
// All are computed in float64 and returned as doubles; definitions in docs/training.md.
#pragma once

#include <torch/types.h>

namespace tessera {

// Mean of (a - b)^2 over all elements. a and b: same shape, floating point, non-empty; b is moved
// to a's device when they differ. Throws std::invalid_argument otherwise.
double mse(const torch::Tensor& a, const torch::Tensor& b);  // [H, W, C], [H, W, C]

// The sum of a tensor's values in float64, added in index order on one thread (copied to the CPU
// first): the same bits at any thread count, where torch's reductions split large tensors across
// threads and so reassociate. For reported numbers, not for gradients.
double ordered_sum(const torch::Tensor& t);

// 10 log10(1 / mse) (data range 1). +inf when the images are equal; callers cap it for display.
double psnr(const torch::Tensor& a, const torch::Tensor& b);  // [H, W, C], [H, W, C]

// SSIM (Wang et al. 2004) as in the reference implementations used by NeRF papers (Mip-NeRF's
// compute_ssim): 11x11 Gaussian window with sigma 1.5, K1 = 0.01, K2 = 0.03, data range 1, over
// the 'valid' region (no padding), mean per channel, then averaged over channels. Images smaller
// than the window in H or W throw tessera::UserError.
double ssim(const torch::Tensor& a, const torch::Tensor& b);  // [H, W, C], [H, W, C]

}  // namespace tessera
