// Typed run configuration: a TOML file plus "--set section.key=value" overrides, validated once.
// After load_config() the rest of Tessera sees only these structs, never raw TOML.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// [run] — identity and output of the run.
struct RunConfig {
  std::string name;       // defaults to the config file's stem; only [A-Za-z0-9._-]
  std::string out_dir;    // defaults to "runs/<name>"
  int64_t seed = 0;       // seed of all randomness
  std::string log_level;  // trace | debug | info | warn | error
};

// [data] — the dataset.
struct DataConfig {
  std::string path;  // tessera-scene HDF5 file; "" = none
};

// [model] — which model to train (looked up by name in the model registry).
struct ModelConfig {
  std::string name;
  // `nerf-hash` only (docs/nerf.md): the hash grid's size.
  int64_t hash_levels = 0;
  int64_t hash_log2_size = 0;
  int64_t hash_max_resolution = 0;
  int64_t march_steps = 0;          // 0 = NerfHashOptions::steps_per_diagonal
  double distortion_weight = 0.0;
  // `gaussians` only (docs/gaussians.md):
  int64_t views_per_step = 1;
  double resolution_scale = 1.0;
  int64_t num_downscales = 0;         // coarse to fine
  int64_t resolution_schedule = 0;
  int64_t views_per_pass = 0;         // 0 = from the [checkpoint] budget
  std::string init_ply;               // "" = the dataset's points
  int64_t random_count = 0;           // random Gaussians when the dataset has no points
  int64_t densify_from = 0;
  int64_t densify_until = 0;
  int64_t densify_every = 0;
  double densify_grad_threshold = 0.0;
  int64_t opacity_reset_every = 0;
  int64_t sh_degree_interval = 0;
};

// [train] — the optimization loop.
struct TrainConfig {
  int64_t steps = 0;          // optimizer steps
  int64_t rays_per_step = 0;  // global batch of rays per step, split across ranks
  int64_t micro_batches = 0;  // gradient accumulation: micro-batches per step on each rank
  double lr = 0.0;            // peak learning rate
  std::string lr_schedule;    // constant | exponential | cosine
  double final_lr = 0.0;      // learning rate at the last step (exponential, cosine)
  int64_t warmup_steps = 0;   // linear warm-up steps
  std::string precision;      // fp32 | bf16 | fp16 (the last two on CUDA)
  int64_t log_every = 0;      // steps between progress lines and metrics records
  double adam_eps = 0.0;      // Adam's epsilon
  int64_t max_skipped_steps = 0;  // consecutive non-finite steps that stop the run
  std::string background;     // random | dataset: training background where the data has alpha
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
};

// [distributed] — the communicator and per-rank resources.
struct DistributedConfig {
  std::string backend;           // auto | mpi | nccl
  double timeout_s = 0.0;        // a collective slower than this aborts the job
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
};

// Loads `path` (TOML), applies overrides of the form "section.key=value" in order, validates, and
// fills defaults. Throws UserError on any problem; the message starts with the location
// ("FILE:LINE: ..." or "--set OVERRIDE: ...").
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

// Same from TOML text (for tests; `origin` names it in messages). run.name defaults to "run".
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});

// The full resolved config (every key, defaults included) as TOML text that parse_config accepts
// and that round-trips exactly (source_path excepted: it is written only as a comment).
std::string to_toml(const Config& config);

// Markdown reference of every key (section, key, type, default, allowed values, description).
// docs/config.md embeds it verbatim between its GENERATED markers.
std::string config_reference_markdown();

}  // namespace tessera
