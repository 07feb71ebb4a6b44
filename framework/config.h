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
};

// [train] — the optimization loop.
struct TrainConfig {
  int64_t steps = 0;  // optimizer steps
};

// [distributed] — the communicator and per-rank resources.
struct DistributedConfig {
  std::string backend;           // auto | mpi | nccl
  double timeout_s = 0.0;        // a collective slower than this aborts the job
  int64_t threads = 0;           // intra-op CPU threads per rank; 0 = node cores / local ranks
  bool check_agreement = false;  // debug: verify agreed values are identical on every rank
};

// The resolved configuration. Sections [sampling] [checkpoint] [snapshot] [eval] are accepted in
// files but have no keys yet. The reference of every key is docs/config.md.
struct Config {
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  TrainConfig train;
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
