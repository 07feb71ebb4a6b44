// CUDA rasterize_gaussians_fwd / _bwd: one block per tile, one thread per pixel, the tile's
// Gaussians staged through shared memory in batches (as in INRIA 3DGS and gsplat). In float32 the
// backward adds each warp's sum into fixed point with integer atomics (kernels/fixed_point.h),
// so the gradients are the same bits from run to run; float64 adds with float atomics.
#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <type_traits>

#include "kernels/fixed_point.h"
#include "kernels/fixed_point_math.h"
#include "kernels/gaussian_raster_math.h"
#include "kernels/gaussian_rasterize.h"
#include "kernels/tensor_args.h"

namespace tessera::kernels::cuda {

namespace {

// Gaussians staged per batch: at most one per thread and at most 256, so that the staging
// buffer (6 floats and an id per Gaussian) stays at 14 KiB in float64, well under the 48 KiB of
// dynamic shared memory a launch gets without opting in.
constexpr int kMaxBatch = 256;
// Tiles are one block: tile_size^2 threads, at most the 1024 threads of a block.
constexpr int64_t kMaxTileSize = 32;

// Shared-memory layout of one batch: ids, then mx, my, a, b, c, opacity (batch values each).
template <typename scalar_t>
struct Staged {
  int64_t* ids;
  scalar_t* v;  // [6, batch]

  __device__ Staged(void* smem, int batch)
      : ids(static_cast<int64_t*>(smem)), v(reinterpret_cast<scalar_t*>(ids + batch)) {}
  __device__ void load(int slot, int batch, int64_t g, const scalar_t* __restrict__ means,
                       const scalar_t* __restrict__ conics,
                       const scalar_t* __restrict__ opacities) {
    ids[slot] = g;
    v[0 * batch + slot] = means[2 * g];
    v[1 * batch + slot] = means[2 * g + 1];
    v[2 * batch + slot] = conics[3 * g];
    v[3 * batch + slot] = conics[3 * g + 1];
    v[4 * batch + slot] = conics[3 * g + 2];
    v[5 * batch + slot] = opacities[g];
  }
  __device__ raster::PixelAlpha<scalar_t> alpha_at(int slot, int batch, scalar_t px,
                                                   scalar_t py) const {
    return raster::pixel_alpha<scalar_t>(v[slot], v[batch + slot], v[2 * batch + slot],
                                         v[3 * batch + slot], v[4 * batch + slot],
                                         v[5 * batch + slot], px, py);
  }
};

__device__ __forceinline__ void tile_range(const int64_t* __restrict__ offsets, int64_t tile,
                                           int64_t num_isects, int64_t& first, int64_t& last) {
  first = offsets[tile];
  last = offsets[tile + 1];
  CUDA_KERNEL_ASSERT_MSG(0 <= first && first <= last && last <= num_isects,
                         "rasterize_gaussians: tile_offsets must be non-decreasing in [0, M]");
}

// kChans > 0: the channel count, accumulators in registers; kChans == 0: any count, the
// accumulators in the output (each pixel is one thread's).
template <typename scalar_t, int kChans>
__global__ void __launch_bounds__(kMaxTileSize * kMaxTileSize) rasterize_fwd_kernel(
    int64_t width, int64_t height, int64_t tiles_x, int64_t num_gaussians, int64_t num_isects,
    int64_t channels, int batch,
    const scalar_t* __restrict__ means,        // [N, 2]
    const scalar_t* __restrict__ conics,       // [N, 3]
    const scalar_t* __restrict__ colors,       // [N, C]
    const scalar_t* __restrict__ opacities,    // [N]
    const scalar_t* __restrict__ background,   // [C] or null
    const int64_t* __restrict__ offsets,       // [T + 1]
    const int64_t* __restrict__ ids,           // [M]
    scalar_t* __restrict__ out_colors,         // [H, W, C]
    scalar_t* __restrict__ out_alphas,         // [H, W]
    int32_t* __restrict__ out_last,            // [H, W]
    scalar_t* __restrict__ out_transmittance) {  // [H, W]
  extern __shared__ __align__(16) unsigned char smem[];
  Staged<scalar_t> staged(smem, batch);
  const int64_t tile = blockIdx.y * tiles_x + blockIdx.x;
  const int64_t i = blockIdx.y * int64_t{blockDim.y} + threadIdx.y;
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const bool inside = i < height && j < width;
  const int64_t pix = inside ? i * width + j : 0;
  const scalar_t px = static_cast<scalar_t>(j) + scalar_t(0.5);
  const scalar_t py = static_cast<scalar_t>(i) + scalar_t(0.5);
  const int64_t channels_ = kChans > 0 ? kChans : channels;
  constexpr int kRegs = kChans > 0 ? kChans : 1;
  scalar_t acc[kRegs];
  for (int ch = 0; ch < kRegs; ++ch) acc[ch] = 0;
  if (kChans == 0 && inside)
    for (int64_t ch = 0; ch < channels_; ++ch) out_colors[pix * channels_ + ch] = 0;

  int64_t first, last;
  tile_range(offsets, tile, num_isects, first, last);
  const scalar_t stop = static_cast<scalar_t>(raster::kTransmittanceStop);
  scalar_t transmittance = 1;
  int32_t last_added = 0;
  bool done = !inside;
  for (int64_t start = first; start < last; start += batch) {
    // Stop once every pixel of the tile is done (uniform across the block).
    if (__syncthreads_count(done) == static_cast<int>(blockDim.x * blockDim.y)) break;
    const int64_t count = min(static_cast<int64_t>(batch), last - start);
    if (tid < count) {
      const int64_t g = ids[start + tid];
      CUDA_KERNEL_ASSERT_MSG(0 <= g && g < num_gaussians,
                             "rasterize_gaussians: gaussian_ids out of [0, N)");
      staged.load(tid, batch, g, means, conics, opacities);
    }
    __syncthreads();
    for (int slot = 0; slot < count && !done; ++slot) {
      const raster::PixelAlpha<scalar_t> p = staged.alpha_at(slot, batch, px, py);
      if (p.skip) continue;
      const scalar_t next = transmittance * (1 - p.alpha);
      if (next < stop) {
        done = true;
        break;
      }
      const scalar_t w = transmittance * p.alpha;
      const scalar_t* col = colors + staged.ids[slot] * channels_;
      if (kChans > 0) {
        for (int ch = 0; ch < kRegs; ++ch) acc[ch] += w * col[ch];
      } else {
        for (int64_t ch = 0; ch < channels_; ++ch) out_colors[pix * channels_ + ch] += w * col[ch];
      }
      transmittance = next;
      last_added = static_cast<int32_t>(start - first + slot + 1);
    }
    __syncthreads();
  }
  if (!inside) return;
  for (int64_t ch = 0; ch < channels_; ++ch) {
    const scalar_t bg = background ? background[ch] : scalar_t(0);
    if (kChans > 0) {
      out_colors[pix * channels_ + ch] = acc[ch < kRegs ? ch : 0] + transmittance * bg;
    } else {
      out_colors[pix * channels_ + ch] += transmittance * bg;
    }
  }
  out_alphas[pix] = 1 - transmittance;
  out_last[pix] = last_added;
  out_transmittance[pix] = transmittance;
}

// Where the backward's sums go: float atomics into the gradient tensors, or (limbs set) fixed
// point, gradient element `slot` at limbs + 4 slot.
struct FixedOut {
  unsigned long long* limbs = nullptr;
  unsigned long long* bad = nullptr;
};

template <typename scalar_t>
__device__ __forceinline__ void atomic_to(scalar_t* target, int64_t slot, scalar_t value,
                                          const FixedOut& fixed) {
  if constexpr (std::is_same<scalar_t, float>::value) {
    if (fixed.limbs) {
      fixed_point::atomic_add(value, fixed.limbs + slot * kFixedPointLimbs, fixed.bad);
      return;
    }
  }
  atomicAdd(target, value);
}

// Sums `value` over the warp when the block is made of whole warps (uniform; the shuffles' order
// is fixed), and lets lane 0 add it; otherwise every thread adds its own value.
template <typename scalar_t>
__device__ __forceinline__ void add_reduced(scalar_t* target, int64_t slot, scalar_t value,
                                            bool whole_warps, bool any_in_warp,
                                            const FixedOut& fixed) {
  if (whole_warps) {
    for (int offset = 16; offset > 0; offset /= 2)
      value += __shfl_down_sync(0xffffffffu, value, offset);
    if ((threadIdx.x + threadIdx.y * blockDim.x) % 32 == 0 && any_in_warp)
      atomic_to(target, slot, value, fixed);
  } else if (value != scalar_t(0)) {
    atomic_to(target, slot, value, fixed);
  }
}

// The reverse walk of the CPU implementation (kernels/cpu/gaussian_rasterize.cpp), batches taken
// from the back of the tile's list. kChans as in the forward kernel; with kChans == 0 the
// per-pixel buffer S lives in `scratch` [H, W, C].
template <typename scalar_t, int kChans>
__global__ void __launch_bounds__(kMaxTileSize * kMaxTileSize) rasterize_bwd_kernel(
    int64_t width, int64_t height, int64_t tiles_x, int64_t num_isects, int64_t channels,
    int batch,
    const scalar_t* __restrict__ means,          // [N, 2]
    const scalar_t* __restrict__ conics,         // [N, 3]
    const scalar_t* __restrict__ colors,         // [N, C]
    const scalar_t* __restrict__ opacities,      // [N]
    const scalar_t* __restrict__ background,     // [C] or null
    const int64_t* __restrict__ offsets,         // [T + 1]
    const int64_t* __restrict__ ids,             // [M]
    const int32_t* __restrict__ last_ids,        // [H, W]
    const scalar_t* __restrict__ transmittance,  // [H, W]
    const scalar_t* __restrict__ v_colors,       // [H, W, C] or null
    const scalar_t* __restrict__ v_alphas,       // [H, W] or null
    scalar_t* __restrict__ scratch,              // [H, W, C] when kChans == 0
    scalar_t* __restrict__ v_means,              // [N, 2]
    scalar_t* __restrict__ v_conics,             // [N, 3]
    scalar_t* __restrict__ v_colors_out,         // [N, C]
    scalar_t* __restrict__ v_opacities,          // [N]
    scalar_t* __restrict__ v_background,         // [C] or null
    int64_t num_gaussians, FixedOut fixed) {     // fixed: slots means, conics, colors, opacities, background
  extern __shared__ __align__(16) unsigned char smem[];
  Staged<scalar_t> staged(smem, batch);
  const int64_t tile = blockIdx.y * tiles_x + blockIdx.x;
  const int64_t i = blockIdx.y * int64_t{blockDim.y} + threadIdx.y;
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
  const bool whole_warps = (blockDim.x * blockDim.y) % 32 == 0;
  const bool inside = i < height && j < width;
  const int64_t pix = inside ? i * width + j : 0;
  const scalar_t px = static_cast<scalar_t>(j) + scalar_t(0.5);
  const scalar_t py = static_cast<scalar_t>(i) + scalar_t(0.5);
  const int64_t channels_ = kChans > 0 ? kChans : channels;
  constexpr int kRegs = kChans > 0 ? kChans : 1;

  int64_t first, last;
  tile_range(offsets, tile, num_isects, first, last);
  const int64_t n = last - first;
  const int32_t last_added = inside ? last_ids[pix] : 0;
  CUDA_KERNEL_ASSERT_MSG(0 <= last_added && last_added <= n,
                         "rasterize_gaussians_bwd: last_ids does not fit the tile's list");
  const scalar_t t_final = inside ? transmittance[pix] : scalar_t(1);
  const scalar_t v_a = inside && v_alphas ? v_alphas[pix] : scalar_t(0);
  scalar_t v_c[kRegs], s[kRegs];
  scalar_t bg_dot = 0;
  for (int ch = 0; ch < kRegs; ++ch) {
    v_c[ch] = 0;
    s[ch] = 0;
  }
  for (int64_t ch = 0; ch < channels_; ++ch) {
    const scalar_t vc = inside && v_colors ? v_colors[pix * channels_ + ch] : scalar_t(0);
    if (kChans > 0) v_c[ch < kRegs ? ch : 0] = vc;
    else if (inside) scratch[pix * channels_ + ch] = 0;
    if (background) {
      bg_dot += vc * background[ch];
      if (v_background)
        add_reduced(v_background + ch, (6 + channels_) * num_gaussians + ch, t_final * vc,
                    whole_warps, true, fixed);
    }
  }
  scalar_t t = t_final;
  for (int64_t done_count = 0; done_count < n; done_count += batch) {
    const int64_t count = min(static_cast<int64_t>(batch), n - done_count);
    // Slot q of this batch holds local entry n - 1 - (done_count + q): back to front.
    __syncthreads();
    if (tid < count) staged.load(tid, batch, ids[first + n - 1 - (done_count + tid)], means,
                                 conics, opacities);
    __syncthreads();
    for (int q = 0; q < count; ++q) {
      const int64_t k = n - 1 - (done_count + q);
      raster::PixelAlpha<scalar_t> p{};
      bool valid = inside && k < last_added;
      if (valid) {
        p = staged.alpha_at(q, batch, px, py);
        valid = !p.skip;
      }
      const int64_t g = staged.ids[q];
      scalar_t v_alpha = 0;
      if (valid) {
        const scalar_t one_minus = 1 - p.alpha;
        t = t / one_minus;
        const scalar_t w = t * p.alpha;
        const scalar_t* col = colors + g * channels_;
        scalar_t dot_color = 0, dot_behind = 0;
        for (int64_t ch = 0; ch < channels_; ++ch) {
          const scalar_t vc = kChans > 0 ? v_c[ch < kRegs ? ch : 0]
                                         : (v_colors ? v_colors[pix * channels_ + ch] : 0);
          scalar_t& sc = kChans > 0 ? s[ch < kRegs ? ch : 0] : scratch[pix * channels_ + ch];
          dot_color += vc * col[ch];
          dot_behind += vc * sc;
          sc = p.alpha * col[ch] + one_minus * sc;
        }
        v_alpha = t * (dot_color - dot_behind) + (v_a - bg_dot) * t_final / one_minus;
      }
      const bool any = whole_warps ? __any_sync(0xffffffffu, valid) : valid;
      if (!any) continue;
      raster::PairGrads<scalar_t> pg{0, 0, 0, 0, 0, 0};
      if (valid) {
        pg = raster::pair_grads<scalar_t>(p, staged.v[2 * batch + q], staged.v[3 * batch + q],
                                          staged.v[4 * batch + q], staged.v[5 * batch + q],
                                          v_alpha);
      }
      const int64_t N = num_gaussians;
      add_reduced(v_means + 2 * g, 2 * g, pg.v_mx, whole_warps, any, fixed);
      add_reduced(v_means + 2 * g + 1, 2 * g + 1, pg.v_my, whole_warps, any, fixed);
      add_reduced(v_conics + 3 * g, 2 * N + 3 * g, pg.v_a, whole_warps, any, fixed);
      add_reduced(v_conics + 3 * g + 1, 2 * N + 3 * g + 1, pg.v_b, whole_warps, any, fixed);
      add_reduced(v_conics + 3 * g + 2, 2 * N + 3 * g + 2, pg.v_c, whole_warps, any, fixed);
      add_reduced(v_opacities + g, (5 + channels_) * N + g, pg.v_opacity, whole_warps, any,
                  fixed);
      const scalar_t w = valid ? t * p.alpha : scalar_t(0);
      for (int64_t ch = 0; ch < channels_; ++ch) {
        const scalar_t vc = kChans > 0 ? v_c[ch < kRegs ? ch : 0]
                                       : (inside && v_colors ? v_colors[pix * channels_ + ch] : 0);
        add_reduced(v_colors_out + g * channels_ + ch, 5 * N + g * channels_ + ch, w * vc,
                    whole_warps, any, fixed);
      }
    }
  }
}

int batch_for(int64_t tile_size) {
  return static_cast<int>(std::min<int64_t>(tile_size * tile_size, kMaxBatch));
}

template <typename scalar_t>
size_t shared_bytes(int batch) {
  return static_cast<size_t>(batch) * (sizeof(int64_t) + 6 * sizeof(scalar_t));
}

// Calls f(std::integral_constant<int, K>) with K = channels for 1, 3 and 4, else K = 0.
template <typename F>
void dispatch_channels(int64_t channels, F&& f) {
  switch (channels) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    case 4: f(std::integral_constant<int, 4>{}); break;
    default: f(std::integral_constant<int, 0>{}); break;
  }
}

}  // namespace

RasterizeOutput rasterize_gaussians_fwd(const at::Tensor& means2d, const at::Tensor& conics,
                                        const at::Tensor& colors,
                                        const at::Tensor& opacities,
                                        const at::Tensor& background,
                                        const at::Tensor& tile_offsets,
                                        const at::Tensor& gaussian_ids, int64_t width,
                                        int64_t height, int64_t tile_size) {
  TORCH_CHECK(tile_size <= kMaxTileSize, "rasterize_gaussians (CUDA): tile_size must be <= ",
              kMaxTileSize, " (one thread per pixel of a tile), got ", tile_size);
  const c10::cuda::CUDAGuard guard(means2d.device());
  const at::Tensor m = means2d.contiguous(), con = conics.contiguous(),
                      col = colors.contiguous(), op = opacities.contiguous(),
                      bg = contiguous_or_undefined(background), off = tile_offsets.contiguous(),
                      ids = gaussian_ids.contiguous();
  const int64_t channels = col.size(1);
  const auto options = m.options();
  RasterizeOutput out;
  out.colors = at::empty({height, width, channels}, options);
  out.alphas = at::empty({height, width}, options);
  out.last_ids = at::empty({height, width}, options.dtype(at::kInt));
  out.transmittance = at::empty({height, width}, options);
  const int64_t tiles_x = tiles_along(width, tile_size), tiles_y = tiles_along(height, tile_size);
  if (tiles_x == 0 || tiles_y == 0) return out;
  const int batch = batch_for(tile_size);
  const dim3 blocks(static_cast<unsigned>(tiles_x), static_cast<unsigned>(tiles_y));
  const dim3 threads(static_cast<unsigned>(tile_size), static_cast<unsigned>(tile_size));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "rasterize_gaussians_fwd_cuda", [&] {
    dispatch_channels(channels, [&](auto chans) {
      rasterize_fwd_kernel<scalar_t, decltype(chans)::value>
          <<<blocks, threads, shared_bytes<scalar_t>(batch), stream>>>(
              width, height, tiles_x, m.size(0), ids.size(0), channels, batch,
              m.data_ptr<scalar_t>(), con.data_ptr<scalar_t>(), col.data_ptr<scalar_t>(),
              op.data_ptr<scalar_t>(), optional_ptr<scalar_t>(bg), off.data_ptr<int64_t>(),
              ids.data_ptr<int64_t>(), out.colors.data_ptr<scalar_t>(),
              out.alphas.data_ptr<scalar_t>(), out.last_ids.data_ptr<int32_t>(),
              out.transmittance.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

RasterizeGrads rasterize_gaussians_bwd(
    const at::Tensor& means2d, const at::Tensor& conics, const at::Tensor& colors,
    const at::Tensor& opacities, const at::Tensor& background,
    const at::Tensor& tile_offsets, const at::Tensor& gaussian_ids, int64_t width,
    int64_t height, int64_t tile_size, const at::Tensor& last_ids,
    const at::Tensor& transmittance, const at::Tensor& v_colors,
    const at::Tensor& v_alphas) {
  TORCH_CHECK(tile_size <= kMaxTileSize, "rasterize_gaussians (CUDA): tile_size must be <= ",
              kMaxTileSize, ", got ", tile_size);
  const c10::cuda::CUDAGuard guard(means2d.device());
  const at::Tensor m = means2d.contiguous(), con = conics.contiguous(),
                      col = colors.contiguous(), op = opacities.contiguous(),
                      bg = contiguous_or_undefined(background), off = tile_offsets.contiguous(),
                      ids = gaussian_ids.contiguous(), last = last_ids.contiguous(),
                      trans = transmittance.contiguous(),
                      g_colors = contiguous_or_undefined(v_colors),
                      g_alphas = contiguous_or_undefined(v_alphas);
  const int64_t n = m.size(0), channels = col.size(1);
  const auto options = m.options();
  RasterizeGrads grads;
  grads.v_means2d = at::zeros({n, 2}, options);
  grads.v_conics = at::zeros({n, 3}, options);
  grads.v_colors = at::zeros({n, channels}, options);
  grads.v_opacities = at::zeros({n}, options);
  if (bg.defined()) grads.v_background = at::zeros({channels}, options);
  const int64_t tiles_x = tiles_along(width, tile_size), tiles_y = tiles_along(height, tile_size);
  if (tiles_x == 0 || tiles_y == 0) return grads;
  const bool generic = channels != 1 && channels != 3 && channels != 4;
  const at::Tensor scratch =
      generic ? at::empty({height, width, channels}, options) : at::Tensor();
  const int batch = batch_for(tile_size);
  const dim3 blocks(static_cast<unsigned>(tiles_x), static_cast<unsigned>(tiles_y));
  const dim3 threads(static_cast<unsigned>(tile_size), static_cast<unsigned>(tile_size));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // float32: fixed point, when every gradient element takes at most 2^22 adds (the limbs'
  // headroom): at most one a warp and pixel group, so always with whole warps and otherwise up
  // to 2^22 pixels.
  const bool whole_warps = (tile_size * tile_size) % 32 == 0;
  const bool fixed = m.scalar_type() == at::kFloat &&
                     (whole_warps || width * height <= (int64_t{1} << 22));
  const int64_t slots = (6 + channels) * n + channels;
  at::Tensor limbs, bad;
  FixedOut out;
  if (fixed) {
    limbs = at::zeros({slots, kFixedPointLimbs}, options.dtype(at::kLong));
    bad = at::zeros({1}, limbs.options());
    out.limbs = reinterpret_cast<unsigned long long*>(limbs.data_ptr<int64_t>());
    out.bad = reinterpret_cast<unsigned long long*>(bad.data_ptr<int64_t>());
  }
  AT_DISPATCH_FLOATING_TYPES(m.scalar_type(), "rasterize_gaussians_bwd_cuda", [&] {
    dispatch_channels(channels, [&](auto chans) {
      rasterize_bwd_kernel<scalar_t, decltype(chans)::value>
          <<<blocks, threads, shared_bytes<scalar_t>(batch), stream>>>(
              width, height, tiles_x, ids.size(0), channels, batch, m.data_ptr<scalar_t>(),
              con.data_ptr<scalar_t>(), col.data_ptr<scalar_t>(), op.data_ptr<scalar_t>(),
              optional_ptr<scalar_t>(bg), off.data_ptr<int64_t>(), ids.data_ptr<int64_t>(),
              last.data_ptr<int32_t>(), trans.data_ptr<scalar_t>(),
              optional_ptr<scalar_t>(g_colors), optional_ptr<scalar_t>(g_alphas),
              generic ? scratch.data_ptr<scalar_t>() : nullptr,
              grads.v_means2d.data_ptr<scalar_t>(), grads.v_conics.data_ptr<scalar_t>(),
              grads.v_colors.data_ptr<scalar_t>(), grads.v_opacities.data_ptr<scalar_t>(),
              bg.defined() ? grads.v_background.data_ptr<scalar_t>() : nullptr, n, out);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  if (fixed) {
    fixed_point_normalize(limbs);
    // NaN when a value could not be held (not finite, or >= 2^47).
    const at::Tensor all = kernels::fixed_point_to_float(limbs, at::kFloat, bad);
    grads.v_means2d.copy_(all.narrow(0, 0, 2 * n).view({n, 2}));
    grads.v_conics.copy_(all.narrow(0, 2 * n, 3 * n).view({n, 3}));
    grads.v_colors.copy_(all.narrow(0, 5 * n, channels * n).view({n, channels}));
    grads.v_opacities.copy_(all.narrow(0, (5 + channels) * n, n));
    if (bg.defined()) grads.v_background.copy_(all.narrow(0, (6 + channels) * n, channels));
  }
  return grads;
}

}  // namespace tessera::kernels::cuda
