// The `gaussians` family: GaussianTrainer's step halves, eval, renders and snapshot state as the
// hooks of the framework's TrainingRun; the PLY at the end of a run; `tessera info` and `export`.
#include "models/gaussians/gaussian_family.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "distributed/errors.h"
#include "framework/adam_state.h"
#include "framework/learning_check.h"
#include "framework/run.h"
#include "framework/snapshot.h"
#include "models/gaussians/gaussian_config.h"
#include "models/gaussians/ply.h"

namespace tessera::models::gaussians {

GaussianFamily::GaussianFamily(const FamilyContext& c)
    : GaussianFamily(c.comm, c.scene(), gaussian_trainer_options(c.config)) {}

GaussianFamily::GaussianFamily(distributed::Communicator& comm, const data::SceneReader& scene,
                               const GaussianTrainerOptions& options)
    : comm_(comm), trainer_(comm, scene, options) {}

std::string GaussianFamily::model_name() const { return GaussianTrainer::kSnapshotModel; }

EpochSize GaussianFamily::epoch_size() const {
  return {static_cast<double>(trainer_.train_view_count()),
          static_cast<double>(trainer_.options().views_per_step)};
}

void GaussianFamily::on_start(int64_t first_step) {
  const int64_t count = trainer_.global_count();
  if (first_step == 0) {
    spdlog::info("gaussians: {} initial Gaussians ({} on this rank)", count,
                 trainer_.local_count());
    if (comm_.rank() == 0)
      std::fprintf(stderr, "gaussians: %lld initial Gaussians on %d rank(s)\n",
                   static_cast<long long>(count), comm_.size());
  } else {
    spdlog::info("gaussians: {} Gaussians at step {} ({} on this rank)", count, first_step,
                 trainer_.local_count());
    if (comm_.rank() == 0)
      std::fprintf(stderr, "gaussians: %lld Gaussians on %d rank(s) at step %lld\n",
                   static_cast<long long>(count), comm_.size(),
                   static_cast<long long>(first_step));
  }
  // This rank's memory by kind, as point-diffusion logs it: the state kept for each step (its
  // rows, their gradients, Adam's moments) and the estimate of what one view of a pass holds
  // until its backward (GaussianTrainer::estimate_view_bytes). ranks.json has the measured peak.
  const int64_t local = trainer_.local_count();
  const int64_t pixels = trainer_.largest_view_pixels();
  const int64_t view = GaussianTrainer::estimate_view_bytes(local, pixels);
  std::string lines;
  int64_t total = view;
  for (const auto& [kind, bytes] : memory_parts()) {
    lines += fmt::format("\n  {:<18}{:>10}  ({} B per Gaussian)", kind, format_bytes(bytes),
                         local > 0 ? bytes / local : 0);
    total += bytes;
  }
  spdlog::info("memory of rank {} ({} Gaussians here, views up to {} pixels):{}\n"
               "  {:<18}{:>10}  (estimate: {} B per Gaussian + {} B per pixel)\n  {:<18}{:>10}",
               comm_.rank(), local, pixels, lines, "one view's pass", format_bytes(view),
               GaussianTrainer::kViewBytesPerGaussian, GaussianTrainer::kViewBytesPerPixel,
               "total", format_bytes(total));
}

StepRecord GaussianFamily::forward_backward(const StepControl& control) {
  all_to_all_at_step_start_ = comm_.traffic().all_to_all_bytes;
  pending_ = trainer_.forward_backward(control.step, control.loss_scale, control.precision);
  StepRecord record;
  record.loss = pending_.loss;
  record.work = static_cast<double>(pending_.views.size());
  record.phases = pending_.phases;
  return record;
}

std::vector<torch::Tensor> GaussianFamily::gradients() { return trainer_.gradients(); }

void GaussianFamily::apply_step(const StepControl& control, bool skipped, StepRecord& record) {
  trainer_.apply_step(control.step, skipped, pending_);
  const GaussianStepResult& r = pending_;
  record.phases = r.phases;
  const double rate = trainer_.sampling_rate_at(control.step);
  record.fields = {{"gaussians", r.global_count},     {"sh_degree", r.sh_degree},
                   {"sampling_rate", rate},            {"resolution_scale", r.resolution_scale},
                   {"views_per_pass", r.views_per_pass},
                   // rank 0's: the projected rows it sent to other ranks and their gradients
                   // back, and any rebalance's rows
                   {"all_to_all_bytes", comm_.traffic().all_to_all_bytes - all_to_all_at_step_start_}};
  if (r.densified)
    record.fields["densified"] = {{"cloned", r.cloned}, {"split", r.split}, {"pruned", r.pruned}};
  char progress[128];
  std::snprintf(progress, sizeof(progress), "%lld Gaussians SH %d rate %.2f scale %g",
                static_cast<long long>(r.global_count), r.sh_degree, rate, r.resolution_scale);
  record.progress = progress;
}

EvalScores GaussianFamily::evaluate(int64_t step, const std::vector<size_t>& views,
                                    const ImageSink& on_image) {
  const GaussianTrainer::EvalScores s = trainer_.evaluate(views, on_image, sh_degree(step));
  return image_scores(s.views, s.psnr, s.ssim);
}

torch::Tensor GaussianFamily::render_camera(const data::Camera& camera, int64_t step) {
  return trainer_.render_camera(camera, sh_degree(step)).to(torch::kCPU).clamp(0, 1);
}

ViewOutputs GaussianFamily::render_outputs(const data::Camera& camera, int64_t step) {
  ViewOutputs out;
  out.rgb = render_camera(camera, step);
  // Blended with the colours (depth, 1, 0) over a black background: sum w z and sum w.
  const torch::Tensor blended = trainer_.render_depth_alpha(camera).to(torch::kCPU);
  out.alpha = blended.select(2, 1).clamp(0, 1).contiguous();
  const torch::Tensor alpha = blended.select(2, 1);
  out.depth = torch::where(alpha > 0, blended.select(2, 0) / alpha.clamp_min(1e-12),
                           torch::zeros_like(alpha))
                  .contiguous();
  return out;
}

int GaussianFamily::sh_degree(int64_t step) const {
  return trainer_.sh_degree_at(std::max<int64_t>(step - 1, 0));  // that of the step's last step
}

void GaussianFamily::save_state(SnapshotWriter& writer) { trainer_.save_state(writer); }
void GaussianFamily::load_state(const SnapshotReader& reader) { trainer_.load_state(reader); }

std::string GaussianFamily::write_outputs(const std::string& out_dir) {
  ply_ = (std::filesystem::path(out_dir) / "gaussians.ply").string();
  trainer_.export_ply(ply_);
  return ply_;
}

std::string GaussianFamily::not_learning_causes() const {
  return capture_not_learning_causes(
      "(4) initialization: without SfM points the random Gaussians must cover what the cameras "
      "see (gaussians.random_count, the dataset's scene_extent); "
      "(5) learning rates: gaussians.lr_* too high or too low for the scene's scale.");
}

std::string GaussianFamily::overfitting_causes() const {
  return "(4) Gaussians fitted to single views: densification that splits and clones on the "
         "gradients of few views (gaussians.densify_*), or a random initialization without the "
         "capture's SfM points; (5) view-dependent color (gaussians.sh_degree) explaining what "
         "positions should.";
}

std::string GaussianFamily::describe() {
  return std::to_string(trainer_.global_count()) + " Gaussians";
}

nlohmann::json GaussianFamily::summary_fields() {
  return {{"gaussians", trainer_.global_count()}, {"ply", ply_}};
}

std::string GaussianFamily::render_layout() {
  const int64_t total = trainer_.global_count();
  torch::Tensor most =
      torch::tensor({trainer_.local_count()}, torch::kInt64).to(comm_.device());
  comm_.allreduce(most, distributed::ReduceOp::Max);
  return std::to_string(total) + " Gaussians sharded over " + std::to_string(comm_.size()) +
         " rank(s) (at most " + std::to_string(most.cpu().item<int64_t>()) + " on one), " +
         "each view's tiles split across them";
}

MemoryParts GaussianFamily::memory_parts() { return adam_memory_parts(trainer_.optimizer()); }

namespace {

std::vector<InfoLine> describe_snapshot(const SnapshotReader& reader) {
  if (!reader.has("params/means")) return {};
  // One row per Gaussian in every per-Gaussian dataset (docs/formats.md).
  std::string sh;
  if (reader.has("state/sh_degree"))
    sh = ", SH degree " + std::to_string(reader.read("state/sh_degree").item<int64_t>()) +
         " at the next step";
  return {{"gaussians:", std::to_string(reader.shape("params/means").at(0)) + sh +
                             " (`tessera export` writes them as .ply)"}};
}

std::string export_snapshot(const ExportRequest& o) {
  int64_t step = 0;
  // Reads and verifies everything before the PLY is written (atomically), so a bad snapshot
  // leaves no file behind.
  GaussianParams params = read_snapshot_params(o.snapshot, &step);
  if (!o.world) {  // back to the capture's coordinates, as the run's own gaussians.ply
    std::string scene = o.scene;
    if (scene.empty()) {
      const SnapshotReader reader(o.snapshot);
      scene = parse_stored_config(reader.meta().config_toml, o.snapshot + " (stored config)").data.path;
    }
    if (scene.empty() || !std::filesystem::exists(scene))
      throw UserError(o.snapshot + ": its dataset '" + scene + "' is not there, and the PLY is "
                      "written in the capture's coordinates that the dataset records: give it "
                      "with --scene FILE.h5, or pass --world for the training coordinates");
    const data::SceneReader reader(scene);
    params = world_to_capture(params, reader.meta().capture_scale, reader.meta().capture_offset);
  }
  write_ply(o.out, params);
  return "wrote " + std::to_string(params.size()) + " Gaussians (step " + std::to_string(step) +
         ") to " + o.out;
}

}  // namespace

GaussianTrainerOptions gaussian_trainer_options(const Config& config) {
  // [gaussians] as it is; the rest from the framework's sections this family reads.
  GaussianTrainerOptions o;
  static_cast<GaussianConfig&>(o) = config.section<GaussianConfig>();
  o.steps = config.train.steps;
  o.seed = static_cast<uint64_t>(config.run.seed);
  o.densify.seed = static_cast<uint64_t>(config.run.seed);
  o.init.seed = static_cast<uint64_t>(config.run.seed);
  // Dynamic sampling: the [sampling] schedule is the fraction of train views per epoch.
  o.sampling = sampling_options(config);
  o.deterministic = config.run.deterministic;
  if (config.checkpoint.policy == "budget") {
    if (!(config.checkpoint.budget_mib > 0))
      throw UserError("checkpoint.budget_mib must be > 0 with policy = \"budget\" (the per-rank "
                      "activation memory that sets how many views a pass renders)");
    o.memory_budget_bytes = static_cast<int64_t>(config.checkpoint.budget_mib * 1024.0 * 1024.0);
  }
  return o;
}

void register_gaussian_family(FamilyRegistry& registry) {
  FamilyInfo info;
  info.name = GaussianTrainer::kSnapshotModel;
  info.create = [](const FamilyContext& c) { return std::make_unique<GaussianFamily>(c); };
  info.check_config = [](const Config& config) {
    gaussian_trainer_options(config);
    SamplingSchedule{sampling_options(config)};
  };
  info.describe_snapshot = describe_snapshot;
  info.import_overrides = [](const std::string& path) -> std::vector<std::string> {
    const std::string ext = std::filesystem::path(path).extension().string();
    if (ext != ".ply" && ext != ".PLY") return {};
    // sh_degree_interval = 1: renders use the full SH degree a PLY carries (for train.steps >= 3).
    const std::string section = GaussianConfig::kSection;
    return {"model.name=" + std::string(GaussianTrainer::kSnapshotModel),
            section + ".init_ply=" + path, section + ".sh_degree_interval=1"};
  };
  info.export_snapshot = export_snapshot;
  info.config_sections = {gaussian_config_section()};
  info.shared_keys = gaussian_shared_keys();
  // "budget": the views per pass that fit checkpoint.budget_mib (gaussians.views_per_pass).
  info.key_choices = {{"checkpoint.policy", {"none", "budget"}}};
  registry.add(std::move(info));
}

}  // namespace tessera::models::gaussians
