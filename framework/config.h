// Typed run configuration: a TOML file plus "--set section.key=value" overrides, validated once.
// After load_config() the rest of Tessera sees only these structs, never raw TOML.
#pragma once

#include <any>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera {

// [run] — identity and output of the run.
struct RunConfig {
  std::string name;       // defaults to the config file's stem; only [A-Za-z0-9._-]
  std::string out_dir;    // defaults to "runs/<name>"
  int64_t seed = 0;       // seed of all randomness
  std::string log_level;  // trace | debug | info | warn | error
  bool verbose = false;   // the progress line adds the time per phase of the step
  bool tensorboard = true;  // RUN_DIR/tensorboard event files
  bool deterministic = true;  // bitwise the same at any world size (docs/training_loop.md)
};

// [data] — the dataset.
struct DataConfig {
  std::string path;  // tessera-scene HDF5 file; "" = none
};

// [model] — which model to train (looked up by name in the family registry). The model's own
// keys live in its family's section ([<family>]): Config::section<S>().
struct ModelConfig {
  std::string name;
};

// [train] — the run's step loop, for every family. How a family batches and optimizes (rays per
// step, learning rates, ...) is in its own section.
struct TrainConfig {
  int64_t steps = 0;          // optimizer steps (the plan the family's schedules are written for)
  double epochs = 0.0;        // > 0: steps from passes over the training data (framework/budget.h)
  double time_budget_minutes = 0.0;  // > 0: the run plans its steps to end within this
  std::string precision;      // fp32 | bf16 | fp16 (the last on CUDA)
  int64_t log_every = 0;      // steps between progress lines and metrics records
  int64_t max_skipped_steps = 0;  // consecutive non-finite steps that stop the run
  int64_t check_learning_after = 0;  // steps after which a loss that has not improved is warned of
};

// [sampling] — dynamic sampling: the fraction of training rays drawn per epoch.
struct SamplingConfig {
  std::string schedule;  // constant | linear | cosine | step
  double rate_max = 0.0;
  double rate_min = 0.0;
  int64_t step_every = 0;   // step schedule: steps between reductions
  double step_factor = 0.0;  // step schedule: factor per reduction
  bool rescale_lr = false;   // scale the LR with the rate
};

// [checkpoint] — activation checkpointing per rank.
struct CheckpointConfig {
  std::string policy;     // none | segments | budget
  std::string segments;   // segments policy: comma-separated segment names
  int64_t every = 0;      // segments policy: every N-th segment (0 = off)
  double budget_mib = 0;  // budget policy: activation memory per rank
};

// [snapshot] — snapshots in RUN_DIR/snapshots (docs/formats.md, docs/training_loop.md).
struct SnapshotConfig {
  int64_t every = 0;     // steps between snapshots; 0 = only at the end
  int64_t keep = 0;      // newest snapshots kept; 0 = all
  bool parallel = true;  // parallel HDF5 for sharded state
};

// [eval] — evaluation on held-out views.
struct EvalConfig {
  int64_t every = 0;      // steps between evaluations; 0 = only at the end
  std::string split;      // val | test | train
  int64_t max_views = 0;  // views rendered per evaluation
  int64_t train_views = 0;  // train views also scored, for the train-eval gap; 0 = off
};

// [distributed] — the communicator and per-rank resources.
struct DistributedConfig {
  std::string backend;           // auto | mpi | nccl
  double timeout_s = 0.0;        // a collective slower than this aborts the job
  double heartbeat_s = 0.0;      // a rank silent this long (lost node) aborts the job; 0 = off
  int64_t threads = 0;           // intra-op CPU threads per rank; 0 = node cores / local ranks
  bool check_agreement = false;  // debug: verify agreed values are identical on every rank
  double first_bucket_mib = 0;   // gradient sync: size of the first (earliest) bucket
  double bucket_mib = 0;         // gradient sync: size of later buckets
};

// The resolved configuration. The reference of every key is docs/config.md.
struct Config {
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
  SamplingConfig sampling;
  CheckpointConfig checkpoint;
  SnapshotConfig snapshot;
  EvalConfig eval;
  DistributedConfig distributed;
  std::string source_path;  // the file it was loaded from ("" if none)

  // A family's section, typed by the family: S is its options struct with
  // `static constexpr const char* kSection`, and S's member initializers are the defaults (also
  // of a Config built in code, which holds no section until one is stored).
  template <typename S>
  const S& section() const {
    const auto it = family_sections_.find(S::kSection);
    if (it == family_sections_.end()) {
      static const S kDefaults{};
      return kDefaults;
    }
    return std::any_cast<const S&>(it->second);
  }
  template <typename S>
  S& section() {
    std::any& slot = family_sections_[S::kSection];
    if (!slot.has_value()) slot = S{};
    return std::any_cast<S&>(slot);
  }

 private:
  std::map<std::string, std::any> family_sections_;  // section name -> its struct
};

// Loads `path` (TOML), applies overrides of the form "section.key=value" in order, validates, and
// fills defaults. Throws UserError on any problem; the message starts with the location
// ("FILE:LINE: ..." or "--set OVERRIDE: ..."). The families' sections are known once their
// FamilyInfos are registered (FamilyRegistry::add); a key the chosen model does not read (another
// family's, or an opt-in framework key its family does not declare) is refused by name.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same from TOML text (for tests; `origin` names it in messages). run.name defaults to "run".
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// A config stored in a snapshot (to_toml of its run), with `overrides` checked as usual. Written
// by this or an earlier Tessera, whose to_toml wrote every key of every model in [model] and
// [train]: a stored key the model does not read is dropped, and one the schema has since moved to
// the family's section (same name) is read there.
Config parse_stored_config(const std::string& toml_text, const std::string& origin,
                           const std::vector<std::string>& overrides = {});

// The resolved config as TOML text that parse_config accepts and that round-trips exactly
// (source_path excepted: it is written only as a comment): every key the model reads, defaults
// included, and no key it does not read.
std::string to_toml(const Config& config);

// Markdown reference of every key (section, key, type, default, allowed values, description).
// docs/config.md embeds it verbatim between its GENERATED markers.
std::string config_reference_markdown();

}  // namespace tessera
