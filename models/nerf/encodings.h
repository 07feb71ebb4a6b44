// Input encodings of the NeRF models written with plain torch ops (differentiable, any device):
// NeRF's sinusoidal positional encoding and degree-4 real spherical harmonics for directions.
#pragma once

#include <torch/types.h>

#include <cstdint>

namespace tessera::models::nerf {

// [x, sin(2^0 pi x), cos(2^0 pi x), ..., sin(2^(L-1) pi x), cos(2^(L-1) pi x)] per component,
// as in Mildenhall et al. 2020 (identity included). [N, D] -> [N, D * (1 + 2 L)].
torch::Tensor positional_encoding(const torch::Tensor& x, int64_t frequencies);  // [N, D]
int64_t positional_encoding_width(int64_t dims, int64_t frequencies);

// The 16 real spherical-harmonic basis functions of degrees 0..3 ("degree 4" in instant-ngp's
// counting) at unit directions, with tiny-cuda-nn's constants and signs. [N, 3] -> [N, 16].
constexpr int64_t kShDegree4Width = 16;
torch::Tensor spherical_harmonics_deg4(const torch::Tensor& directions);  // [N, 3]

}  // namespace tessera::models::nerf
