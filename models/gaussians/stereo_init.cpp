// Plane-sweep stereo for 3DGS's starting points (stereo_init.h). Per reference view: pick
// corner-like pixels (Shi-Tomasi's smaller structure-tensor eigenvalue, the best pixel of each
// cell of a grid, so that they spread over the image), sweep depth hypotheses along each pixel's
// ray, score each by the normalized cross-correlation of the pixel's patch with its projection
// into every source view (a fronto-parallel patch), keep the mean of the two best sources (one
// occluded source does not veto a surface, one lucky source does not make one), take the best
// depth, refine it, and keep the point when the score is high and the best is not at the end of
// the range.
#include "models/gaussians/stereo_init.h"

#include <torch/nn/functional.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>

#include "framework/data/lens.h"
#include "framework/even_slice.h"
#include "models/gaussians/gaussian_render.h"

namespace tessera::models::gaussians {
namespace {

namespace F = torch::nn::functional;

constexpr double kPi = 3.14159265358979323846;
constexpr double kTargetAngle = 10.0 * kPi / 180.0;   // triangulation angle sources aim for
constexpr double kMinAngle = 1.0 * kPi / 180.0;       // below it depth is not resolved
constexpr double kMaxAxisAngle = 60.0 * kPi / 180.0;  // sources look roughly the same way
constexpr int kRefineDepths = 8;                       // around the coarse best, +-1 coarse step
constexpr int kCandidatesPerPoint = 2;  // pixels matched per point kept: the best half stays
constexpr int kPatchStep = 2;           // 3x3 samples, 2 pixels apart: a 5x5 patch
constexpr int kBorder = kPatchStep + 1;
// A patch flatter than ~2 grey levels (of 255) is noise, not texture: its correlation means
// nothing.
constexpr double kMinPatchStd = 2.0 / 255.0;
// How much a pixel's best depth must out-score any depth more than two steps away.
constexpr double kMinUniqueness = 0.02;

struct StereoView {
  torch::Tensor grey;  // [1, 1, H, W] float32
  torch::Tensor rgb;   // [H, W, 3] float32
  RenderCamera cam;    // pinhole at the matched resolution
  std::array<double, 9> rotation{};  // camera -> world, row-major
  std::array<double, 3> centre{};
  torch::Tensor rotation_t, centre_t;  // the same as float32 [3, 3] and [3]
};

std::array<double, 3> column(const data::Camera& c, int k) {
  const auto& m = c.camera_to_world;
  return {m[0 * 4 + k], m[1 * 4 + k], m[2 * 4 + k]};
}

double dot(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2];
}

std::array<double, 3> sub(const std::array<double, 3>& a, const std::array<double, 3>& b) {
  return {a[0] - b[0], a[1] - b[1], a[2] - b[2]};
}

double norm(const std::array<double, 3>& a) { return std::sqrt(dot(a, a)); }

std::array<double, 3> bounds_centre(const std::array<double, 6>& b) {
  return {0.5 * (b[0] + b[3]), 0.5 * (b[1] + b[4]), 0.5 * (b[2] + b[5])};
}

double bounds_half(const std::array<double, 6>& b) {
  return 0.5 * std::max({b[3] - b[0], b[4] - b[1], b[5] - b[2]});
}

// The depth along the view's axis that sources are chosen for: the bounds' centre, or a half
// width when the centre is beside or behind the camera (a camera inside an outdoor scene).
double scene_depth(const data::Camera& c, const std::array<double, 6>& bounds) {
  return std::max(dot(sub(bounds_centre(bounds), column(c, 3)), column(c, 2)),
                  0.5 * bounds_half(bounds));
}

StereoView load_view(const data::SceneReader& scene, int64_t index, int64_t max_side) {
  const data::Camera& camera = scene.cameras().at(static_cast<size_t>(index));
  const double downscale =
      std::max(1.0, static_cast<double>(std::max(camera.width, camera.height)) / max_side);
  StereoView v;
  v.cam = make_render_camera(camera, downscale);
  // The pinhole model below needs an undistorted image, as 3DGS's targets are.
  const torch::Tensor image = data::undistort_image(
      scene.read_image_over_background(static_cast<size_t>(index)), camera);
  v.rgb = resize_image(image, v.cam.width, v.cam.height).contiguous();
  const torch::Tensor weights = torch::tensor({0.299f, 0.587f, 0.114f});
  v.grey = (v.rgb * weights).sum(2).unsqueeze(0).unsqueeze(0).contiguous();
  const auto& m = camera.camera_to_world;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) v.rotation[r * 3 + c] = m[r * 4 + c];
  v.centre = {m[3], m[7], m[11]};
  v.rotation_t = torch::tensor(std::vector<double>(v.rotation.begin(), v.rotation.end()))
                     .view({3, 3})
                     .to(torch::kFloat32);
  v.centre_t = torch::tensor({v.centre[0], v.centre[1], v.centre[2]}).to(torch::kFloat32);
  return v;
}

// Shi-Tomasi's corner response: the smaller eigenvalue of the structure tensor summed over a
// 5x5 window, zero within kBorder of the edge. [H, W].
torch::Tensor corner_response(const torch::Tensor& grey) {
  const torch::Tensor kx = torch::tensor({-0.5f, 0.0f, 0.5f}).view({1, 1, 1, 3});
  const torch::Tensor ky = kx.view({1, 1, 3, 1});
  const torch::Tensor gx = F::conv2d(grey, kx, F::Conv2dFuncOptions().padding({0, 1}));
  const torch::Tensor gy = F::conv2d(grey, ky, F::Conv2dFuncOptions().padding({1, 0}));
  auto window = [](const torch::Tensor& t) {
    return F::avg_pool2d(t, F::AvgPool2dFuncOptions(5).stride(1).padding(2));
  };
  const torch::Tensor sxx = window(gx * gx), syy = window(gy * gy), sxy = window(gx * gy);
  torch::Tensor lmin =
      (0.5 * (sxx + syy) - torch::sqrt(0.25 * (sxx - syy).square() + sxy.square())).squeeze();
  lmin = lmin.clamp_min(0);
  const int64_t h = lmin.size(0), w = lmin.size(1);
  torch::Tensor mask = torch::zeros_like(lmin);
  if (h > 2 * kBorder && w > 2 * kBorder)
    mask.slice(0, kBorder, h - kBorder).slice(1, kBorder, w - kBorder).fill_(1);
  return lmin * mask;
}

// Contracted depth: linear up to d0, then 2 - d0 / z, so that hypotheses are dense near the
// scene and sparse (even in disparity) towards the far extent.
double contract(double z, double d0) { return z <= d0 ? z / d0 : 2.0 - d0 / z; }
torch::Tensor uncontract(const torch::Tensor& s, double d0) {
  return torch::where(s <= 1.0, s * d0, d0 / (2.0 - s).clamp_min(1e-9));
}

// Camera-space ray directions (z = 1) of each patch sample of each pixel: [P, 9, 3].
torch::Tensor patch_rays(const torch::Tensor& pix, const RenderCamera& cam) {
  std::vector<float> off;
  for (int dy = -1; dy <= 1; ++dy)
    for (int dx = -1; dx <= 1; ++dx) {
      off.push_back(static_cast<float>(dx * kPatchStep));
      off.push_back(static_cast<float>(dy * kPatchStep));
    }
  const torch::Tensor o = torch::tensor(off).view({1, 9, 2});
  const torch::Tensor p = pix.unsqueeze(1) + o;  // [P, 9, 2] pixel centres
  const torch::Tensor x = (p.select(2, 0) - cam.cx) / cam.fx;
  const torch::Tensor y = (p.select(2, 1) - cam.cy) / cam.fy;
  return torch::stack({x, y, torch::ones_like(x)}, 2);
}

// Score [D, P] of depth hypotheses z [D, P] for the pixels' patches (world_rays [P, 9, 3]: the
// patch samples' rays, z = 1 in the reference camera): the mean NCC of the two best sources,
// -1 where fewer than two sources see the patch.
torch::Tensor sweep_score(const StereoView& ref, const torch::Tensor& world_rays,
                          const torch::Tensor& ref_patch,
                          const std::vector<const StereoView*>& sources, const torch::Tensor& z) {
  const int64_t d = z.size(0), p = z.size(1);
  const torch::Tensor points =
      ref.centre_t + z.view({d, p, 1, 1}) * world_rays.unsqueeze(0);  // [D, P, 9, 3]
  const torch::Tensor a = ref_patch - ref_patch.mean(1, true);  // [P, 9]
  const torch::Tensor aa = a.square().sum(1);                   // [P]
  std::vector<torch::Tensor> scores;
  for (const StereoView* s : sources) {
    const torch::Tensor view = s->cam.viewmat;  // [4, 4] world -> camera
    const torch::Tensor cam_pts =
        torch::matmul(points, view.slice(0, 0, 3).slice(1, 0, 3).t()) + view.slice(0, 0, 3).select(1, 3);
    const torch::Tensor zc = cam_pts.select(3, 2);
    const torch::Tensor safe_z = torch::where(zc > 1e-6, zc, torch::ones_like(zc));
    const torch::Tensor u = cam_pts.select(3, 0) / safe_z * s->cam.fx + s->cam.cx;
    const torch::Tensor v = cam_pts.select(3, 1) / safe_z * s->cam.fy + s->cam.cy;
    const double w = static_cast<double>(s->cam.width), h = static_cast<double>(s->cam.height);
    const torch::Tensor inside = ((zc > 1e-6) & (u >= 0.5) & (u <= w - 0.5) & (v >= 0.5) &
                                  (v <= h - 0.5)).all(2);  // [D, P]
    const torch::Tensor grid = torch::stack({2.0 * u / w - 1.0, 2.0 * v / h - 1.0}, 3)
                                   .view({1, d, p * 9, 2});
    const torch::Tensor sampled =
        F::grid_sample(s->grey, grid,
                       F::GridSampleFuncOptions().mode(torch::kBilinear).padding_mode(torch::kBorder).align_corners(false))
            .view({d, p, 9});
    const torch::Tensor b = sampled - sampled.mean(2, true);
    const torch::Tensor ncc = (a.unsqueeze(0) * b).sum(2) / torch::sqrt(aa.unsqueeze(0) * b.square().sum(2) + 1e-12);
    scores.push_back(torch::where(inside, ncc, torch::full_like(ncc, -1.0f)));
  }
  const torch::Tensor all = torch::stack(scores, 0);  // [K, D, P], K >= 2 (the caller's rule)
  const torch::Tensor best2 = std::get<0>(all.topk(2, 0));  // [2, D, P]
  // Both must see the patch: a mean with an unseen source's -1 is not a match.
  return torch::where(best2[1] > -1.0f, best2.mean(0), torch::full_like(best2[0], -1.0f));
}

}  // namespace

std::vector<int64_t> stereo_sources(const std::vector<data::Camera>& cameras,
                                    const std::vector<int64_t>& views, size_t i,
                                    const std::array<double, 6>& bounds, int sources) {
  const data::Camera& ref = cameras.at(static_cast<size_t>(views.at(i)));
  const auto axis = column(ref, 2), c0 = column(ref, 3);
  const double depth = scene_depth(ref, bounds);
  const std::array<double, 3> target{c0[0] + depth * axis[0], c0[1] + depth * axis[1],
                                     c0[2] + depth * axis[2]};
  std::vector<std::pair<double, int64_t>> ranked;  // (|log(angle / target)|, index)
  for (size_t j = 0; j < views.size(); ++j) {
    if (j == i) continue;
    const data::Camera& s = cameras.at(static_cast<size_t>(views[j]));
    const double axes = std::acos(std::clamp(dot(axis, column(s, 2)), -1.0, 1.0));
    if (axes > kMaxAxisAngle) continue;
    const auto a = sub(c0, target), b = sub(column(s, 3), target);
    const double na = norm(a), nb = norm(b);
    if (na <= 0 || nb <= 0) continue;
    const double angle = std::acos(std::clamp(dot(a, b) / (na * nb), -1.0, 1.0));
    if (angle < kMinAngle) continue;
    ranked.emplace_back(std::abs(std::log(angle / kTargetAngle)), static_cast<int64_t>(j));
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<int64_t> out;
  for (size_t k = 0; k < ranked.size() && static_cast<int>(k) < sources; ++k)
    out.push_back(ranked[k].second);
  return out;
}

StereoPoints stereo_points(const data::SceneReader& scene, const std::vector<int64_t>& views,
                           const StereoOptions& options, int64_t part, int64_t parts,
                           const std::function<void(int64_t, int64_t)>& progress) {
  if (options.points < 0 || options.max_side < 16 || options.sources < 1 || options.depths < 4)
    throw std::invalid_argument(
        "stereo_points: need points >= 0, max_side >= 16, sources >= 1, depths >= 4");
  StereoPoints out;
  std::vector<torch::Tensor> xyz_parts, rgb_parts;
  const auto [first, last] = even_slice(static_cast<int64_t>(views.size()), part, parts);
  if (options.points == 0 || views.empty()) {
    out.xyz = torch::zeros({0, 3});
    out.rgb = torch::zeros({0, 3});
    return out;
  }
  const int64_t quota =
      (options.points + static_cast<int64_t>(views.size()) - 1) / static_cast<int64_t>(views.size());
  const auto& meta = scene.meta();
  const auto& bounds = meta.scene_bounds;
  const auto& extent = meta.unbounded() ? meta.scene_extent : meta.scene_bounds;
  std::map<int64_t, StereoView> cache;  // views loaded at the matched resolution
  auto view_at = [&](int64_t index) -> const StereoView& {
    auto it = cache.find(index);
    if (it == cache.end()) it = cache.emplace(index, load_view(scene, index, options.max_side)).first;
    return it->second;
  };
  for (int64_t i = first; i < last; ++i) {
    if (progress) progress(i - first, last - first);
    const std::vector<int64_t> src =
        stereo_sources(scene.cameras(), views, static_cast<size_t>(i), bounds, options.sources);
    // Only this view and its sources stay loaded: memory stays at 1 + sources images, and
    // neighbours in the list (a video's frames) share most of their sources.
    for (auto it = cache.begin(); it != cache.end();) {
      const bool needed = it->first == views[i] ||
                          std::any_of(src.begin(), src.end(), [&](int64_t j) { return views[j] == it->first; });
      it = needed ? std::next(it) : cache.erase(it);
    }
    if (src.size() < 2) continue;
    const StereoView& ref = view_at(views[i]);  // std::map: references stay valid on insert
    std::vector<const StereoView*> sources;
    for (int64_t j : src) sources.push_back(&view_at(views[j]));
    ++out.views;

    // Candidates: the best corner of each cell of a grid with kCandidatesPerPoint x quota cells.
    const torch::Tensor response = corner_response(ref.grey);
    const int64_t h = response.size(0), w = response.size(1);
    const int64_t cell = std::max<int64_t>(
        2, static_cast<int64_t>(std::sqrt(static_cast<double>(h * w) / (kCandidatesPerPoint * quota))));
    auto [best, where] = F::max_pool2d_with_indices(
        response.view({1, 1, h, w}), F::MaxPool2dFuncOptions(cell).stride(cell));
    best = best.flatten();
    where = where.flatten();
    const torch::Tensor keep = best > 0;
    where = where.masked_select(keep);
    if (where.numel() == 0) continue;
    const torch::Tensor row = torch::div(where, w, "floor"), col = where - row * w;
    const torch::Tensor pix = torch::stack({col, row}, 1).to(torch::kFloat32) + 0.5f;  // [P, 2]
    // The reference patches at integer pixels (the border keeps them inside).
    std::vector<torch::Tensor> samples;
    const torch::Tensor flat = ref.grey.flatten();
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx)
        samples.push_back(flat.index_select(0, (row + dy * kPatchStep) * w + col + dx * kPatchStep));
    const torch::Tensor ref_patch = torch::stack(samples, 1);  // [P, 9]
    const torch::Tensor rays = torch::matmul(patch_rays(pix, ref.cam), ref.rotation_t.t());
    const int64_t p = pix.size(0);
    out.candidates += p;

    // Hypotheses: even in contracted depth between the near plane and the farthest corner of
    // the extent along this view's axis.
    const auto axis = std::array<double, 3>{ref.rotation[2], ref.rotation[5], ref.rotation[8]};
    double z_far = 0;
    for (int corner = 0; corner < 8; ++corner) {
      const std::array<double, 3> q{extent[(corner & 1) ? 3 : 0], extent[(corner & 2) ? 4 : 1],
                                    extent[(corner & 4) ? 5 : 2]};
      z_far = std::max(z_far, dot(sub(q, ref.centre), axis));
    }
    const double d0 = std::max(norm(sub(bounds_centre(bounds), ref.centre)), bounds_half(bounds));
    const double z_near = std::max(meta.near, 1e-3 * d0);
    if (!(z_far > z_near)) continue;
    const double s_near = contract(z_near, d0), s_far = contract(z_far, d0);
    const double step = (s_far - s_near) / options.depths;
    const torch::Tensor s = (s_near + (torch::arange(options.depths, torch::kFloat64) + 0.5) * step)
                                .view({options.depths, 1}).expand({options.depths, p});
    const torch::Tensor coarse =
        sweep_score(ref, rays, ref_patch, sources, uncontract(s, d0).to(torch::kFloat32));
    const torch::Tensor arg = coarse.argmax(0);  // [P]
    // A usable best lies inside the range (at its end the surface may lie beyond it) and beats
    // every hypothesis more than two steps away by kMinUniqueness (else a repeated texture or a
    // textureless stretch makes the depth ambiguous).
    const torch::Tensor steps_away =
        (torch::arange(options.depths).view({-1, 1}) - arg.view({1, -1})).abs();
    const torch::Tensor runner_up =
        torch::where(steps_away > 2, coarse, torch::full_like(coarse, -2.0f)).amax(0);
    const torch::Tensor usable = (arg > 0) & (arg < options.depths - 1) &
                                 (coarse.amax(0) - runner_up >= kMinUniqueness);
    const torch::Tensor s_best = s.gather(0, arg.view({1, p})).squeeze(0);  // [P]
    const torch::Tensor fine_s =
        s_best.unsqueeze(0) +
        (torch::linspace(-1.0, 1.0, kRefineDepths + 1, torch::kFloat64) * step).view({-1, 1});
    const torch::Tensor fine_z = uncontract(fine_s, d0).to(torch::kFloat32);
    const torch::Tensor fine = sweep_score(ref, rays, ref_patch, sources, fine_z);
    auto [score, fine_arg] = fine.max(0);
    const torch::Tensor z = fine_z.gather(0, fine_arg.view({1, p})).squeeze(0);  // [P]

    // The pixel's own ray (the patch's centre sample) at the chosen depth.
    const torch::Tensor world = ref.centre_t + z.unsqueeze(1) * rays.select(1, 4);
    const torch::Tensor lo = torch::tensor({extent[0], extent[1], extent[2]}).to(torch::kFloat32);
    const torch::Tensor hi = torch::tensor({extent[3], extent[4], extent[5]}).to(torch::kFloat32);
    const torch::Tensor in_extent = ((world >= lo) & (world <= hi)).all(1);
    const torch::Tensor textured = ref_patch.std(1) >= kMinPatchStd;
    const torch::Tensor good = (score >= options.min_ncc) & usable & in_extent & textured;
    torch::Tensor chosen = good.nonzero().flatten();
    if (chosen.numel() > quota) {  // the best-scoring quota, then back in cell order
      const torch::Tensor order = std::get<1>(score.index_select(0, chosen).sort(/*stable=*/true, 0, /*descending=*/true));
      chosen = std::get<0>(chosen.index_select(0, order.slice(0, 0, quota)).sort());
    }
    xyz_parts.push_back(world.index_select(0, chosen));
    const torch::Tensor flat_rgb = ref.rgb.view({-1, 3});
    rgb_parts.push_back(flat_rgb.index_select(0, where.index_select(0, chosen)));
  }
  out.xyz = xyz_parts.empty() ? torch::zeros({0, 3}) : torch::cat(xyz_parts, 0);
  out.rgb = rgb_parts.empty() ? torch::zeros({0, 3}) : torch::cat(rgb_parts, 0).clamp(0, 1);
  return out;
}

}  // namespace tessera::models::gaussians
