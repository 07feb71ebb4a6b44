// The config schema: the framework's table (one entry per key), the families' sections added at
// registration, and the helpers that describe and check values. To add a framework key: add the
// struct field in config.h and one key(...) entry below; docs follow. A family's keys live in its
// folder (models/<family>/*_config.cpp).
#include "framework/config_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace tessera::config_schema {
namespace {

// Room for the longest shortest-round-trip text of a double ("-2.2250738585072014e-308").
constexpr size_t kDoubleTextBytes = 32;
// One day: a collective that has not finished by then is a hang, not a slow network.
constexpr double kMaxCollectiveTimeoutS = 86400.0;

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


const std::vector<std::string>& framework_sections() {
  static const std::vector<std::string> kSections = {
      "run", "data", "model", "train", "sampling", "checkpoint", "snapshot", "eval", "distributed"};
  return kSections;
}

const std::vector<KeySpec>& framework_keys() {
  static const std::vector<KeySpec> kKeys = {
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
      key("run", "verbose", [](auto& c) -> auto& { return c.run.verbose; })
          .defaults_to(false)
          .doc("The progress line adds this rank's seconds per phase of a step (means over the "
               "steps since the last line; the phases of each family are listed in "
               "docs/training_loop.md). metrics.jsonl has them always (phase_s)."),
      key("run", "tensorboard", [](auto& c) -> auto& { return c.run.tensorboard; })
          .defaults_to(true)
          .doc("Rank 0 writes TensorBoard event files to RUN_DIR/tensorboard: every number of "
               "each metrics.jsonl record as a scalar of the same name, the eval renders beside "
               "their targets (eval/view_III) and the resolved config as text "
               "(docs/training_loop.md, \"TensorBoard\"). `tensorboard --logdir runs` shows "
               "every run."),
      key("run", "deterministic", [](auto& c) -> auto& { return c.run.deterministic; })
          .defaults_to(true)
          .doc("Bitwise the same parameters, optimizer state, losses and metrics on any number of "
               "ranks and at any threads per rank, for every model: the step's work is cut into "
               "units fixed by the data (e.g. rays, shapes or image tiles; some models size them "
               "by a unit_* key), summed exactly or in a fixed order, and torch's own "
               "CPU ops run on one thread (docs/training_loop.md, \"Bitwise at any world "
               "size\": what holds, and its price in speed). false: the float path, bitwise only "
               "at the same world size and thread count."),
      key("data", "path", [](auto& c) -> auto& { return c.data.path; })
          .defaults_to("")
          .doc("Path to the dataset: a tessera-scene HDF5 file, or another kind that the model's family opens, e.g. a tessera-shapes file (docs/formats.md); empty means none."),
      key("model", "name", [](auto& c) -> auto& { return c.model.name; })
          .defaults_to("")
          .doc("Model to train, by its family's name (docs/architecture.md): one of the models that read the family sections below, whose keys are there; a key the model does not read is refused. An unknown name is refused with the list of known ones."),
      key("train", "steps", [](auto& c) -> auto& { return c.train.steps; })
          .defaults_to(30000).range(1, kMaxSteps)
          .doc("Optimizer steps; the schedule points of the model's section (e.g. when densification starts and ends) are written for this count and scale with the steps a budget chooses (train.epochs, train.time_budget_minutes); periods (e.g. densify_every, opacity_reset_every) do not (docs/training_loop.md, \"Budgets\")."),
      key("train", "epochs", [](auto& c) -> auto& { return c.train.epochs; })
          .defaults_to(0.0).range(0.0, 1e6)
          .doc("When > 0, train.steps is replaced by this many passes over the training data: ceil(epochs x epoch / batch), with the epoch and the batch in the family's work units (e.g. the train views' pixels and the rays per step, or the train shapes and the batch; each family's doc says its own), so that a capture of 300 views trains longer than one of 50. The progress line says the plan. 0 = train.steps."),
      key("train", "time_budget_minutes", [](auto& c) -> auto& { return c.train.time_budget_minutes; })
          .defaults_to(0.0).range(0.0, 1e6)
          .doc("Wall-clock budget of the run (a resumed run counts the time before its snapshot). From the step times it measures, the run plans the steps that fit, keeping time for the final eval and snapshot, at most the steps of train.steps or train.epochs; the schedules scale with the plan; a run that still runs out of time ends early with its final eval and snapshot. The step count then depends on the machine's speed: 0 (none) for runs that must be bitwise reproducible."),
      key("train", "precision", [](auto& c) -> auto& { return c.train.precision; })
          .defaults_to("fp32").one_of({"fp32", "bf16", "fp16"})
          .doc("Arithmetic of the forward: bf16 autocast (CUDA and CPU), or fp16 autocast with a dynamic loss scaler (CUDA only). What each model keeps in float32 (e.g. compositing) is in its doc."),
      key("train", "log_every", [](auto& c) -> auto& { return c.train.log_every; })
          .defaults_to(50).range(1, kMaxSteps)
          .doc("Steps between progress lines and metrics.jsonl records."),
      key("train", "max_skipped_steps", [](auto& c) -> auto& { return c.train.max_skipped_steps; })
          .defaults_to(100).range(1, kMaxSteps)
          .doc("Consecutive steps skipped for non-finite loss or gradients after which the run stops with an error (the last snapshot is kept)."),
      key("train", "check_learning_after", [](auto& c) -> auto& { return c.train.check_learning_after; })
          .defaults_to(300).range(0, kMaxSteps)
          .doc("After this many steps, warn (once, naming the likely causes the model's family gives: for captured views poses, bounds, background, learning rate) when the mean loss of the last 50 steps is not at least 10% below that of the 50 after a warm-up of a sixth of them; 0 = never."),
      key("sampling", "schedule", [](auto& c) -> auto& { return c.sampling.schedule; })
          .opt_in().defaults_to("constant").one_of({"constant", "linear", "cosine", "step"})
          .doc("Schedule of the sampling rate, the fraction of the family's training items (e.g. rays or views) drawn per epoch."),
      key("sampling", "rate_max", [](auto& c) -> auto& { return c.sampling.rate_max; })
          .opt_in().defaults_to(1.0).range_open_low(0, 1)
          .doc("Sampling rate at the first step."),
      key("sampling", "rate_min", [](auto& c) -> auto& { return c.sampling.rate_min; })
          .opt_in().defaults_to(1.0).range_open_low(0, 1)
          .doc("Lowest sampling rate (reached at the last step by linear and cosine)."),
      key("sampling", "step_every", [](auto& c) -> auto& { return c.sampling.step_every; })
          .opt_in().defaults_to(1000).range(1, kMaxSteps)
          .doc("Step schedule: steps between rate reductions."),
      key("sampling", "step_factor", [](auto& c) -> auto& { return c.sampling.step_factor; })
          .opt_in().defaults_to(0.5).range_open_low(0, 1)
          .doc("Step schedule: factor applied to the rate at each reduction."),
      key("sampling", "rescale_lr", [](auto& c) -> auto& { return c.sampling.rescale_lr; })
          .opt_in().defaults_to(false)
          .doc("Scale the learning rate with the sampling rate (docs/training.md)."),
      key("checkpoint", "policy", [](auto& c) -> auto& { return c.checkpoint.policy; })
          .opt_in().defaults_to("none")
          .doc("Activation checkpointing per rank, by name (docs/checkpointing.md): `none`, or a policy of the model's, as the Allowed column lists them; what each recomputes is in its model's doc. Another value is refused at load."),
      key("checkpoint", "segments", [](auto& c) -> auto& { return c.checkpoint.segments; })
          .opt_in().defaults_to("")
          .doc("`segments` policy: comma-separated names of the model segments to recompute."),
      key("checkpoint", "every", [](auto& c) -> auto& { return c.checkpoint.every; })
          .opt_in().defaults_to(0).at_least(0)
          .doc("`segments` policy: recompute every N-th segment (0 = off; 1 = all but the last, whose recompute would come first in backward and lower the peak by nothing; name it in `segments` to force it)."),
      key("checkpoint", "budget_mib", [](auto& c) -> auto& { return c.checkpoint.budget_mib; })
          .opt_in().defaults_to(0.0).at_least(0)
          .doc("`budget` policy: activation memory per rank, MiB, the recomputes' transient included; the model recomputes the least whose predicted peak fits (its unit of recompute, e.g. segments, blocks or views per pass, is in its model's doc and docs/checkpointing.md)."),
      key("snapshot", "every", [](auto& c) -> auto& { return c.snapshot.every; })
          .defaults_to(1000).range(0, kMaxSteps)
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
          .doc("The split evaluated, with the family's eval metrics (each family's doc): its views (PSNR, SSIM, rendered PNGs), or its shapes (e.g. a held-out loss and sample metrics)."),
      key("eval", "max_views", [](auto& c) -> auto& { return c.eval.max_views; })
          .defaults_to(4).range(1, 100000)
          .doc("Items (views, shapes) of the split scored per evaluation, spread evenly over it (item i * n / max_views of its n; all when max_views >= n): the first views of a capture would score one part of it (a walk-through's first photos, its start)."),
      key("eval", "train_views", [](auto& c) -> auto& { return c.eval.train_views; })
          .defaults_to(4).range(0, 100000)
          .doc("Image families: this many train views (at most as many as the eval views scored), spread evenly over the train split, are scored too, and the eval line adds `train_psnr` and `psnr_gap` (train minus eval PSNR). A gap over 6 dB is a warning that names the likely causes: the model fits the training views without the scene's geometry. 0 = off; no effect when `eval.split` is train."),
      key("distributed", "backend", [](auto& c) -> auto& { return c.distributed.backend; })
          .defaults_to("auto").one_of({"auto", "mpi", "nccl"})
          .doc("Communicator: `auto` uses NCCL for CUDA tensors and MPI for CPU."),
      key("distributed", "timeout_s", [](auto& c) -> auto& { return c.distributed.timeout_s; })
          .defaults_to(600.0).range_open_low(0, kMaxCollectiveTimeoutS)
          .doc("A collective that takes longer (seconds) aborts the whole job."),
      key("distributed", "heartbeat_s", [](auto& c) -> auto& { return c.distributed.heartbeat_s; })
          .defaults_to(20.0).range(0.0, kMaxCollectiveTimeoutS)
          .doc("A rank that sends no heartbeat (a UDP datagram to the next rank, twice a second) for this long (seconds) ends the whole job with exit code 3: a lost process, node or link is found this fast whatever `timeout_s` is. 0 = off (then only `timeout_s` finds them)."),
      key("distributed", "threads", [](auto& c) -> auto& { return c.distributed.threads; })
          .defaults_to(0).at_least(0)
          .doc("Intra-op CPU threads per rank; 0 = its share of the cores its launcher bound it to: the cores of its CPU mask divided by the ranks on the node that share them."),
      key("distributed", "check_agreement",
          [](auto& c) -> auto& { return c.distributed.check_agreement; })
          .defaults_to(false)
          .doc("Debug mode: check each step that agreed values are identical on every rank."),
      key("distributed", "first_bucket_mib",
          [](auto& c) -> auto& { return c.distributed.first_bucket_mib; })
          .opt_in().defaults_to(1.0).range_open_low(0, 4096)
          .doc("Gradient sync: size of the first bucket, small so communication starts early."),
      key("distributed", "bucket_mib", [](auto& c) -> auto& { return c.distributed.bucket_mib; })
          .opt_in().defaults_to(25.0).range_open_low(0, 4096)
          .doc("Gradient sync: size of the later buckets."),
  };
  return kKeys;
}

// The whole schema: the framework's sections and keys, then each family's as registered.
struct Schema {
  std::vector<std::string> sections = framework_sections();
  std::vector<KeySpec> keys = framework_keys();
  std::vector<SectionSpec> family_sections;
  struct Model {
    std::string name;
    std::vector<std::string> shared;  // opt-in framework keys it reads (dotted, or a section)
    std::vector<KeyChoices> choices;  // framework keys whose values it restricts
  };
  std::vector<Model> models;
};

Schema& the_schema() {
  static Schema schema;
  return schema;
}

bool contains(const std::vector<std::string>& list, const std::string& item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// Whether a model that declares `shared` (FamilyInfo::shared_keys) reads the framework key
// `spec`: a key every model reads, or an opt-in key named by its dotted name or its section.
bool declares(const std::vector<std::string>& shared, const KeySpec& spec) {
  return !spec.declared_only || contains(shared, spec.dotted()) || contains(shared, spec.section);
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

const std::vector<std::string>& sections() { return the_schema().sections; }
const std::vector<KeySpec>& schema() { return the_schema().keys; }

const SectionSpec* family_section(const std::string& name) {
  for (const SectionSpec& section : the_schema().family_sections)
    if (section.name == name) return &section;
  return nullptr;
}

void add_section(SectionSpec section) {
  Schema& schema = the_schema();
  if (contains(framework_sections(), section.name))
    throw std::logic_error("config section [" + section.name + "] belongs to the framework");
  if (const SectionSpec* known = family_section(section.name)) {
    bool same = known->models == section.models && known->keys.size() == section.keys.size();
    for (size_t i = 0; same && i < section.keys.size(); ++i)
      same = known->keys[i].name == section.keys[i].name;
    if (!same)
      throw std::logic_error("config section [" + section.name + "] registered twice, differently");
    return;
  }
  for (KeySpec& spec : section.keys) {
    if (spec.section != section.name)
      throw std::logic_error("key '" + spec.dotted() + "' listed in section [" + section.name + "]");
    if (!spec.fixed_default) throw std::logic_error("key '" + spec.dotted() + "' has no default");
    for (const std::string& model : spec.models)
      if (!contains(section.models, model))
        throw std::logic_error("key '" + spec.dotted() + "' is for model '" + model +
                               "', which does not read [" + section.name + "]");
    schema.keys.push_back(spec);
  }
  schema.sections.push_back(section.name);
  schema.family_sections.push_back(std::move(section));
}

void add_model(const std::string& model, std::vector<std::string> shared,
               std::vector<KeyChoices> choices) {
  auto framework_key = [](const std::string& dotted) -> const KeySpec* {
    for (const KeySpec& spec : the_schema().keys)
      if (spec.dotted() == dotted && !family_section(spec.section)) return &spec;
    return nullptr;
  };
  for (const std::string& entry : shared) {
    bool names_opt_in_key = false;
    for (const KeySpec& spec : the_schema().keys)
      names_opt_in_key = names_opt_in_key || (spec.declared_only && !family_section(spec.section) &&
                                              (spec.dotted() == entry || spec.section == entry));
    if (!names_opt_in_key)
      throw std::logic_error("model '" + model + "' declares '" + entry +
                             "', which names no opt-in framework key");
  }
  for (const KeyChoices& entry : choices) {
    const KeySpec* spec = framework_key(entry.key);
    if (!spec || spec->kind != ValueKind::kString || !spec->fixed_default ||
        !declares(shared, *spec))
      throw std::logic_error("model '" + model + "' restricts '" + entry.key +
                             "', which is not a framework string key with a default it reads");
    if (!contains(entry.values, std::get<std::string>(*spec->fixed_default)))
      throw std::logic_error("model '" + model + "' restricts '" + entry.key +
                             "' to values without its default");
  }
  Schema::Model spec{model, std::move(shared), std::move(choices)};
  for (Schema::Model& known : the_schema().models) {
    if (known.name == model) {
      known = std::move(spec);
      return;
    }
  }
  the_schema().models.push_back(std::move(spec));
}

std::vector<std::string> models() {
  std::vector<std::string> out;
  for (const Schema::Model& entry : the_schema().models) out.push_back(entry.name);
  return out;
}

void set_default_model(const std::string& model) {
  for (KeySpec& spec : the_schema().keys)
    if (spec.dotted() == "model.name") spec.fixed_default = Value(model);
}

std::vector<std::string> model_choices(const std::string& model, const KeySpec& spec) {
  for (const Schema::Model& entry : the_schema().models)
    if (entry.name == model)
      for (const KeyChoices& choice : entry.choices)
        if (choice.key == spec.dotted()) return choice.values;
  return {};
}

bool reads(const std::string& model, const KeySpec& spec) {
  if (const SectionSpec* section = family_section(spec.section)) {
    return contains(section->models, model) && (spec.models.empty() || contains(spec.models, model));
  }
  for (const Schema::Model& entry : the_schema().models)
    if (entry.name == model) return declares(entry.shared, spec);
  return true;
}

std::string readers_of(const KeySpec& spec) {
  if (const SectionSpec* section = family_section(spec.section))
    return join_names(spec.models.empty() ? section->models : spec.models);
  std::vector<std::string> readers;
  for (const std::string& model : models())
    if (reads(model, spec)) readers.push_back(model);
  return readers.size() == models().size() ? "" : join_names(readers);
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
    if (const cs::SectionSpec* family = cs::family_section(section)) {
      std::string models;
      for (const auto& model : family->models) models += (models.empty() ? "`" : "`, `") + model;
      md << "Read by " << models << "`. " << family->doc << "\n\n";
    }
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
      // Models that restrict a framework key: "model-a: `none`, `segments`; model-b: ...".
      std::string per_model;
      for (const std::string& model : cs::models()) {
        const std::vector<std::string> values = cs::model_choices(model, spec);
        if (values.empty()) continue;
        std::string list;
        for (const std::string& v : values) list += (list.empty() ? "`" : ", `") + v + "`";
        per_model += (per_model.empty() ? "" : "; ") + model + ": " + list;
      }
      if (!per_model.empty()) allowed = per_model;
      // Who reads a key, where not every model that reads its section does.
      std::string readers;
      if (cs::family_section(section) ? !spec.models.empty() : !cs::readers_of(spec).empty())
        readers = " Read by: " + cs::readers_of(spec) + ".";
      md << "| `" << spec.dotted() << "` | " << cs::kind_name(spec.kind) << " | " << def << " | "
         << allowed << " | " << spec.description << readers << " |\n";
    }
    if (!any) md << "No keys yet: the section may be present, but empty.\n";
    md << "\n";
  }
  return md.str();
}

}  // namespace tessera
