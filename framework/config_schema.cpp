// The config schema table (one entry per key) and the helpers that describe and check values.
// To add a key: add the struct field in config.h and one key(...) entry below; docs follow.
#include "framework/config_schema.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tessera::config_schema {
namespace {

// Room for the longest shortest-round-trip text of a double ("-2.2250738585072014e-308").
constexpr size_t kDoubleTextBytes = 32;
// Longest run of steps we accept: far beyond any real run, small enough to catch a typo'd exponent.
constexpr double kMaxTrainSteps = 1e9;
// One day: a collective that has not finished by then is a hang, not a slow network.
constexpr double kMaxCollectiveTimeoutS = 86400.0;
// 2^26 rays: far beyond one node's memory per step; a typo guard, not a tuning limit.
constexpr double kMaxRaysPerStep = 67108864.0;

bool is_run_name_char(char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
         ch == '.' || ch == '_' || ch == '-';
}

std::string check_run_name(const Value& v) {
  const std::string& name = std::get<std::string>(v);
  if (name.empty()) return "it must not be empty";
  for (char ch : name) {
    if (!is_run_name_char(ch)) return "use only letters, digits, '.', '_' and '-'";
  }
  if (name == "." || name == "..") return "'.' and '..' are not run names";
  return "";
}

std::string check_non_empty(const Value& v) {
  return std::get<std::string>(v).empty() ? "it must not be empty" : "";
}

// Shortest text that reads back as exactly `x`, e.g. "600", "0.1", "1e-300" (no forced ".0").
std::string shortest_double(double x) {
  char buf[kDoubleTextBytes];
  const auto result = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, result.ptr);
}

std::string format_bound(const KeySpec& spec, double bound) {
  if (spec.kind == ValueKind::kInteger) return std::to_string(static_cast<long long>(bound));
  return shortest_double(bound);
}

std::string escape_toml_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}

}  // namespace

const std::vector<std::string>& sections() {
  static const std::vector<std::string> kSections = {
      "run", "data", "model", "train", "sampling", "checkpoint", "snapshot", "eval", "distributed"};
  return kSections;
}

const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> kSchema = {
      key("run", "name", [](auto& c) -> auto& { return c.run.name; })
          .defaults_by("the config file's stem (`run` when there is no file)",
                       [](const Config&, const DefaultContext& ctx) {
                         return Value(ctx.file_stem.empty() ? "run" : ctx.file_stem);
                       })
          .check("non-empty; only `A-Z a-z 0-9 . _ -`; not `.` or `..`", check_run_name)
          .doc("Name of the run."),
      key("run", "out_dir", [](auto& c) -> auto& { return c.run.out_dir; })
          .defaults_by("`runs/<run.name>`",
                       [](const Config& c, const DefaultContext&) {
                         return Value("runs/" + c.run.name);
                       })
          .check("non-empty", check_non_empty)
          .doc("The run directory (logs, metrics, snapshots)."),
      key("run", "seed", [](auto& c) -> auto& { return c.run.seed; })
          .defaults_to(0).at_least(0)
          .doc("Seed of all randomness."),
      key("run", "log_level", [](auto& c) -> auto& { return c.run.log_level; })
          .defaults_to("info").one_of({"trace", "debug", "info", "warn", "error"})
          .doc("Least severe log message that is written."),
      key("data", "path", [](auto& c) -> auto& { return c.data.path; })
          .defaults_to("")
          .doc("Path to a tessera-scene HDF5 dataset; empty means none."),
      key("model", "name", [](auto& c) -> auto& { return c.model.name; })
          .defaults_to("nerf-hash")
          .doc("Model family to train (docs/architecture.md): `nerf-hash`, `nerf-mlp` (docs/nerf.md) or `gaussians` (3DGS, docs/gaussians.md)."),
      key("model", "hash_levels", [](auto& c) -> auto& { return c.model.hash_levels; })
          .defaults_to(12).range(1, 32)
          .doc("`nerf-hash`: levels L of the multiresolution hash grid (instant-ngp: 16)."),
      key("model", "hash_log2_size", [](auto& c) -> auto& { return c.model.hash_log2_size; })
          .defaults_to(15).range(10, 24)
          .doc("`nerf-hash`: log2 of the rows T per level (instant-ngp: 19); the table holds L * T * 2 parameters."),
      key("model", "hash_max_resolution", [](auto& c) -> auto& { return c.model.hash_max_resolution; })
          .defaults_to(256).range(16, 1 << 16)
          .doc("`nerf-hash`: the finest level's resolution N_max over the scene box (the contracted cube of an unbounded scene); about 2x the image side resolves what the images show (instant-ngp: 2048)."),
      key("model", "march_steps", [](auto& c) -> auto& { return c.model.march_steps; })
          .defaults_to(256).range(16, 4096)
          .doc("`nerf-hash`: ray-marching steps per diagonal of the scene box (of the foreground box of an unbounded scene, beyond which steps grow with distance); fewer steps are faster and blur thin surfaces (instant-ngp: 1024 in its unit cube)."),
      key("model", "distortion_weight", [](auto& c) -> auto& { return c.model.distortion_weight; })
          .defaults_to(0.0).range(0.0, 1.0)
          .doc("`nerf-hash`: weight of mip-NeRF 360's distortion loss, per ray, against the photometric mean squared error; it pulls each ray's weight onto one surface, which removes the fog and floaters a real capture otherwise grows (nerfacto: 0.002); 0 = off."),
      key("model", "views_per_step", [](auto& c) -> auto& { return c.model.views_per_step; })
          .defaults_to(1).range(1, 4096)
          .doc("`gaussians`: training views per step (the view batch); learning rates scale with its square root."),
      key("model", "resolution_scale", [](auto& c) -> auto& { return c.model.resolution_scale; })
          .defaults_to(1.0).range(1, 64)
          .doc("`gaussians`: render and compare at width/scale x height/scale."),
      key("model", "num_downscales", [](auto& c) -> auto& { return c.model.num_downscales; })
          .defaults_to(0).range(0, 8)
          .doc("`gaussians`: coarse to fine: train at resolution_scale x 2^n at first, halving the downscale every resolution_schedule steps (0 = full resolution throughout)."),
      key("model", "resolution_schedule", [](auto& c) -> auto& { return c.model.resolution_schedule; })
          .defaults_to(3000).range(1, kMaxTrainSteps)
          .doc("`gaussians`: steps between halvings of the coarse-to-fine downscale."),
      key("model", "views_per_pass", [](auto& c) -> auto& { return c.model.views_per_pass; })
          .defaults_to(0).range(0, 4096)
          .doc("`gaussians`: views of a batch rendered and backpropagated together, their gradients accumulated; 0 = as many as [checkpoint] budget_mib allows per rank when policy = \"budget\", else the whole batch."),
      key("model", "init_ply", [](auto& c) -> auto& { return c.model.init_ply; })
          .defaults_to("")
          .doc("`gaussians`: start from this INRIA-layout .ply (e.g. `tessera export`) instead of the dataset's points."),
      key("model", "random_count", [](auto& c) -> auto& { return c.model.random_count; })
          .defaults_to(100000).range(1, int64_t{1} << 31)
          .doc("`gaussians`: Gaussians drawn at random when the dataset has no points (no SfM points, no `init_ply`): in the scene bounds, and half of them out to the scene extent for an unbounded capture (docs/gaussians.md)."),
      key("model", "densify_from", [](auto& c) -> auto& { return c.model.densify_from; })
          .defaults_to(500).at_least(0)
          .doc("`gaussians`: densify after this step ..."),
      key("model", "densify_until", [](auto& c) -> auto& { return c.model.densify_until; })
          .defaults_to(15000).at_least(0)
          .doc("`gaussians`: ... and before this step ..."),
      key("model", "densify_every", [](auto& c) -> auto& { return c.model.densify_every; })
          .defaults_to(100).range(1, kMaxTrainSteps)
          .doc("`gaussians`: ... every this many steps (clone, split, prune)."),
      key("model", "densify_grad_threshold", [](auto& c) -> auto& { return c.model.densify_grad_threshold; })
          .defaults_to(2e-4).range_open_low(0, 1)
          .doc("`gaussians`: mean screen-space gradient norm (NDC units) above which a Gaussian is cloned or split."),
      key("model", "opacity_reset_every", [](auto& c) -> auto& { return c.model.opacity_reset_every; })
          .defaults_to(3000).range(1, kMaxTrainSteps)
          .doc("`gaussians`: opacity reset cadence (while densifying)."),
      key("model", "sh_degree_interval", [](auto& c) -> auto& { return c.model.sh_degree_interval; })
          .defaults_to(1000).range(1, kMaxTrainSteps)
          .doc("`gaussians`: the spherical-harmonics degree rises by one every this many steps, up to 3."),
      key("train", "steps", [](auto& c) -> auto& { return c.train.steps; })
          .defaults_to(30000).range(1, kMaxTrainSteps)
          .doc("Optimizer steps."),
      key("train", "rays_per_step", [](auto& c) -> auto& { return c.train.rays_per_step; })
          .defaults_to(4096).range(1, kMaxRaysPerStep)
          .doc("Global batch of rays per step, split evenly across ranks."),
      key("train", "micro_batches", [](auto& c) -> auto& { return c.train.micro_batches; })
          .defaults_to(1).range(1, 4096)
          .doc("Gradient accumulation: micro-batches per step on each rank (same result as one batch)."),
      key("train", "lr", [](auto& c) -> auto& { return c.train.lr; })
          .defaults_to(1e-2).range_open_low(0, 10)
          .doc("Peak learning rate (Adam)."),
      key("train", "lr_schedule", [](auto& c) -> auto& { return c.train.lr_schedule; })
          .defaults_to("exponential").one_of({"constant", "exponential", "cosine"})
          .doc("Learning-rate schedule from `train.lr` to `train.final_lr` (docs/training.md)."),
      key("train", "final_lr", [](auto& c) -> auto& { return c.train.final_lr; })
          .defaults_to(1e-4).range_open_low(0, 10)
          .doc("Learning rate at the last step (exponential and cosine schedules)."),
      key("train", "warmup_steps", [](auto& c) -> auto& { return c.train.warmup_steps; })
          .defaults_to(0).at_least(0)
          .doc("Steps of linear learning-rate warm-up."),
      key("train", "precision", [](auto& c) -> auto& { return c.train.precision; })
          .defaults_to("fp32").one_of({"fp32", "bf16", "fp16"})
          .doc("Arithmetic of the forward: bf16 autocast (CUDA and CPU), or fp16 autocast with a dynamic loss scaler (CUDA only). Compositing, the 3DGS kernels and the 3DGS loss stay float32."),
      key("train", "log_every", [](auto& c) -> auto& { return c.train.log_every; })
          .defaults_to(50).range(1, kMaxTrainSteps)
          .doc("Steps between progress lines and metrics.jsonl records."),
      key("train", "adam_eps", [](auto& c) -> auto& { return c.train.adam_eps; })
          .defaults_to(1e-15).range(0, 1)
          .doc("Adam's epsilon (instant-ngp uses 1e-15; larger values damp the steps of weights with tiny gradients)."),
      key("train", "max_skipped_steps", [](auto& c) -> auto& { return c.train.max_skipped_steps; })
          .defaults_to(100).range(1, kMaxTrainSteps)
          .doc("Consecutive steps skipped for non-finite loss or gradients after which the run stops with an error (the last snapshot is kept)."),
      key("train", "background", [](auto& c) -> auto& { return c.train.background; })
          .defaults_to("random").one_of({"random", "dataset"})
          .doc("NeRF: `random` renders each training ray over its own random color. With alpha the target is composited over the same color (nerfstudio's random background), so the model learns transparency instead of painting the background into the scene; unbounded datasets without alpha (real captures) keep the photo as target, so the model learns that every ray ends on something opaque instead of fitting a fog over the background (instant-ngp). `dataset` uses the dataset's background. No effect on bounded datasets without alpha; eval always uses the dataset's background."),
      key("train", "check_learning_after", [](auto& c) -> auto& { return c.train.check_learning_after; })
          .defaults_to(300).range(0, kMaxTrainSteps)
          .doc("After this many steps, warn (once, naming the likely causes: poses, bounds, background, learning rate) when the mean loss of the last 50 steps is not at least 10% below that of the 50 after a warm-up of a sixth of them; 0 = never."),
      key("sampling", "schedule", [](auto& c) -> auto& { return c.sampling.schedule; })
          .defaults_to("constant").one_of({"constant", "linear", "cosine", "step"})
          .doc("Schedule of the sampling rate, the fraction of training rays (NeRF) or views (`gaussians`) drawn per epoch."),
      key("sampling", "rate_max", [](auto& c) -> auto& { return c.sampling.rate_max; })
          .defaults_to(1.0).range_open_low(0, 1)
          .doc("Sampling rate at the first step."),
      key("sampling", "rate_min", [](auto& c) -> auto& { return c.sampling.rate_min; })
          .defaults_to(1.0).range_open_low(0, 1)
          .doc("Lowest sampling rate (reached at the last step by linear and cosine)."),
      key("sampling", "step_every", [](auto& c) -> auto& { return c.sampling.step_every; })
          .defaults_to(1000).range(1, kMaxTrainSteps)
          .doc("Step schedule: steps between rate reductions."),
      key("sampling", "step_factor", [](auto& c) -> auto& { return c.sampling.step_factor; })
          .defaults_to(0.5).range_open_low(0, 1)
          .doc("Step schedule: factor applied to the rate at each reduction."),
      key("sampling", "rescale_lr", [](auto& c) -> auto& { return c.sampling.rescale_lr; })
          .defaults_to(false)
          .doc("Scale the learning rate with the sampling rate (docs/training.md); NeRF only (a `gaussians` step always renders views_per_step views)."),
      key("checkpoint", "policy", [](auto& c) -> auto& { return c.checkpoint.policy; })
          .defaults_to("none").one_of({"none", "segments", "budget"})
          .doc("Activation checkpointing per rank (docs/checkpointing.md)."),
      key("checkpoint", "segments", [](auto& c) -> auto& { return c.checkpoint.segments; })
          .defaults_to("")
          .doc("`segments` policy: comma-separated names of the model segments to recompute."),
      key("checkpoint", "every", [](auto& c) -> auto& { return c.checkpoint.every; })
          .defaults_to(0).at_least(0)
          .doc("`segments` policy: recompute every N-th segment (0 = off)."),
      key("checkpoint", "budget_mib", [](auto& c) -> auto& { return c.checkpoint.budget_mib; })
          .defaults_to(0.0).at_least(0)
          .doc("`budget` policy: activation memory per rank, MiB; the fewest segments that fit are recomputed (`gaussians`: the most views per pass that fit)."),
      key("snapshot", "every", [](auto& c) -> auto& { return c.snapshot.every; })
          .defaults_to(1000).range(0, kMaxTrainSteps)
          .doc("Steps between snapshots in RUN_DIR/snapshots (0 = only at the end; one is always written at the end, on SIGTERM/SIGINT and at `--until`)."),
      key("snapshot", "keep", [](auto& c) -> auto& { return c.snapshot.keep; })
          .defaults_to(3).range(0, 1000000)
          .doc("Newest snapshots kept in RUN_DIR/snapshots (0 = keep all)."),
      key("snapshot", "parallel", [](auto& c) -> auto& { return c.snapshot.parallel; })
          .defaults_to(true)
          .doc("Write sharded state with parallel HDF5 (every rank its own rows); false: rank 0 gathers and writes."),
      key("eval", "every", [](auto& c) -> auto& { return c.eval.every; })
          .defaults_to(0).at_least(0)
          .doc("Steps between evaluations; 0 = only at the end."),
      key("eval", "split", [](auto& c) -> auto& { return c.eval.split; })
          .defaults_to("val").one_of({"val", "test", "train"})
          .doc("Views evaluated (PSNR, SSIM, rendered PNGs)."),
      key("eval", "max_views", [](auto& c) -> auto& { return c.eval.max_views; })
          .defaults_to(4).range(1, 100000)
          .doc("Views rendered per evaluation."),
      key("distributed", "backend", [](auto& c) -> auto& { return c.distributed.backend; })
          .defaults_to("auto").one_of({"auto", "mpi", "nccl"})
          .doc("Communicator: `auto` uses NCCL for CUDA tensors and MPI for CPU."),
      key("distributed", "timeout_s", [](auto& c) -> auto& { return c.distributed.timeout_s; })
          .defaults_to(600.0).range_open_low(0, kMaxCollectiveTimeoutS)
          .doc("A collective that takes longer (seconds) aborts the whole job."),
      key("distributed", "threads", [](auto& c) -> auto& { return c.distributed.threads; })
          .defaults_to(0).at_least(0)
          .doc("Intra-op CPU threads per rank; 0 = the node's cores divided by its ranks."),
      key("distributed", "check_agreement",
          [](auto& c) -> auto& { return c.distributed.check_agreement; })
          .defaults_to(false)
          .doc("Debug mode: check each step that agreed values are identical on every rank."),
      key("distributed", "first_bucket_mib",
          [](auto& c) -> auto& { return c.distributed.first_bucket_mib; })
          .defaults_to(1.0).range_open_low(0, 4096)
          .doc("Gradient sync: size of the first bucket, small so communication starts early."),
      key("distributed", "bucket_mib", [](auto& c) -> auto& { return c.distributed.bucket_mib; })
          .defaults_to(25.0).range_open_low(0, 4096)
          .doc("Gradient sync: size of the later buckets."),
  };
  return kSchema;
}

std::string kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::kString: return "string";
    case ValueKind::kInteger: return "integer";
    case ValueKind::kFloat: return "float";
    case ValueKind::kBool: return "boolean";
  }
  return "?";
}

std::string format_value(const Value& v) {
  if (const auto* s = std::get_if<std::string>(&v)) return escape_toml_string(*s);
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  const double x = std::get<double>(v);
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  std::string text = shortest_double(x);
  // TOML reads "600" as an integer: keep a float recognisable as one.
  if (text.find_first_of(".eE") == std::string::npos) text += ".0";
  return text;
}

std::string describe_allowed(const KeySpec& spec) {
  std::string out;
  if (!spec.choices.empty()) {
    for (size_t i = 0; i < spec.choices.size(); ++i) out += (i ? ", " : "") + spec.choices[i];
    return out;
  }
  if (spec.min && spec.max) {
    return (spec.min_open ? "(" : "[") + format_bound(spec, *spec.min) + ", " +
           format_bound(spec, *spec.max) + "]";
  }
  if (spec.min) return (spec.min_open ? "> " : ">= ") + format_bound(spec, *spec.min);
  if (spec.max) return "<= " + format_bound(spec, *spec.max);
  if (spec.rule) return spec.rule_doc;
  return spec.kind == ValueKind::kBool ? "true, false" : "any";
}

std::string check_value(const KeySpec& spec, const Value& v) {
  const std::string what = "key '" + spec.dotted() + "'";
  if (spec.min || spec.max) {
    const double x = std::holds_alternative<int64_t>(v) ? static_cast<double>(std::get<int64_t>(v))
                                                        : std::get<double>(v);
    // Written so that NaN fails every bound.
    const bool low_ok = !spec.min || (spec.min_open ? x > *spec.min : x >= *spec.min);
    const bool high_ok = !spec.max || x <= *spec.max;
    if (!low_ok || !high_ok) {
      const std::string allowed = describe_allowed(spec);
      return what + " = " + format_value(v) + " is out of range " +
             (spec.min && spec.max ? allowed : "(must be " + allowed + ")");
    }
  }
  if (!spec.choices.empty()) {
    const std::string& s = std::get<std::string>(v);
    bool found = false;
    for (const auto& choice : spec.choices) found = found || choice == s;
    if (!found) return what + " must be one of " + describe_allowed(spec) + "; got '" + s + "'";
  }
  if (spec.rule) {
    const std::string problem = spec.rule(v);
    if (!problem.empty()) return what + " = " + format_value(v) + " is invalid: " + problem;
  }
  return "";
}

}  // namespace tessera::config_schema

namespace tessera {

std::string config_reference_markdown() {
  namespace cs = config_schema;
  std::ostringstream md;
  for (const std::string& section : cs::sections()) {
    md << "## [" << section << "]\n\n";
    bool any = false;
    for (const cs::KeySpec& spec : cs::schema()) {
      if (spec.section != section) continue;
      if (!any) {
        md << "| Key | Type | Default | Allowed | Description |\n"
           << "| --- | --- | --- | --- | --- |\n";
        any = true;
      }
      std::string def = spec.default_doc;
      if (spec.fixed_default) def = "`" + cs::format_value(*spec.fixed_default) + "`";
      std::string allowed = cs::describe_allowed(spec);
      if (!spec.choices.empty()) {
        allowed.clear();
        for (const auto& choice : spec.choices) {
          allowed += (allowed.empty() ? "`" : ", `") + choice + "`";
        }
      } else if (spec.min || spec.max || spec.kind == cs::ValueKind::kBool) {
        allowed = "`" + allowed + "`";
      }
      md << "| `" << spec.dotted() << "` | " << cs::kind_name(spec.kind) << " | " << def << " | "
         << allowed << " | " << spec.description << " |\n";
    }
    if (!any) md << "No keys yet: the section may be present, but empty.\n";
    md << "\n";
  }
  return md.str();
}

}  // namespace tessera
