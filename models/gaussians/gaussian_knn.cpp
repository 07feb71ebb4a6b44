// The exact grid kNN of gaussian_params.h (knn): the initial scales' neighbour distances.
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/cpu/parallel.h"
#include "models/gaussians/gaussian_params.h"

namespace tessera::models::gaussians {
namespace {

// Grid kNN: about this many points per cell for uniformly spread points, and at most this many
// cells per point (flat or clustered point sets would otherwise ask for a huge grid).
constexpr double kPointsPerCell = 2.0;
constexpr double kMaxCellsPerPoint = 2.0;
constexpr double kCellGrowth = 1.25;  // cell side growth while the grid is too large
// Relative slack on the "no closer point outside the searched block" bound: covers the rounding
// of the cell assignment (about 1e-16 relative), so the search stays exact.
constexpr double kBoundSlack = 1e-7;
constexpr int64_t kKnnGrain = 256;  // points per parallel_for task

}  // namespace

KnnResult knn(const torch::Tensor& points, int k, int64_t first, int64_t count) {
  if (!points.defined() || points.dim() != 2 || points.size(1) != 3)
    throw std::invalid_argument("knn: points must be [N, 3]");
  if (k < 1) throw std::invalid_argument("knn: k must be >= 1");
  const torch::Tensor pts = points.to(torch::kCPU, torch::kFloat32).contiguous();
  const int64_t n = pts.size(0);
  if (count < 0) count = n - first;
  if (first < 0 || first + count > n) throw std::invalid_argument("knn: query range out of bounds");
  KnnResult out{torch::full({count, k}, std::numeric_limits<double>::infinity(), torch::kFloat64),
                torch::full({count, k}, -1, torch::kInt64)};
  if (n == 0 || count == 0) return out;
  const float* p = pts.data_ptr<float>();

  double lo[3], hi[3];
  for (int a = 0; a < 3; ++a) lo[a] = hi[a] = p[a];
  for (int64_t i = 0; i < n; ++i)
    for (int a = 0; a < 3; ++a) {
      lo[a] = std::min(lo[a], static_cast<double>(p[i * 3 + a]));
      hi[a] = std::max(hi[a], static_cast<double>(p[i * 3 + a]));
    }
  double ext[3], max_ext = 0;
  for (int a = 0; a < 3; ++a) max_ext = std::max(max_ext, hi[a] - lo[a]);
  if (!(max_ext > 0)) max_ext = 1.0;  // all points equal (or non-finite): one cell
  for (int a = 0; a < 3; ++a) ext[a] = std::max(hi[a] - lo[a], max_ext * 1e-6);
  double h = std::cbrt(ext[0] * ext[1] * ext[2] / static_cast<double>(n) * kPointsPerCell);
  int64_t dims[3];
  for (;;) {
    double cells = 1;
    for (int a = 0; a < 3; ++a) cells *= std::max(1.0, std::ceil(ext[a] / h));
    if (cells <= kMaxCellsPerPoint * static_cast<double>(n) + 1) break;
    h *= kCellGrowth;
  }
  for (int a = 0; a < 3; ++a)
    dims[a] = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ext[a] / h)));
  const int64_t num_cells = dims[0] * dims[1] * dims[2];

  auto cell_coord = [&](double v, int a) {
    const double c = std::floor((v - lo[a]) / h);
    if (!std::isfinite(c)) return int64_t{0};  // non-finite points: any cell, never a crash
    return static_cast<int64_t>(std::clamp(c, 0.0, static_cast<double>(dims[a] - 1)));
  };
  // Counting sort of the points by cell: cell c holds order[start[c] .. start[c + 1]).
  std::vector<int64_t> cell_of(n), start(num_cells + 1, 0), order(n);
  for (int64_t i = 0; i < n; ++i) {
    int64_t c[3];
    for (int a = 0; a < 3; ++a) c[a] = cell_coord(p[i * 3 + a], a);
    cell_of[i] = (c[2] * dims[1] + c[1]) * dims[0] + c[0];
    ++start[cell_of[i] + 1];
  }
  for (int64_t c = 0; c < num_cells; ++c) start[c + 1] += start[c];
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[fill[cell_of[i]]++] = i;
  }

  double* out_d = out.dist2.data_ptr<double>();
  int64_t* out_i = out.indices.data_ptr<int64_t>();
  tessera::parallel_for(first, first + count, kKnnGrain, [&](int64_t begin, int64_t end) {
    std::vector<double> best_d(k);
    std::vector<int64_t> best_i(k);
    for (int64_t i = begin; i < end; ++i) {
      const double q[3] = {p[i * 3], p[i * 3 + 1], p[i * 3 + 2]};
      int64_t c[3];
      for (int a = 0; a < 3; ++a) c[a] = cell_coord(q[a], a);
      int found = 0;
      auto visit = [&](int64_t cell) {
        for (int64_t s = start[cell]; s < start[cell + 1]; ++s) {
          const int64_t j = order[s];
          if (j == i) continue;
          const double dx = static_cast<double>(p[j * 3]) - q[0];
          const double dy = static_cast<double>(p[j * 3 + 1]) - q[1];
          const double dz = static_cast<double>(p[j * 3 + 2]) - q[2];
          const double d2 = dx * dx + dy * dy + dz * dz;
          if (found == k && !(d2 < best_d[k - 1])) continue;
          int pos = found < k ? found++ : k - 1;
          while (pos > 0 && best_d[pos - 1] > d2) {
            best_d[pos] = best_d[pos - 1];
            best_i[pos] = best_i[pos - 1];
            --pos;
          }
          best_d[pos] = d2;
          best_i[pos] = j;
        }
      };
      for (int64_t r = 0;; ++r) {
        // The shell of cells at Chebyshev distance exactly r from c.
        for (int64_t z = std::max<int64_t>(0, c[2] - r); z <= std::min(dims[2] - 1, c[2] + r); ++z)
          for (int64_t y = std::max<int64_t>(0, c[1] - r); y <= std::min(dims[1] - 1, c[1] + r);
               ++y) {
            const bool inner = std::abs(z - c[2]) < r && std::abs(y - c[1]) < r;
            if (inner) {  // only the two end cells of this row lie on the shell
              if (c[0] - r >= 0) visit((z * dims[1] + y) * dims[0] + c[0] - r);
              if (c[0] + r < dims[0]) visit((z * dims[1] + y) * dims[0] + c[0] + r);
              continue;
            }
            for (int64_t x = std::max<int64_t>(0, c[0] - r); x <= std::min(dims[0] - 1, c[0] + r);
                 ++x)
              visit((z * dims[1] + y) * dims[0] + x);
          }
        // Any point outside the searched block is at least `bound` away.
        double bound = std::numeric_limits<double>::infinity();
        bool covers_all = true;
        for (int a = 0; a < 3; ++a) {
          if (c[a] - r > 0) {
            covers_all = false;
            bound = std::min(bound, q[a] - (lo[a] + (c[a] - r) * h));
          }
          if (c[a] + r < dims[a] - 1) {
            covers_all = false;
            bound = std::min(bound, lo[a] + (c[a] + r + 1) * h - q[a]);
          }
        }
        if (covers_all) break;
        bound = std::max(0.0, bound - kBoundSlack * h);
        if (found == k && best_d[k - 1] <= bound * bound) break;
      }
      for (int s = 0; s < found; ++s) {
        out_d[(i - first) * k + s] = best_d[s];
        out_i[(i - first) * k + s] = best_i[s];
      }
    }
  });
  return out;
}

}  // namespace tessera::models::gaussians
