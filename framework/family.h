// The model-family interface that the framework's TrainingRun drives, and the registry that
// builds a family by its config name (docs/architecture.md, "Adding a model family").
#pragma once

#include <nlohmann/json.hpp>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "distributed/process_context.h"
#include "framework/budget.h"
#include "framework/config.h"
#include "framework/config_schema.h"
#include "framework/data/scene.h"
#include "framework/memory.h"
#include "framework/phase_timer.h"

namespace tessera {

class SnapshotReader;
class SnapshotWriter;

// What the TrainingRun asks of one step, identical on every rank.
struct StepControl {
  int64_t step = 0;               // 0-based index of the optimizer step
  uint64_t seed = 0;              // run.seed: randomness is a function of (seed, step, purpose)
  double loss_scale = 1.0;        // multiply the loss by this before backward (fp16 scaling)
  std::string precision = "fp32"; // autocast for the forward: fp32 | bf16 | fp16
};

// What one step did. `loss`, `skipped` and `fields` are identical on every rank.
struct StepRecord {
  int64_t step = 0;
  double loss = 0.0;         // the global training loss of the batch (reported, not scaled)
  double loss_scale = 1.0;   // the scale the step ran with
  bool skipped = false;      // a non-finite gradient somewhere: no rank updated
  double seconds = 0.0;      // wall time of the step on this rank
  double work = 0.0;         // units of work of the step (ModelFamily::work_unit), global
  nlohmann::json fields;     // the family's own metrics.jsonl fields (lr, samples per ray, ...)
  std::string progress;      // the family's part of the progress line ("" = none)
  // This rank's seconds per phase of the step (framework/phase_timer.h): the family's, set by
  // forward_backward and completed by apply_step, then the run's own ("skip_check").
  PhaseTimes phases;
};

// Scores of an evaluation: means over the items scored (a scene's views, a shape set's shapes),
// as named metrics in print order. They go to the progress line ("eval psnr 29.33 ssim 0.9644
// (2 views)"), metrics.jsonl (`eval_<name>`, `eval_<unit>`) and `tessera eval`'s JSON.
struct EvalScores {
  int64_t items = 0;           // items scored
  std::string unit = "views";  // what `items` counts
  std::vector<std::pair<std::string, double>> metrics;

  // The metric `name`, NaN when there is none.
  double value(const std::string& name) const;
  // "psnr 29.33 ssim 0.9644 (2 views)"; "none" when nothing was scored.
  std::string text() const;
  // {"psnr": 29.33, "ssim": 0.96, "views": 2}, each key prefixed with `prefix`.
  nlohmann::json to_json(const std::string& prefix = "") const;
};

// The scores of an image family: PSNR and SSIM, means over `views` views.
EvalScores image_scores(int64_t views, double psnr, double ssim);

// Receives each eval render: the dataset view index, the image [H, W, 3] float32 in [0, 1] and
// the target it was scored against (the same size and range).
using ImageSink =
    std::function<void(size_t view, const torch::Tensor& image, const torch::Tensor& target)>;

// What `tessera sample` asks of a generative family.
struct SampleRequest {
  int64_t count = 0;      // samples over all ranks, split across them
  int64_t steps = 0;      // denoising steps; 0 = the family's default
  std::string sampler;    // "" = the family's default
  uint64_t seed = 0;      // sample i's randomness is a function of (seed, i) only, whatever the ranks
  std::string out_dir;    // rank 0 writes the files here (the folder exists)
};

// A view with its geometry (`tessera render --outputs rgb,depth,alpha`), on the CPU, float32.
struct ViewOutputs {
  torch::Tensor rgb;    // [H, W, 3] in [0, 1], as render_camera
  // [H, W] expected depth, as nerfstudio's and gsplat's: sum_i w_i z_i / sum_i w_i over the
  // samples (NeRF) or Gaussians (3DGS) of a pixel with blending weights w_i, where z is the
  // distance along the camera's optical axis (a z-buffer's depth, not the distance along the
  // ray), in the dataset's world units; 0 where alpha is 0.
  torch::Tensor depth;
  torch::Tensor alpha;  // [H, W] accumulated opacity sum_i w_i, in [0, 1]
};

// A family that renders camera views (radiance fields, splats): `tessera render`, orbits.
class ViewRenderer {
 public:
  virtual ~ViewRenderer() = default;
  // Renders any camera (a dataset view, an orbit) at the step `step`: [H, W, 3] float32 in
  // [0, 1] on the CPU, on every rank. Collective.
  virtual torch::Tensor render_camera(const data::Camera& camera, int64_t step) = 0;
  // The same view with its depth and alpha, on every rank. Collective.
  virtual ViewOutputs render_outputs(const data::Camera& camera, int64_t step) = 0;
  // How the ranks share a render, for `tessera render` and `eval` to say so: e.g. "23683
  // Gaussians sharded over 4 ranks (at most 5921 on one)". Collective.
  virtual std::string render_layout() = 0;
};

// A generative family: `tessera sample`.
class SampleWriter {
 public:
  virtual ~SampleWriter() = default;
  // Draws request.count samples split across ranks and writes them into request.out_dir on
  // rank 0; returns the summary line. Collective.
  virtual std::string write_samples(const SampleRequest& request) = 0;
};

// One model family's training state and its hooks. The TrainingRun (framework/run.h) owns the loop:
// cadence, logging, snapshots, signals and the non-finite policy; a family fills these hooks.
// Every hook but the const ones is collective: all ranks call it in the same order.
class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  // The registered model name; SnapshotMeta::model of the family's snapshots.
  virtual std::string model_name() const = 0;
  // What StepRecord::work counts, for the throughput ("rays", "views"): metrics key <unit>_per_s.
  virtual std::string work_unit() const = 0;
  // Called once before the first step of TrainingRun::run (after a snapshot was loaded, if any), with
  // the first step to train: logs the family's starting state.
  virtual void on_start(int64_t first_step) {}
  // Forward and backward of step control.step: leaves in the parameters the gradients of the
  // step's loss times control.loss_scale (replicated parameters: already synchronized across
  // ranks). Fills loss, work, fields and progress of the record.
  virtual StepRecord forward_backward(const StepControl& control) = 0;
  // This rank's gradients after forward_backward (undefined entries allowed). The TrainingRun counts
  // their non-finite values, agrees on a skip across ranks and unscales them in place.
  virtual std::vector<torch::Tensor> gradients() = 0;
  // Applies the step's update unless `skipped`, then the family's work after a step (occupancy
  // grid, densification); may add to `record`.
  virtual void apply_step(const StepControl& control, bool skipped, StepRecord& record) = 0;
  // Renders and scores the dataset views `views` (rendered at the step `step`); `on_image`
  // (when set) receives each render on every rank.
  virtual EvalScores evaluate(int64_t step, const std::vector<size_t>& views,
                              const ImageSink& on_image) = 0;
  // The family's training state in a snapshot (parameters, optimizer, model state); the TrainingRun
  // writes the meta and its own state around it. load_state throws UserError, on every rank,
  // for a snapshot that does not fit this family's settings.
  virtual void save_state(SnapshotWriter& writer) = 0;
  virtual void load_state(const SnapshotReader& reader) = 0;
  // After the last step of a finished run: files of the family in `out_dir` (e.g. a PLY);
  // returns a line for the summary ("" = nothing written).
  virtual std::string write_outputs(const std::string& out_dir) { return ""; }
  // Optional capabilities (above): this family as a ViewRenderer (`tessera render`) or a
  // SampleWriter (`tessera sample`); nullptr when it has no such capability.
  virtual ViewRenderer* view_renderer() { return nullptr; }
  virtual SampleWriter* sample_writer() { return nullptr; }
  // Budgets (framework/budget.h, docs/training_loop.md "Budgets"). One pass over the training
  // data and one step's share of it, in work_unit() units ({0, 0}: no epochs, train.epochs is
  // refused).
  virtual EpochSize epoch_size() const { return {}; }
  // The run now trains `steps` steps (train.epochs, or a time budget's plan): the family
  // rescales whatever it scheduled over train.steps (learning-rate decay, densification, coarse
  // to fine) from train.steps to `steps`. Same value on every rank; may come at any step.
  virtual void set_total_steps(int64_t steps) {}
  // The relative time of step `step` (1 = a full step) under the current schedule, for the
  // budget's forecast: e.g. a step that renders at half resolution costs about 1/4.
  virtual double step_cost(int64_t step) const { return 1.0; }
  // The time of evaluate(views) in step_cost units: the final eval's forecast until one is
  // measured, taken again at every plan (so it may follow the family's current costs).
  virtual double eval_cost(const std::vector<size_t>& views) const { return 0.0; }
  // Renders a sample of what evaluate(views) at `step` would on this rank and returns the
  // fraction of this rank's eval work it was (0 = the family does not probe: eval_cost stays the
  // forecast). The run times the call on its clock, so the forecast is the model's speed now,
  // on this machine: the probe's time / that fraction. Not collective.
  virtual double eval_probe(const std::vector<size_t>& views, int64_t step) { return 0.0; }
  // The family's likely causes of a loss that does not improve, numbered from (4) on (the
  // TrainingRun's warning lists poses, bounds and background first; learning_check.h).
  virtual std::string not_learning_causes() const { return ""; }
  // The family's likely causes of eval PSNR far below the train views' (the model fits the
  // training views without the scene's geometry), numbered from (4) on (learning_check.h,
  // overfitting_causes lists the capture's first).
  virtual std::string overfitting_causes() const { return ""; }
  // Appended to the "stopped by a signal" message (e.g. how to get the family's outputs from the
  // snapshot); "" = nothing.
  virtual std::string stopped_hint() const { return ""; }
  // A line for the summary describing the trained state ("48,129 points"); "" = none.
  virtual std::string describe() { return ""; }
  // This rank's bytes of the state kept between steps, by kind ("parameters", "gradients",
  // "optimizer (Adam)", ...: adam_memory_parts); the run's ranks.json and report show the rest of
  // the rank's peak as activations and workspace. Not collective.
  virtual MemoryParts memory_parts() { return {}; }
  // The family's fields of the summary record in metrics.jsonl (collective).
  virtual nlohmann::json summary_fields() { return nlohmann::json::object(); }
};

// What a family factory gets: the resolved config, the ranks and the dataset.
struct FamilyContext {
  const Config& config;
  distributed::ProcessContext& process;
  distributed::Communicator& comm;
  const data::Dataset& dataset;  // what the family's FamilyInfo::open_dataset opened
  torch::Device device;

  // The dataset as a scene, for families that train on views (std::logic_error otherwise).
  const data::SceneReader& scene() const;
};

// One `tessera info` line about a snapshot: a label and its value.
using InfoLine = data::InfoLine;

// How `tessera export SNAPSHOT --ply OUT` writes a snapshot of a family (needs no MPI).
struct ExportRequest {
  std::string snapshot;
  std::string out;     // the file to write
  std::string scene;   // the run's dataset ("" = the data.path stored in the snapshot)
  bool world = false;  // keep Tessera's normalized world coordinates instead of the capture's
};

// A registered family: the factory plus what the commands that read snapshots need.
struct FamilyInfo {
  std::string name;  // model.name
  std::function<std::unique_ptr<ModelFamily>(const FamilyContext&)> create;
  // Checks of the config that need no MPI (UserError, exit 2); may be empty.
  std::function<void(const Config&)> check_config;
  // Extra `tessera info` lines for a snapshot of this family; may be empty.
  std::function<std::vector<InfoLine>(const SnapshotReader&)> describe_snapshot;
  // `tessera export`; empty when the family has nothing to export. Returns the line to print.
  std::function<std::string(const ExportRequest&)> export_snapshot;
  // A model trained elsewhere that this family can render and score (`tessera eval --ply FILE`):
  // the config overrides that start the family from `path` (at least model.name), or nothing
  // when the family does not read such a file. May be empty.
  std::function<std::vector<std::string>(const std::string& path)> import_overrides;
  // The family's config sections (usually one, [<family>], bound to its options struct; the
  // models of one family share it) and the opt-in framework keys this model reads (dotted names,
  // or a section's name for all its opt-in keys: the sampling schedule, activation checkpointing,
  // the gradient buckets; the run's own keys every model reads). FamilyRegistry::add adds both to
  // the config schema, so that configs are parsed, refused and documented with them
  // (docs/config.md): a key the model does not read is refused by name.
  std::vector<config_schema::SectionSpec> config_sections;
  std::vector<std::string> shared_keys;
  // Framework keys whose values this model restricts: dotted name -> the values it takes, the
  // key's default among them (e.g. "checkpoint.policy" -> none, segments, budget). A config that
  // sets another value is refused at load naming the model's values; docs/config.md lists them.
  std::vector<config_schema::KeyChoices> key_choices;
  // Opens data.path as this family's kind of dataset (UserError naming the file when it is not
  // one). Empty: a tessera-scene (data::SceneReader).
  std::function<std::unique_ptr<data::Dataset>(const std::string& path)> open_dataset;
};

// Families by name. An unknown name throws UserError listing the known ones.
class FamilyRegistry {
 public:
  void add(FamilyInfo info);  // std::logic_error for a name registered twice
  const FamilyInfo& get(const std::string& name, const std::string& origin) const;
  // The model a config without model.name trains (the schema's default; std::logic_error for a
  // name not registered). Until set, such a config names no model and `get` refuses it.
  void set_default_model(const std::string& name);
  bool contains(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted

 private:
  std::vector<FamilyInfo> families_;
};

}  // namespace tessera
