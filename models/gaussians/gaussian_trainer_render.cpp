// The sharded forward of GaussianTrainer: owners project, tiles are split across ranks, projected
// rows go by all-to-all-v to the tile owners, which rasterize; full images by allreduce.
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "models/gaussians/gaussian_sharding_exchange.h"
#include "kernels/gaussian_projection.h"
#include "kernels/gaussian_rasterize.h"
#include "framework/data/lens.h"
#include "framework/metrics.h"
#include "kernels/spherical_harmonics.h"
#include "models/gaussians/gaussian_render.h"
#include "models/gaussians/gaussian_trainer.h"

namespace tessera::models::gaussians {
namespace {

// Columns of an exchanged projected row: means2d(2), conics(3), colors(3), opacity(1), depth(1).
constexpr int64_t kRowWidth = 10;

// Differentiable allreduce-sum of per-rank partial images. Forward: the sum over ranks. Backward:
// the allreduce-sum of the gradient, so that when every rank's loss is L / size the gradient that
// reaches each rank's partial image is dL/d(full image), the single-process gradient; charged to
// the "exchange" phase of the timer. `pass_through` (the bitwise path, where every rank's loss is
// the whole L): the gradient is that already, as it is on every rank, and goes back unchanged
// (size copies of g / size summed in float would not give g's bits).
class AllreduceSumFunction : public torch::autograd::Function<AllreduceSumFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& partial,  // [H, W, 3]
                               int64_t comm_address, int64_t timer_address, bool pass_through) {
    ctx->saved_data["comm"] = comm_address;
    ctx->saved_data["timer"] = timer_address;
    ctx->saved_data["pass_through"] = pass_through;
    torch::Tensor full = partial.detach().clone();
    reinterpret_cast<distributed::Communicator*>(comm_address)
        ->allreduce(full, distributed::ReduceOp::Sum);
    return full;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* comm = reinterpret_cast<distributed::Communicator*>(ctx->saved_data["comm"].toInt());
    torch::Tensor g = grads[0].defined() ? grads[0].contiguous().clone() : torch::Tensor();
    if (!g.defined()) throw std::logic_error("AllreduceSumFunction: undefined gradient");
    if (!ctx->saved_data["pass_through"].toBool()) comm->allreduce(g, distributed::ReduceOp::Sum);
    reinterpret_cast<PhaseTimer*>(ctx->saved_data["timer"].toInt())->lap("exchange");
    return {g, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The rasterizer's inputs from projected rows [m, 10]: means2d [m, 2], conics [m, 3], colors
// [m, 3], opacities [m], contiguous. Backward writes their gradients into one [m, 10] tensor
// (depth's column zero) instead of one zero-filled [m, 10] per slice and their sum.
class RasterInputsFunction : public torch::autograd::Function<RasterInputsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& rows) {
    ctx->saved_data["rows"] = rows.size(0);
    return {rows.slice(1, 0, 2).contiguous(), rows.slice(1, 2, 5).contiguous(),
            rows.slice(1, 5, 8).contiguous(), rows.select(1, 8).contiguous()};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t m = ctx->saved_data["rows"].toInt();
    const std::vector<int64_t> widths = {2, 3, 3, 1};
    torch::TensorOptions options;
    for (const torch::Tensor& g : grads)
      if (g.defined()) options = g.options();
    std::vector<torch::Tensor> columns;
    for (size_t i = 0; i < grads.size(); ++i)
      columns.push_back(grads[i].defined() ? grads[i].reshape({m, widths[i]})
                                           : torch::zeros({m, widths[i]}, options));
    columns.push_back(torch::zeros({m, 1}, options));  // depth: binning reads it detached
    return {torch::cat(columns, 1)};
  }
};

// The views' rows one after the other: a batch of one view is its one tensor, not a copy.
torch::Tensor cat_views(const std::vector<torch::Tensor>& per_view) {
  return per_view.size() == 1 ? per_view[0] : torch::cat(per_view);
}

// bin_gaussians with equal depths ordered by `ids` [m] (unique global ids, CPU int64) instead of
// by row: the rows are binned in id order and the lists mapped back to rows. The received rows
// then need no reordering (no [m, 10] copy in the forward, nor of its gradient in the
// backward), and the lists, hence the image and the gradients, are those of any world size.
kernels::TileBins bin_in_id_order(const torch::Tensor& means2d, const torch::Tensor& radii,
                                  const torch::Tensor& depths, const torch::Tensor& ids,
                                  int64_t width, int64_t height, int64_t tile_size,
                                  const torch::Tensor& tile_mask) {
  const bool ascending =
      ids.size(0) < 2 || (ids.slice(0, 1) > ids.slice(0, 0, -1)).all().item<bool>();
  if (ascending)  // already in id order: nothing to reorder
    return kernels::bin_gaussians(means2d, radii, depths, width, height, tile_size, tile_mask);
  const torch::Tensor by_id = ids.argsort().to(means2d.device());
  kernels::TileBins bins = kernels::bin_gaussians(
      means2d.index_select(0, by_id), radii.index_select(0, by_id),
      depths.index_select(0, by_id), width, height, tile_size, tile_mask);
  bins.gaussian_ids = by_id.index_select(0, bins.gaussian_ids);
  return bins;
}

// Bins for the bitwise path's entries (make_entry_plan): rows that each belong to one tile,
// `tiles` [m] (the view's tile of each, CPU int64), ordered within a tile by depth, ties by global
// id, as bin_in_id_order orders the rows it bins; the rows are not reordered.
kernels::TileBins bin_entries(const torch::Tensor& tiles, const torch::Tensor& depths,
                              const torch::Tensor& ids, int64_t num_tiles) {
  torch::Tensor order = std::get<1>(ids.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  order = order.index_select(
      0, std::get<1>(depths.index_select(0, order).sort(/*stable=*/true, /*dim=*/0, /*descending=*/false)));
  order = order.index_select(0, std::get<1>(tiles.index_select(0, order).sort(/*stable=*/true, /*dim=*/0, /*descending=*/false)));
  kernels::TileBins bins;
  bins.tile_offsets = torch::zeros({num_tiles + 1}, torch::kInt64);
  bins.tile_offsets.slice(0, 1).copy_(torch::bincount(tiles, {}, num_tiles).cumsum(0));
  bins.gaussian_ids = order;
  return bins;
}

// Per-tile intersection counts of one view's rects [P, 4] (x0, x1, y0, y1): a 2D difference
// array, then prefix sums. -> [tiles_y * tiles_x] float64.
torch::Tensor tile_counts(const torch::Tensor& rects, int64_t tiles_x, int64_t tiles_y) {
  const int64_t stride = tiles_x + 1;
  torch::Tensor diff = torch::zeros({(tiles_y + 1) * stride}, torch::kFloat64);
  const torch::Tensor r = rects.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* rp = r.data_ptr<int64_t>();
  double* d = diff.data_ptr<double>();
  for (int64_t p = 0; p < r.size(0); ++p, rp += 4) {  // x0, x1, y0, y1 in [0, tiles]
    d[rp[2] * stride + rp[0]] += 1.0;
    d[rp[2] * stride + rp[1]] -= 1.0;
    d[rp[3] * stride + rp[0]] -= 1.0;
    d[rp[3] * stride + rp[1]] += 1.0;
  }
  return diff.view({tiles_y + 1, stride})
      .cumsum(0)
      .cumsum(1)
      .slice(0, 0, tiles_y)
      .slice(1, 0, tiles_x)
      .reshape({-1});
}

// [H, W] bool: the pixels of the tiles where tile_mask [T] is true.
torch::Tensor pixel_mask(const torch::Tensor& tile_mask, int64_t width, int64_t height,
                         int64_t tile_size) {
  const int64_t tiles_x = kernels::tiles_along(width, tile_size);
  const torch::Tensor ty = torch::arange(height, torch::kInt64).div(tile_size, "floor");
  const torch::Tensor tx = torch::arange(width, torch::kInt64).div(tile_size, "floor");
  const torch::Tensor tile = ty.unsqueeze(1) * tiles_x + tx.unsqueeze(0);  // [H, W]
  return tile_mask.index({tile});
}

}  // namespace

std::vector<torch::Tensor> GaussianTrainer::forward(const std::vector<data::Camera>& views,
                                                    int sh_degree, double scale, bool grad,
                                                    Batch* batch, bool depth_alpha) {
  namespace dist = distributed;
  const torch::Device device = params_.means.device();
  const int64_t ts = options_.tile_size;
  const int64_t b_count = static_cast<int64_t>(views.size());
  const torch::Tensor scales = params_.scales();
  const torch::Tensor opacities = params_.opacities();

  // On one rank the exchange is the identity: every row stays, in its order, and the rows whose
  // rect is empty (culled), which the plan would have left out, bin into no tile. The bitwise
  // path's training renders send one row per (tile, row) instead (make_entry_plan), on any number
  // of ranks.
  const bool single_rank = comm_.size() == 1;
  const bool entries = options_.deterministic && grad;
  std::vector<RenderCamera> cams;
  std::vector<int64_t> first_tile(b_count + 1, 0), tiles_x(b_count);
  std::vector<torch::Tensor> rows, side, rects, costs;
  for (int64_t b = 0; b < b_count; ++b) {
    cams.push_back(make_render_camera(views[b], scale, device));
    const RenderCamera& cam = cams.back();
    const kernels::ProjectionOutput proj = kernels::project_gaussians(
        params_.means, params_.quats, scales, cam.viewmat, cam.fx, cam.fy, cam.cx, cam.cy,
        cam.width, cam.height);
    if (grad && proj.means2d.requires_grad()) proj.means2d.retain_grad();
    phases_.lap("project");
    const torch::Tensor centre = torch::tensor({cam.centre[0], cam.centre[1], cam.centre[2]},
                                               params_.means.options().requires_grad(false));
    const torch::Tensor colors =
        depth_alpha ? torch::stack({proj.depths, torch::ones_like(proj.depths),
                                    torch::zeros_like(proj.depths)},
                                   1)
                    : kernels::spherical_harmonics(sh_degree, params_.means - centre,
                                                   params_.sh_dc, params_.sh_rest);
    rows.push_back(torch::cat({proj.means2d, proj.conics, colors, opacities.unsqueeze(1),
                               proj.depths.unsqueeze(1)},
                              1));  // [n, 10]
    phases_.lap("sh");
    side.push_back(torch::stack({proj.radii.to(torch::kInt64), ids_,
                                 torch::full_like(ids_, b)},
                                1));  // [n, 3] (radius, global id, view)
    tiles_x[b] = kernels::tiles_along(cam.width, ts);
    const int64_t tiles_y = kernels::tiles_along(cam.height, ts);
    first_tile[b + 1] = first_tile[b] + tiles_x[b] * tiles_y;
    if (single_rank) {  // one rank owns every tile: no split to weigh, no destinations
      costs.push_back(torch::ones({tiles_x[b] * tiles_y}, torch::kFloat64));
      if (entries)
        rects.push_back(tile_rects(proj.means2d.detach(), proj.radii, cam.width, cam.height, ts));
    } else {
      rects.push_back(
          tile_rects(proj.means2d.detach(), proj.radii, cam.width, cam.height, ts));
      costs.push_back(options_.tile_cost == TileCostKind::Intersections
                          ? tile_counts(rects.back(), tiles_x[b], tiles_y)
                          : torch::ones({tiles_x[b] * tiles_y}, torch::kFloat64));
    }
    if (batch != nullptr) {
      batch->radii.push_back(proj.radii);
      batch->means2d.push_back(proj.means2d);
      batch->widths.push_back(cam.width);
      batch->heights.push_back(cam.height);
    }
    phases_.lap("exchange");  // the tile rects and costs of the split
  }
  // Tile cost over the batch (views concatenated), identical on every rank.
  torch::Tensor tile_cost = torch::cat(costs);
  if (options_.tile_cost == TileCostKind::Intersections && !single_rank)
    comm_.allreduce(tile_cost, dist::ReduceOp::Sum);
  const TilePartition partition = partition_tiles(tile_cost, comm_.size());
  // Backward marks: the reverse all-to-all is charged to exchange once SH and projection
  // backward can start, and rasterize_bwd ends where every consumer of `received` is done.
  torch::Tensor received, received_side;  // [R, 10] and, on the CPU, [R, 3]
  torch::Tensor received_tiles;           // the bitwise path: [R] each row's batch tile (CPU)
  if (entries) {
    const EntryPlan plan = make_entry_plan(comm_, rects, tiles_x, first_tile, partition);
    received = phase_mark(
        exchange_projected(comm_, plan.plan, phase_mark(cat_views(rows), &phases_, "exchange")),
        &phases_, "rasterize_bwd");
    received_side = exchange_with_plan(comm_, plan.plan, cat_views(side)).cpu();
    received_tiles = comm_.all_to_all_v(plan.tiles.to(comm_.device()), plan.plan.send_counts).cpu();
  } else if (single_rank) {
    received = phase_mark(phase_mark(cat_views(rows), &phases_, "exchange"), &phases_,
                          "rasterize_bwd");
    received_side = cat_views(side).cpu();
  } else {
    std::vector<torch::Tensor> dest;
    for (int64_t b = 0; b < b_count; ++b)
      dest.push_back(destination_ranks(rects[b], tiles_x[b], first_tile[b], partition));
    const ExchangePlan plan = make_exchange_plan(comm_, torch::cat(dest));
    received = phase_mark(
        exchange_projected(comm_, plan, phase_mark(cat_views(rows), &phases_, "exchange")),
        &phases_, "rasterize_bwd");
    received_side = exchange_with_plan(comm_, plan, cat_views(side)).cpu();
  }
  phases_.lap("exchange");

  const torch::Tensor my_tiles = partition.mask(comm_.rank());  // [T] bool
  const torch::Tensor background = depth_alpha ? torch::zeros_like(background_) : background_;
  std::vector<torch::Tensor> partials;
  for (int64_t b = 0; b < b_count; ++b) {
    const RenderCamera& cam = cams[b];
    const torch::Tensor tile_mask = my_tiles.slice(0, first_tile[b], first_tile[b + 1]);
    const torch::Tensor pixels =
        pixel_mask(tile_mask, cam.width, cam.height, ts).to(device).unsqueeze(2);  // [H, W, 1]
    // This view's received rows (a batch of one view takes all of them, no copy), in the order
    // they arrived; binning orders equal depths by global id, whatever the world size.
    const torch::Tensor of_view =
        b_count == 1 && !entries ? torch::Tensor()
                                 : torch::nonzero(received_side.select(1, 2) == b).flatten();
    const torch::Tensor ids = of_view.defined()
                                  ? received_side.select(1, 1).index_select(0, of_view)
                                  : received_side.select(1, 1);
    const torch::Tensor r =
        of_view.defined() ? received.index_select(0, of_view.to(device)) : received;  // [m, 10]
    torch::Tensor partial;
    if (r.size(0) > 0 && tile_mask.any().item<bool>()) {
      const torch::Tensor means2d = r.slice(1, 0, 2), depths = r.select(1, 9);
      kernels::TileBins bins;
      if (entries) {
        bins = bin_entries(received_tiles.index_select(0, of_view) - first_tile[b],
                           depths.detach().cpu(), ids, first_tile[b + 1] - first_tile[b]);
        bins.tile_offsets = bins.tile_offsets.to(device);
        bins.gaussian_ids = bins.gaussian_ids.to(device);
      } else {
        const torch::Tensor radii =
            (of_view.defined() ? received_side.select(1, 0).index_select(0, of_view)
                               : received_side.select(1, 0))
                .to(device, torch::kInt32);
        bins = bin_in_id_order(means2d.detach(), radii, depths.detach(), ids, cam.width,
                               cam.height, ts, tile_mask.to(device));
      }
      phases_.lap("bin");
      const torch::autograd::variable_list in = RasterInputsFunction::apply(r);
      const kernels::RasterizeOutput raster = kernels::rasterize_gaussians(
          in[0], in[1], in[2], in[3], background, bins.tile_offsets, bins.gaussian_ids,
          cam.width, cam.height, ts);
      partial = raster.colors * pixels;
      phases_.lap("rasterize");
    } else {
      partial = background.view({1, 1, 3}).expand({cam.height, cam.width, 3}) * pixels;
    }
    partials.push_back(partial.reshape({-1}));
  }
  // One allreduce for the batch: every pixel belongs to exactly one rank's block.
  torch::Tensor flat = torch::cat(partials);
  if (grad) {
    // With several ranks the received rows enter every rank's loss (a zero term), so that the
    // backward collectives (this allreduce and the reverse all-to-all-v) run on every rank.
    // The mark after it ends the loss's backward.
    flat = phase_mark(
        AllreduceSumFunction::apply(single_rank && !entries ? flat : flat + 0 * received.sum(),
                                    static_cast<int64_t>(reinterpret_cast<intptr_t>(&comm_)),
                                    static_cast<int64_t>(reinterpret_cast<intptr_t>(&phases_)),
                                    /*pass_through=*/entries),
        &phases_, "loss");
  } else {
    flat = flat.detach().contiguous().clone();
    comm_.allreduce(flat, dist::ReduceOp::Sum);
  }
  phases_.lap("exchange");
  std::vector<torch::Tensor> images;
  int64_t offset = 0;
  for (const RenderCamera& cam : cams) {
    const int64_t size = cam.height * cam.width * 3;
    images.push_back(flat.slice(0, offset, offset + size).view({cam.height, cam.width, 3}));
    offset += size;
  }
  return images;
}

torch::Tensor GaussianTrainer::render(int64_t camera_index, int sh_degree) {
  return render_camera(scene_.cameras().at(static_cast<size_t>(camera_index)), sh_degree);
}

torch::Tensor GaussianTrainer::render_camera(const data::Camera& camera, int sh_degree) {
  torch::NoGradGuard no_grad;
  const auto threads = bitwise_threads();
  if (sh_degree < 0) sh_degree = sh_degree_at(steps_done_ > 0 ? steps_done_ - 1 : 0);
  return forward({camera}, sh_degree, options_.resolution_scale, false, nullptr)[0];
}

torch::Tensor GaussianTrainer::render_depth_alpha(const data::Camera& camera) {
  torch::NoGradGuard no_grad;
  const auto threads = bitwise_threads();
  return forward({camera}, 0, options_.resolution_scale, false, nullptr, /*depth_alpha=*/true)[0];
}

GaussianTrainer::EvalScores GaussianTrainer::evaluate(
    const std::vector<size_t>& views,
    const ImageSink& on_image, int sh_degree) {
  release_gradients();
  const auto threads = bitwise_threads();  // the same scores at any thread count
  EvalScores scores;
  for (size_t v : views) {
    const torch::Tensor image =
        render(static_cast<int64_t>(v), sh_degree).to(torch::kCPU).clamp(0, 1);
    // Pinhole render against a pinhole target: a distorted capture is undistorted first.
    torch::Tensor target =
        data::undistort_image(scene_.read_image_over_background(v), scene_.cameras().at(v));
    if (target.sizes() != image.sizes()) target = resize_image(target, image.size(1), image.size(0));
    scores.psnr += psnr(image, target);
    scores.ssim += ssim(image, target);
    ++scores.views;
    if (on_image) on_image(v, image, target);
  }
  if (scores.views > 0) {
    scores.psnr /= static_cast<double>(scores.views);
    scores.ssim /= static_cast<double>(scores.views);
  }
  return scores;
}

}  // namespace tessera::models::gaussians
