// Positional encoding and spherical harmonics for the NeRF models (see encodings.h).
#include "models/nerf/encodings.h"

#include <cmath>
#include <vector>

namespace tessera::models::nerf {

int64_t positional_encoding_width(int64_t dims, int64_t frequencies) {
  return dims * (1 + 2 * frequencies);
}

torch::Tensor positional_encoding(const torch::Tensor& x, int64_t frequencies) {
  std::vector<torch::Tensor> parts{x};
  for (int64_t k = 0; k < frequencies; ++k) {
    const double scale = std::ldexp(M_PI, static_cast<int>(k));
    const auto xs = x * scale;
    parts.push_back(torch::sin(xs));
    parts.push_back(torch::cos(xs));
  }
  return torch::cat(parts, 1);
}

torch::Tensor spherical_harmonics_deg4(const torch::Tensor& directions) {
  const auto x = directions.select(1, 0);
  const auto y = directions.select(1, 1);
  const auto z = directions.select(1, 2);
  const auto xy = x * y, xz = x * z, yz = y * z;
  const auto x2 = x * x, y2 = y * y, z2 = z * z;
  std::vector<torch::Tensor> out{
      torch::full_like(x, 0.28209479177387814),
      -0.48860251190291987 * y,
      0.48860251190291987 * z,
      -0.48860251190291987 * x,
      1.0925484305920792 * xy,
      -1.0925484305920792 * yz,
      0.94617469575756008 * z2 - 0.31539156525252005,
      -1.0925484305920792 * xz,
      0.54627421529603959 * x2 - 0.54627421529603959 * y2,
      0.59004358992664352 * y * (-3.0 * x2 + y2),
      2.8906114426405538 * xy * z,
      0.45704579946446572 * y * (1.0 - 5.0 * z2),
      0.3731763325901154 * z * (5.0 * z2 - 3.0),
      0.45704579946446572 * x * (1.0 - 5.0 * z2),
      1.4453057213202769 * z * (x2 - y2),
      0.59004358992664352 * x * (-x2 + 3.0 * y2),
  };
  return torch::stack(out, 1);
}

}  // namespace tessera::models::nerf
