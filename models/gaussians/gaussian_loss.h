// The 3DGS photometric loss: (1 - lambda) L1 + lambda (1 - SSIM), with a differentiable SSIM
// ('same' zero padding, as INRIA's training SSIM) whose mean has its gradient in closed form.
#pragma once

#include <torch/types.h>

namespace tessera::models::gaussians {

// INRIA 3DGS's lambda_dssim: the weight of the SSIM term.
constexpr double kDefaultSsimWeight = 0.2;
constexpr int64_t kSsimWindow = 11;  // window side (Wang et al. 2004)
constexpr double kSsimSigma = 1.5;   // Gaussian window standard deviation, pixels

// Per-pixel SSIM map [H, W, C] of two images [H, W, C] (same shape, same floating dtype):
// separable 11x11 Gaussian window (sigma 1.5, normalized), zero 'same' padding of 5 pixels,
// C1 = 0.01^2, C2 = 0.03^2 (data range 1); each channel on its own. Differentiable in both.
torch::Tensor ssim_map(const torch::Tensor& a, const torch::Tensor& b);
// Mean of ssim_map over all pixels and channels (INRIA's ssim(), size_average). Its backward is
// written out (one filter pass for all the gradient maps) rather than autograd through the map.
torch::Tensor ssim_same(const torch::Tensor& a, const torch::Tensor& b);

// (1 - ssim_weight) * mean|render - target| + ssim_weight * (1 - ssim_same(render, target)).
torch::Tensor photometric_loss(const torch::Tensor& render,  // [H, W, 3]
                               const torch::Tensor& target,  // [H, W, 3]
                               double ssim_weight = kDefaultSsimWeight);

}  // namespace tessera::models::gaussians
