// GaussianTrainer (see gaussian_trainer.h): construction and initialization, rebalancing with
// Adam state, the schedules (views, resolution, SH degree, learning rates) and canonical
// accessors. The step is in gaussian_trainer_step.cpp.
#include "models/gaussians/gaussian_trainer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>

#include "distributed/errors.h"
#include "framework/autocast.h"
#include "framework/fused_adam.h"
#include "framework/data/lens.h"
#include "models/gaussians/gaussian_render.h"
#include "models/gaussians/ply.h"

namespace tessera::models::gaussians {
namespace {

constexpr uint64_t kPurposeViewOrder = 0x766965776f7264ull;  // "vieword"
constexpr size_t kFields = 6;

SamplingScheduleOptions view_sampling(const GaussianTrainerOptions& options) {
  SamplingScheduleOptions s = options.sampling;
  if (s.total_steps <= 1) s.total_steps = std::max<int64_t>(1, options.steps);
  return s;
}

// Adam's per-parameter state, or nullptr before the first step.
torch::optim::AdamParamState* adam_state(torch::optim::Adam& optimizer, const torch::Tensor& p) {
  auto it = optimizer.state().find(p.unsafeGetTensorImpl());
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<torch::optim::AdamParamState*>(it->second.get());
}

}  // namespace

GaussianTrainer::GaussianTrainer(distributed::Communicator& comm, const data::SceneReader& scene,
                                 const GaussianTrainerOptions& options)
    : comm_(comm), scene_(scene), options_(options), planned_(options),
      sampling_(view_sampling(options)) {
  if (options_.views_per_step < 1)
    throw std::invalid_argument("GaussianTrainer: views_per_step must be >= 1");
  if (options_.views_per_pass < 0)
    throw std::invalid_argument("GaussianTrainer: views_per_pass must be >= 0");
  if (!(options_.resolution_scale >= 1.0) || options_.num_downscales < 0 ||
      options_.num_downscales > 8 || options_.resolution_schedule < 1)
    throw std::invalid_argument("GaussianTrainer: need resolution_scale >= 1, num_downscales in "
                                "[0, 8] and resolution_schedule >= 1");
  if (options_.max_sh_degree < 0 || options_.max_sh_degree > kMaxShDegree)
    throw std::invalid_argument("GaussianTrainer: max_sh_degree must be in [0, 3]");
  for (size_t i : scene.indices(data::Split::Train)) train_views_.push_back(static_cast<int64_t>(i));
  if (train_views_.empty()) throw std::invalid_argument("GaussianTrainer: no train views");
  std::vector<data::Camera> train_cameras;
  for (int64_t v : train_views_) train_cameras.push_back(scene.cameras()[v]);
  extent_ = scene_extent(train_cameras);  // INRIA: the train cameras' extent
  const torch::Device device = comm.device();
  phases_ = PhaseTimer(device);
  const auto& bg = scene.meta().background;
  background_ = torch::tensor({static_cast<float>(bg[0]), static_cast<float>(bg[1]),
                               static_cast<float>(bg[2])},
                              torch::TensorOptions(torch::kFloat32).device(device));

  // Each rank builds only its even slice [r N / size, (r + 1) N / size) of the initial set
  // (deterministic, global id = row; the neighbour search for the scales still sees all
  // points), and the forced rebalance below moves the rows to Morton ownership.
  const int64_t r = comm.rank(), size = comm.size();
  int64_t n = 0;
  InitOptions init = options_.init;
  init.part = r;
  init.parts = size;
  const bool stereo = options_.init_ply.empty() && options_.stereo_init && !scene.has_points() &&
                      !init.ignore_points && init.random_count > 0;
  const GaussianParams mine =
      !options_.init_ply.empty()
          ? capture_to_world(read_ply(options_.init_ply, device, r, size, &n),
                             scene.meta().capture_scale, scene.meta().capture_offset)
      : stereo ? init_from_stereo(scene, init, device, &n)
               : init_from_scene(scene, init, device, &n);
  if (n == 0)
    throw UserError((options_.init_ply.empty() ? std::string("the scene") : options_.init_ply) +
                    ": no Gaussians to start from");
  if (options_.init_ply.empty() && !scene.has_points() && scene.meta().unbounded() && r == 0 &&
      (!stereo || stereo_placed_ * 4 < init.random_count))
    spdlog::warn(
        "{}: no SfM points, and {} of the {} starting Gaussians are on surfaces the train views "
        "agree on (stereo); the rest are random, spread out to the scene's extent. An object in "
        "the middle of the views trains from them; a room or an outdoor scene usually ends as a "
        "blur, since nothing tells the Gaussians where its surfaces are. "
        "To start from points: run COLMAP on the images and import its folder (`tessera convert "
        "FOLDER` reads sparse/0/points3D), list a point cloud as `ply_file_path` in "
        "transforms.json, or set gaussians.init_ply (docs/gaussians.md, \"Initialization\").",
        scene.path(), stereo_placed_, n);
  const auto [lo, hi] = even_slice(n, r, size);
  std::vector<torch::Tensor> rows;
  for (const torch::Tensor* f : mine.fields()) rows.push_back(f->detach());
  ids_ = torch::arange(lo, hi, torch::TensorOptions(torch::kInt64).device(device));
  next_id_ = n;
  install_rows(rows, false);
  optimizer_ = make_optimizer(params_, options_.rates, extent_);
  stats_.reset(params_.size(), device);
  rebalance(true);
}

GaussianTrainer::~GaussianTrainer() = default;

// Stereo points of this rank's share of the train views, gathered in rank (= view) order so that
// every rank holds the same set at any world size, then random ones up to init.random_count.
GaussianParams GaussianTrainer::init_from_stereo(const data::SceneReader& scene,
                                                 const InitOptions& init, torch::Device device,
                                                 int64_t* total) {
  const auto started = std::chrono::steady_clock::now();
  StereoOptions so = options_.stereo;
  so.points = init.random_count * 3 / 4;  // a quarter stays random: sky, textureless walls
  if (comm_.rank() == 0)
    spdlog::info("initialization: no SfM points; matching {} train views by plane-sweep stereo "
                 "for up to {} starting points ...", train_views_.size(), so.points);
  auto last_report = started;
  const auto progress = [&](int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (comm_.rank() != 0 || now - last_report < std::chrono::seconds(10)) return;
    last_report = now;
    spdlog::info("initialization: stereo matched {} of rank 0's {} views ({:.0f} s)", done, total,
                 std::chrono::duration<double>(now - started).count());
  };
  const StereoPoints mine =
      stereo_points(scene, train_views_, so, comm_.rank(), comm_.size(), progress);
  const torch::Device comm_device = comm_.device();
  const torch::Tensor packed = torch::cat({mine.xyz, mine.rgb}, 1).to(comm_device);
  const torch::Tensor all = comm_.allgatherv(packed).to(torch::kCPU);
  torch::Tensor counts = torch::tensor({mine.candidates, mine.views}, torch::kInt64).to(comm_device);
  comm_.allreduce(counts, distributed::ReduceOp::Sum);
  counts = counts.to(torch::kCPU);
  stereo_placed_ = all.size(0);
  const InitOptions resolved = with_scene_extent(scene, init);
  const RandomPoints random =
      random_points(scene.meta().scene_bounds, resolved,
                    std::max<int64_t>(0, init.random_count - stereo_placed_));
  const torch::Tensor xyz = torch::cat({all.slice(1, 0, 3), random.means}, 0).contiguous();
  const torch::Tensor rgb =
      (torch::cat({all.slice(1, 3, 6), random.colours}, 0) * 255.0).round().to(torch::kUInt8);
  if (comm_.rank() == 0)
    spdlog::info("initialization: {} points from stereo ({} pixels matched in {} views with two "
                 "sources or more) and {} random, in {:.1f} s",
                 stereo_placed_, counts[0].item<int64_t>(), counts[1].item<int64_t>(),
                 random.means.size(0),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  return init_from_points(xyz, rgb, scene.meta().scene_bounds, resolved, device, total);
}

// Replaces the local rows by `rows`: the six fields, then (when with_state) the exp_avg and
// exp_avg_sq of each field, then the three densify statistics.
void GaussianTrainer::install_rows(const std::vector<torch::Tensor>& rows, bool with_state) {
  const auto fields = params_.fields();
  for (size_t i = 0; i < kFields; ++i) {
    // The rows' storage becomes the parameter's (a new leaf): callers hand over tensors nothing
    // else writes to (new from a migration, a file or an initialization).
    torch::Tensor fresh = rows[i].detach().contiguous().set_requires_grad(true);
    if (optimizer_ != nullptr) {
      // make_optimizer: one group per field, in kGroupNames order.
      auto& params = optimizer_->param_groups().at(i).params();
      if (params.size() != 1) throw std::logic_error("GaussianTrainer: one parameter per group");
      if (fields[i]->defined()) optimizer_->state().erase(fields[i]->unsafeGetTensorImpl());
      if (params[0].defined()) optimizer_->state().erase(params[0].unsafeGetTensorImpl());
      if (with_state) {
        auto state = std::make_unique<torch::optim::AdamParamState>();
        state->step(adam_steps_);
        state->exp_avg(rows[kFields + 2 * i].contiguous());
        state->exp_avg_sq(rows[kFields + 2 * i + 1].contiguous());
        optimizer_->state()[fresh.unsafeGetTensorImpl()] = std::move(state);
      }
      params[0] = fresh;
    }
    *fields[i] = fresh;
  }
  if (with_state) {
    stats_.grad_norm_sum = rows[3 * kFields].contiguous();
    stats_.count = rows[3 * kFields + 1].contiguous();
    stats_.max_radii = rows[3 * kFields + 2].contiguous();
  }
}

void GaussianTrainer::release_gradients() {
  for (torch::Tensor* f : params_.fields())
    if (f->defined() && f->grad().defined()) f->mutable_grad() = torch::Tensor();
}

void GaussianTrainer::release_rows() {
  const auto fields = params_.fields();
  for (size_t i = 0; i < kFields; ++i) {
    if (optimizer_ != nullptr) {
      if (fields[i]->defined()) optimizer_->state().erase(fields[i]->unsafeGetTensorImpl());
      optimizer_->param_groups().at(i).params().at(0) = torch::Tensor();
    }
    *fields[i] = torch::Tensor();  // its gradient, if any, goes with it
  }
  stats_ = DensifyStats{};
}

RebalanceReport GaussianTrainer::rebalance(bool force) {
  torch::NoGradGuard no_grad;
  ShardRows rows;
  rows.means = params_.means.detach();
  rows.global_ids = ids_;
  const auto fields = params_.fields();
  for (const torch::Tensor* f : fields) rows.tensors.push_back(f->detach());
  const bool with_state = adam_steps_ > 0;
  if (with_state) {
    for (const torch::Tensor* f : fields) {
      const torch::optim::AdamParamState* s = adam_state(*optimizer_, *f);
      const bool has = s != nullptr && s->exp_avg().defined();
      rows.tensors.push_back(has ? s->exp_avg() : torch::zeros_like(f->detach()));
      rows.tensors.push_back(has ? s->exp_avg_sq() : torch::zeros_like(f->detach()));
    }
    rows.tensors.push_back(stats_.grad_norm_sum);
    rows.tensors.push_back(stats_.count);
    rows.tensors.push_back(stats_.max_radii);
  }
  const SceneBounds bounds = global_bounds(comm_, rows.means);
  RebalanceOptions ro;
  ro.imbalance_threshold = options_.rebalance_threshold;
  ro.force = force;
  // Once rows move, `rows` holds the only references to them: each tensor's old rows are freed
  // as its new rows arrive, so a rebalance needs about one copy of the state, not two. The
  // gradients go too (the step that made them is over).
  // (A move that throws after this leaves the trainer without rows: a failed collective aborts
  // the job anyway, and a layout mismatch is a programming error.)
  ro.before_moving = [this] { release_rows(); };
  const RebalanceReport report = gaussians::rebalance(comm_, rows, bounds, ro);  // the free function
  if (report.migrated) {
    ids_ = rows.global_ids;
    install_rows(rows.tensors, with_state);
    if (!with_state) stats_.reset(params_.size(), params_.means.device());
  }
  return report;
}

GaussianTrainer::ViewEpoch GaussianTrainer::epoch_of(int64_t t) const {
  if (t < 0) throw std::invalid_argument("GaussianTrainer: negative step");
  const int64_t n = static_cast<int64_t>(train_views_.size());
  while (epochs_.empty() || epochs_.back().first_step + epochs_.back().steps <= t) {
    ViewEpoch e;
    if (!epochs_.empty()) {
      e.index = epochs_.back().index + 1;
      e.first_step = epochs_.back().first_step + epochs_.back().steps;
    }
    e.rate = sampling_.at(e.first_step);
    e.pool = std::min<int64_t>(n, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(e.rate * n))));
    e.steps = std::max<int64_t>(1, e.pool / options_.views_per_step);
    epochs_.push_back(e);
  }
  const auto it = std::upper_bound(epochs_.begin(), epochs_.end(), t,
                                   [](int64_t step, const ViewEpoch& e) { return step < e.first_step; });
  return *(it - 1);
}

std::vector<int64_t> GaussianTrainer::batch_views(int64_t t) const {
  const ViewEpoch e = epoch_of(t);
  const int64_t n = static_cast<int64_t>(train_views_.size());
  std::vector<std::pair<uint64_t, int64_t>> keyed;
  for (int64_t i = 0; i < n; ++i)
    keyed.emplace_back(hash_values({options_.seed, kPurposeViewOrder,
                                    static_cast<uint64_t>(e.index), static_cast<uint64_t>(i)}),
                       i);
  std::sort(keyed.begin(), keyed.end());
  // Batch b of the epoch takes pool positions [b B, (b + 1) B), wrapping when the pool < B.
  std::vector<int64_t> out;
  for (int64_t j = 0; j < options_.views_per_step; ++j) {
    const int64_t k = ((t - e.first_step) * options_.views_per_step + j) % e.pool;
    out.push_back(train_views_[keyed[k].second]);
  }
  return out;
}

double GaussianTrainer::sampling_rate_at(int64_t t) const { return epoch_of(t).rate; }

double GaussianTrainer::resolution_scale_at(int64_t t) const {
  const int64_t halvings = std::max<int64_t>(
      0, options_.num_downscales - std::max<int64_t>(0, t) / options_.resolution_schedule);
  return options_.resolution_scale * static_cast<double>(int64_t{1} << halvings);
}

void GaussianTrainer::set_total_steps(int64_t steps) {
  const GaussianTrainerOptions& p = planned_;
  const double ratio = static_cast<double>(steps) / static_cast<double>(std::max<int64_t>(1, p.steps));
  // A step count of the plan at the new length; 0 (off) stays 0, a positive one stays >= 1.
  const auto scaled = [ratio](int64_t v) -> int64_t {
    return v <= 0 ? v : std::max<int64_t>(1, std::llround(static_cast<double>(v) * ratio));
  };
  options_.steps = steps;
  options_.densify.densify_from = scaled(p.densify.densify_from);
  options_.densify.densify_until = scaled(p.densify.densify_until);
  options_.resolution_schedule = scaled(p.resolution_schedule);
  options_.sh_degree_interval = static_cast<int>(scaled(p.sh_degree_interval));
  options_.rates.means_decay_steps = scaled(p.rates.means_decay_steps);
  options_.sampling.total_steps = scaled(view_sampling(p).total_steps);
  sampling_ = SamplingSchedule(options_.sampling);
}

double GaussianTrainer::step_cost(int64_t t) const {
  const double downscale = resolution_scale_at(t) / options_.resolution_scale;
  return static_cast<double>(options_.views_per_step) / (downscale * downscale);
}

int64_t GaussianTrainer::largest_view_pixels() const {
  int64_t pixels = 0;
  for (int64_t v : train_views_) {
    const RenderCamera cam = make_render_camera(scene_.cameras()[v], options_.resolution_scale);
    pixels = std::max(pixels, cam.width * cam.height);
  }
  return pixels;
}

int64_t GaussianTrainer::estimate_view_bytes(int64_t local_gaussians, int64_t pixels) {
  return kViewBytesPerGaussian * local_gaussians + kViewBytesPerPixel * pixels;
}

int GaussianTrainer::sh_degree_at(int64_t t) const {
  if (options_.sh_degree_interval <= 0) return options_.max_sh_degree;
  return static_cast<int>(std::min<int64_t>(options_.max_sh_degree,
                                            (t + 1) / options_.sh_degree_interval));
}

int64_t GaussianTrainer::global_count() {
  torch::Tensor n = torch::tensor({params_.size()}, torch::kInt64).to(comm_.device());
  comm_.allreduce(n, distributed::ReduceOp::Sum);
  return n.cpu().item<int64_t>();
}

GaussianParams GaussianTrainer::canonical_params(int root) {
  GaussianParams out;
  const auto src = params_.fields();
  const auto dst = out.fields();
  for (size_t i = 0; i < kFields; ++i)
    *dst[i] = gather_canonical(comm_, ids_, src[i]->detach(), root);
  return out;
}

std::array<torch::Tensor, 6> GaussianTrainer::canonical_grads(int root) {
  std::array<torch::Tensor, 6> out;
  const auto src = params_.fields();
  for (size_t i = 0; i < kFields; ++i) {
    const torch::Tensor g = src[i]->grad().defined() ? src[i]->grad().detach()
                                                     : torch::zeros_like(src[i]->detach());
    out[i] = gather_canonical(comm_, ids_, g, root);
  }
  return out;
}

torch::Tensor GaussianTrainer::canonical_ids(int root) {
  return gather_canonical(comm_, ids_, ids_, root);
}

void GaussianTrainer::export_ply(const std::string& path, int64_t rows_per_chunk) {
  if (rows_per_chunk < 1) throw std::invalid_argument("export_ply: rows_per_chunk must be >= 1");
  torch::NoGradGuard no_grad;
  release_gradients();
  const int64_t total = global_count();
  const auto& meta = scene_.meta();  // PLY files are in the capture's coordinates (ply.h)
  const bool root = comm_.rank() == 0;
  // This rank's rows in id order: a range of ids is a run of them.
  const torch::Tensor order = ids_.argsort();
  const torch::Tensor sorted = ids_.index_select(0, order).cpu().contiguous();
  const auto below = [&](int64_t id) {  // local rows with an id below `id`
    return torch::searchsorted(sorted, torch::tensor({id}, torch::kInt64)).item<int64_t>();
  };
  const auto count = [&](int64_t lo, int64_t hi) {  // rows with ids in [lo, hi), all ranks
    torch::Tensor n = torch::tensor({below(hi) - below(lo)}, torch::kInt64).to(comm_.device());
    comm_.allreduce(n, distributed::ReduceOp::Sum);
    return n.cpu().item<int64_t>();
  };
  std::unique_ptr<PlyWriter> writer;
  std::string error;
  // Rank 0 alone writes: whatever it meets (a file it cannot write, memory) is agreed on, so
  // that every rank throws together instead of the others waiting in the next collective.
  try {
    if (root) writer = std::make_unique<PlyWriter>(path, total);
  } catch (const std::exception& e) {
    error = e.what();
  }
  error = agreed_error(comm_, error);
  if (!error.empty()) throw UserError(error);
  // Chunks of at most rows_per_chunk rows in id order, their id bounds found by bisection (one
  // small allreduce per probe): rank 0 holds one chunk at a time, never the whole set.
  const int64_t end_id = next_id_;  // every id is below it, on every rank
  for (int64_t lo = 0, done = 0; done < total;) {
    if (lo >= end_id) throw std::logic_error("export_ply: a global id at or above next_global_id");
    int64_t hi = end_id;
    int64_t rows_in_chunk = count(lo, end_id);
    if (rows_in_chunk > rows_per_chunk) {
      int64_t fits = lo + 1, over = end_id;  // [lo, lo + 1) holds at most one row
      rows_in_chunk = count(lo, fits);
      while (over - fits > 1) {
        const int64_t mid = fits + (over - fits) / 2;
        const int64_t rows = count(lo, mid);
        if (rows <= rows_per_chunk) {
          fits = mid;
          rows_in_chunk = rows;
        } else {
          over = mid;
        }
      }
      hi = fits;
    }
    const torch::Tensor rows = order.slice(0, below(lo), below(hi));
    const torch::Tensor chunk_ids = ids_.index_select(0, rows);
    GaussianParams chunk;
    const auto src = params_.fields();
    const auto dst = chunk.fields();
    for (size_t i = 0; i < kFields; ++i)
      *dst[i] = gather_canonical(comm_, chunk_ids, src[i]->detach().index_select(0, rows), 0);
    if (root && error.empty()) {
      try {
        writer->append(world_to_capture(chunk, meta.capture_scale, meta.capture_offset));
      } catch (const std::exception& e) {
        error = e.what();  // go on with the collectives; every rank throws below
        writer.reset();
      }
    }
    done += rows_in_chunk;
    lo = hi;
  }
  if (root && error.empty()) {
    try {
      writer->finish();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = agreed_error(comm_, error);
  if (!error.empty()) throw UserError(error);
}

MemoryStats GaussianTrainer::memory() const { return memory_stats(comm_.device()); }

}  // namespace tessera::models::gaussians
