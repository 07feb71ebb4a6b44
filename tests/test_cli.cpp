// End-to-end tests of the `tessera` executable: --version, help, exit codes, config errors,
// --print-config round trip, config-reference vs docs/config.md, and `bench allreduce` under mpiexec.
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using test::lines_of;
using test::read_file;
using test::remove_tree;
using test::CommandResult;
using test::contains;
using test::describe;
using test::quote;


void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}



// Parses one flat JSON object of string and number values: {"a":"x","b":1.5e-3}. Returns false
// on anything else.
bool parse_flat_json(const std::string& text, std::map<std::string, std::string>& fields) {
  size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  auto parse_string = [&](std::string& out) {
    if (i >= text.size() || text[i] != '"') return false;
    const size_t end = text.find('"', i + 1);
    if (end == std::string::npos) return false;
    out = text.substr(i + 1, end - i - 1);
    i = end + 1;
    return true;
  };
  skip_space();
  if (i >= text.size() || text[i++] != '{') return false;
  for (;;) {
    skip_space();
    std::string key, value;
    if (!parse_string(key)) return false;
    skip_space();
    if (i >= text.size() || text[i++] != ':') return false;
    skip_space();
    if (i < text.size() && text[i] == '"') {
      if (!parse_string(value)) return false;
      value = "\"" + value + "\"";  // keep strings recognisable
    } else {
      const size_t end = text.find_first_of(",}", i);
      if (end == std::string::npos) return false;
      value = text.substr(i, end - i);
      while (!value.empty() && value.back() == ' ') value.pop_back();
      i = end;
    }
    if (fields.count(key)) return false;
    fields[key] = value;
    skip_space();
    if (i >= text.size()) return false;
    if (text[i] == '}') {
      ++i;
      skip_space();
      return i == text.size();
    }
    if (text[i++] != ',') return false;
  }
}

// A JSON number, or NaN when `text` is not entirely one.
double json_number(const std::string& text) {
  if (text.empty()) return std::nan("");
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() ? value : std::nan("");
}

class CliTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"TESSERA_BINARY", "TESSERA_MPIEXEC", "TESSERA_SOURCE_DIR"}) {
      const char* value = std::getenv(name);
      ASSERT_TRUE(value && *value)
          << name << " is not set; run this test through CTest (ctest -R test_cli), which sets "
          << "TESSERA_BINARY, TESSERA_MPIEXEC and TESSERA_SOURCE_DIR";
    }
    binary_ = std::getenv("TESSERA_BINARY");
    mpiexec_ = std::getenv("TESSERA_MPIEXEC");
    source_dir_ = std::getenv("TESSERA_SOURCE_DIR");
    ASSERT_TRUE(fs::is_regular_file(binary_)) << "TESSERA_BINARY=" << binary_ << " is no file";
    demo_config_ = (fs::path(source_dir_) / "configs" / "demo_nerf.toml").string();
    ASSERT_TRUE(fs::is_regular_file(demo_config_)) << demo_config_;

    std::string pattern = (fs::path(testing::TempDir()) / "tessera_cli_XXXXXX").string();
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    ASSERT_NE(mkdtemp(buffer.data()), nullptr) << "mkdtemp " << pattern;
    temp_dir_ = buffer.data();
  }

  void TearDown() override {
    if (temp_dir_.empty()) return;
    remove_tree(temp_dir_);
  }

  // Runs `command` with /bin/sh; stdout and stderr are captured separately.
  CommandResult run_shell(const std::string& command) {
    const CommandResult result = test::run_shell(command, temp_dir_);
    if (result.exit_code < 0) ADD_FAILURE() << "could not run: " << command;
    return result;
  }

  // Runs `tessera ARGS` (each argument quoted).
  CommandResult tessera(const std::vector<std::string>& args) {
    std::string command = quote(binary_);
    for (const auto& arg : args) command += " " + quote(arg);
    return run_shell(command);
  }

  // Runs `mpiexec -n RANKS --oversubscribe tessera ARGS`.
  CommandResult mpi_tessera(int ranks, const std::vector<std::string>& args) {
    std::string command =
        quote(mpiexec_) + " -n " + std::to_string(ranks) + " --oversubscribe " + quote(binary_);
    for (const auto& arg : args) command += " " + quote(arg);
    return run_shell(command);
  }

  std::string temp_path(const std::string& name) const {
    return (fs::path(temp_dir_) / name).string();
  }

  // Writes `text` to a temp file named `name` and returns its path.
  std::string temp_file(const std::string& name, const std::string& text) {
    const std::string path = temp_path(name);
    write_file(path, text);
    return path;
  }

  std::string binary_, mpiexec_, source_dir_, demo_config_, temp_dir_;
};


// ---- --version and help ----------------------------------------------------------------------

TEST_F(CliTest, VersionListsEveryLibrary) {
  const CommandResult r = tessera({"--version"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = lines_of(r.out);
  std::map<std::string, std::string> by_name;  // first word -> rest of the line
  for (const auto& line : lines) {
    const size_t space = line.find(' ');
    if (space == std::string::npos) continue;
    const size_t value = line.find_first_not_of(' ', space);
    by_name[line.substr(0, space)] = value == std::string::npos ? "" : line.substr(value);
  }
  for (const char* name : {"tessera", "LibTorch", "CUDA", "NCCL", "MPI", "HDF5"}) {
    ASSERT_TRUE(by_name.count(name)) << "no line for " << name << "\n" << describe(r);
    EXPECT_FALSE(by_name[name].empty()) << name << " has no version\n" << describe(r);
  }
  EXPECT_EQ(lines.front().rfind("tessera ", 0), 0u) << describe(r);
  EXPECT_TRUE(isdigit(static_cast<unsigned char>(by_name["tessera"][0]))) << describe(r);
  EXPECT_TRUE(isdigit(static_cast<unsigned char>(by_name["LibTorch"][0]))) << describe(r);
  EXPECT_TRUE(contains(by_name["MPI"], "MPI")) << describe(r);  // e.g. "Open MPI v4.1.4"
  // This build links Debian's OpenMPI flavour of HDF5: "HDF5     1.10.8 (parallel)".
  const std::string& hdf5 = by_name["HDF5"];
  ASSERT_GE(hdf5.size(), std::string(" (parallel)").size()) << describe(r);
  EXPECT_EQ(hdf5.substr(hdf5.size() - std::string(" (parallel)").size()), " (parallel)")
      << describe(r);
  EXPECT_TRUE(isdigit(static_cast<unsigned char>(hdf5[0]))) << describe(r);
}

// Every entry of the "Positionals:", "Options:" and "Subcommands:" blocks of a CLI11 help text
// has a description: on its own line after a gap of two or more spaces ("  --name TYPE   text"),
// or, when the name is too long for the column, on the next, deeper indented line.
void expect_every_entry_described(const std::string& help) {
  const std::vector<std::string> lines = lines_of(help);
  int entries = 0;
  bool in_block = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line == "Positionals:" || line == "Options:" || line == "Subcommands:") {
      in_block = true;
      continue;
    }
    if (line.empty() || line[0] != ' ') {
      in_block = false;
      continue;
    }
    const size_t first = line.find_first_not_of(' ');
    if (!in_block || first == std::string::npos || first != 2) continue;  // continuation line
    ++entries;
    const size_t gap = line.find("  ", first);
    const bool inline_text =
        gap != std::string::npos && line.find_first_not_of(' ', gap) != std::string::npos;
    const bool next_line_text = i + 1 < lines.size() && lines[i + 1].size() > 4 &&
                                lines[i + 1].find_first_not_of(' ') > 4;
    EXPECT_TRUE(inline_text || next_line_text)
        << "entry without help text: '" << line << "'\nin:\n" << help;
  }
  EXPECT_GE(entries, 2) << "no option entries found in:\n" << help;
}

TEST_F(CliTest, TopLevelHelp) {
  const CommandResult r = tessera({"--help"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_every_entry_described(r.out);
  for (const char* text : {"--version", "--help", "train", "bench", "config-reference"})
    EXPECT_TRUE(contains(r.out, text)) << "help lacks " << text << "\n" << describe(r);
}

TEST_F(CliTest, TrainHelp) {
  const CommandResult r = tessera({"train", "--help"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_every_entry_described(r.out);
  for (const char* text : {"--set", "Override a config key", "--log-level", "Log level",
                           "--print-config", "Print the resolved config", "config",
                           "TOML config file"})
    EXPECT_TRUE(contains(r.out, text)) << "train help lacks '" << text << "'\n" << describe(r);
}

TEST_F(CliTest, BenchAllreduceHelp) {
  const CommandResult r = tessera({"bench", "allreduce", "--help"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  expect_every_entry_described(r.out);
  for (const char* text : {"--min-bytes", "--max-bytes", "--iters", "--warmup", "--device"})
    EXPECT_TRUE(contains(r.out, text)) << "bench help lacks " << text << "\n" << describe(r);
}

// ---- command-line errors -> exit code 2 ------------------------------------------------------

TEST_F(CliTest, NoSubcommandExits2) {
  const CommandResult r = tessera({});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_FALSE(r.err.empty()) << describe(r);
}

TEST_F(CliTest, UnknownSubcommandExits2) {
  const CommandResult r = tessera({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_NE(r.err.find("unknown command 'frobnicate'"), std::string::npos) << describe(r);
  EXPECT_NE(r.err.find("train"), std::string::npos) << "known commands listed: " << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
}

TEST_F(CliTest, UnknownFlagExits2) {
  const CommandResult top = tessera({"--no-such-flag"});
  EXPECT_EQ(top.exit_code, 2) << describe(top);
  const CommandResult train = tessera({"train", demo_config_, "--no-such-flag", "--print-config"});
  EXPECT_EQ(train.exit_code, 2) << describe(train);
  EXPECT_TRUE(contains(train.err, "--no-such-flag")) << describe(train);
  EXPECT_TRUE(train.out.empty()) << describe(train);
}

TEST_F(CliTest, BenchWithoutNameExits2) {
  const CommandResult r = tessera({"bench"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
}

TEST_F(CliTest, UnknownLogLevelExits2) {
  const CommandResult r = tessera({"train", demo_config_, "--log-level", "loud", "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "loud")) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
}

TEST_F(CliTest, LogLevelFlagSetsRunLogLevel) {
  const CommandResult r = tessera({"train", demo_config_, "--log-level", "debug", "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "log_level = \"debug\"")) << describe(r);
}

// ---- --print-config ---------------------------------------------------------------------------

TEST_F(CliTest, PrintConfigIsTomlThatRoundTrips) {
  const CommandResult first = tessera({"train", demo_config_, "--print-config"});
  ASSERT_EQ(first.exit_code, 0) << describe(first);
  EXPECT_TRUE(contains(first.out, "name = \"demo_nerf\"")) << describe(first);
  for (const char* section : {"[run]", "[data]", "[model]", "[train]", "[nerf]", "[distributed]"})
    EXPECT_TRUE(contains(first.out, std::string("\n") + section + "\n")) << section << "\n"
                                                                          << describe(first);
  EXPECT_TRUE(contains(first.out, "\nsteps = 800\n")) << describe(first);
  EXPECT_TRUE(contains(first.out, "name = \"nerf-hash\"")) << describe(first);

  const std::string copy = temp_file("resolved.toml", first.out);
  const CommandResult second = tessera({"train", copy, "--print-config"});
  ASSERT_EQ(second.exit_code, 0) << describe(second);
  // The first line is a comment naming the file it was loaded from (to_toml writes source_path
  // only as a comment), so it differs by design; every line after it must be identical.
  const std::vector<std::string> a = lines_of(first.out), b = lines_of(second.out);
  ASSERT_FALSE(a.empty());
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(a[0].rfind("#", 0), 0u) << a[0];
  EXPECT_TRUE(contains(a[0], demo_config_)) << a[0];
  EXPECT_TRUE(contains(b[0], copy)) << b[0];
  EXPECT_EQ(std::vector<std::string>(a.begin() + 1, a.end()),
            std::vector<std::string>(b.begin() + 1, b.end()))
      << "first:\n" << first.out << "second:\n" << second.out;
  EXPECT_TRUE(second.err.empty()) << describe(second);
}

TEST_F(CliTest, SetOverridesAppearInPrintConfig) {
  const CommandResult r = tessera({"train", demo_config_, "--set", "run.out_dir=/tmp/some/path",
                                   "--set", "train.steps=5", "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "out_dir = \"/tmp/some/path\"\n")) << describe(r);
  EXPECT_TRUE(contains(r.out, "steps = 5\n")) << describe(r);
  EXPECT_FALSE(contains(r.out, "\nsteps = 800\n")) << describe(r);
  EXPECT_FALSE(fs::exists("/tmp/some/path")) << "--print-config must create nothing";
}

TEST_F(CliTest, LaterSetWins) {
  const CommandResult r = tessera({"train", demo_config_, "--set", "train.steps=5", "--set",
                                   "train.steps=7", "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.out, "steps = 7\n")) << describe(r);
  EXPECT_FALSE(contains(r.out, "steps = 5\n")) << describe(r);
}

// ---- config errors -> exit code 2 with file:line and key -------------------------------------

TEST_F(CliTest, TypoKeyNamesFileLineAndSuggestion) {
  const std::string path = temp_file("typo.toml", "[train]\nstpes = 5\n");
  const CommandResult r = tessera({"train", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path + ":2:")) << describe(r);
  EXPECT_TRUE(contains(r.err, "train.stpes")) << describe(r);
  EXPECT_TRUE(contains(r.err, "did you mean 'train.steps'")) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
}

TEST_F(CliTest, WrongTypeNamesKey) {
  const std::string path = temp_file("type.toml", "[run]\nseed = 1\n\n[train]\nsteps = \"many\"\n");
  const CommandResult r = tessera({"train", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path + ":5:")) << describe(r);
  EXPECT_TRUE(contains(r.err, "train.steps")) << describe(r);
  EXPECT_TRUE(contains(r.err, "integer")) << describe(r);
}

TEST_F(CliTest, OutOfRangeNamesKey) {
  const std::string path = temp_file("range.toml", "[distributed]\ntimeout_s = -1.0\n");
  const CommandResult r = tessera({"train", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path + ":2:")) << describe(r);
  EXPECT_TRUE(contains(r.err, "distributed.timeout_s")) << describe(r);
  EXPECT_TRUE(contains(r.err, "out of range")) << describe(r);

  const std::string zero = temp_file("zero.toml", "[train]\nsteps = 0\n");
  const CommandResult z = tessera({"train", zero, "--print-config"});
  EXPECT_EQ(z.exit_code, 2) << describe(z);
  EXPECT_TRUE(contains(z.err, "train.steps")) << describe(z);
}

TEST_F(CliTest, UnknownSectionNamesSection) {
  const std::string path = temp_file("section.toml", "[run]\nseed = 3\n[trian]\nsteps = 5\n");
  const CommandResult r = tessera({"train", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path + ":3:")) << describe(r);
  EXPECT_TRUE(contains(r.err, "unknown section 'trian'")) << describe(r);
}

TEST_F(CliTest, MissingConfigFileNamesFile) {
  const std::string path = temp_path("does_not_exist.toml");
  const CommandResult r = tessera({"train", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path)) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
}

TEST_F(CliTest, TomlSyntaxErrorExits2) {
  const std::string path = temp_file("syntax.toml", "[train]\nsteps = = 5\n");
  const CommandResult r = tessera({"train", path, "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, path + ":2:")) << describe(r);
}

TEST_F(CliTest, TypoInSetNamesOverride) {
  const CommandResult r = tessera({"train", demo_config_, "--set", "train.stpes=3", "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--set train.stpes=3")) << describe(r);
  EXPECT_TRUE(contains(r.err, "did you mean 'train.steps'")) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
}

// A key the model does not read (another family's) is refused before anything runs.
TEST_F(CliTest, AGaussiansConfigWithANerfKeyExitsTwoNamingIt) {
  const std::string config = (fs::path(source_dir_) / "configs" / "demo_gaussians.toml").string();
  const CommandResult r =
      tessera({"train", config, "--set", "nerf.rays_per_step=512", "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--set nerf.rays_per_step=512: key 'nerf.rays_per_step' is not read "
                              "by model 'gaussians'")) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
  const std::string file = temp_file("mixed.toml", "[model]\nname = \"gaussians\"\n\n"
                                                   "[nerf]\nlr = 0.02\n");
  const CommandResult in_file = tessera({"train", file, "--print-config"});
  EXPECT_EQ(in_file.exit_code, 2) << describe(in_file);
  EXPECT_TRUE(contains(in_file.err, file + ":5: key 'nerf.lr' is not read by model 'gaussians'"))
      << describe(in_file);
  // The same config prints only the keys a gaussians run reads.
  const CommandResult ok = tessera({"train", config, "--print-config"});
  ASSERT_EQ(ok.exit_code, 0) << describe(ok);
  EXPECT_TRUE(contains(ok.out, "\n[gaussians]\n")) << describe(ok);
  EXPECT_FALSE(contains(ok.out, "[nerf]")) << describe(ok);
  EXPECT_FALSE(contains(ok.out, "bucket_mib")) << describe(ok);
}

TEST_F(CliTest, BadValueInSetNamesOverride) {
  const CommandResult r = tessera({"train", demo_config_, "--set", "train.steps=many", "--print-config"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--set train.steps=many")) << describe(r);
  EXPECT_TRUE(contains(r.err, "integer")) << describe(r);
}

// ---- train with no registered model ----------------------------------------------------------

// No model family is registered in this build yet (models/builtin.cpp), so training the demo
// config must stop with exit 2 before it creates the run directory. Revisit when "nerf-hash" lands.
TEST_F(CliTest, TrainUnknownModelExits2AndCreatesNothing) {
  const std::string out_dir = temp_path("run_out");
  ASSERT_FALSE(fs::exists(out_dir));
  const CommandResult r = tessera({"train", demo_config_, "--set", "run.out_dir=" + out_dir,
                                   "--set", "model.name=nerf-nope"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "model.name 'nerf-nope'")) << describe(r);
  EXPECT_TRUE(contains(r.err, "known: gaussians, nerf-hash, nerf-mlp")) << describe(r);
  EXPECT_FALSE(fs::exists(out_dir)) << "the run directory was created before the model check";
}

TEST_F(CliTest, TrainMissingDatasetExits2AndCreatesNothing) {
  const std::string out_dir = temp_path("run_out");
  const std::string missing = temp_path("no_such_scene.h5");
  const CommandResult r = tessera({"train", demo_config_, "--set", "run.out_dir=" + out_dir,
                                   "--set", "data.path=" + missing});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, missing)) << describe(r);
  EXPECT_FALSE(fs::exists(out_dir)) << "the run directory was created before the dataset check";
  const CommandResult empty = tessera({"train", demo_config_, "--set", "run.out_dir=" + out_dir,
                                       "--set", "data.path=\"\""});
  EXPECT_EQ(empty.exit_code, 2) << describe(empty);
  EXPECT_TRUE(contains(empty.err, "data.path is empty")) << describe(empty);
}

TEST_F(CliTest, TrainTwoRanksOnASynthSceneWritesMetricsLogsAndRenders) {
  const std::string scene = temp_path("scene.h5");
  const CommandResult synth = tessera({"synth", "--preset", "objects", "--out", scene, "--views",
                                       "12", "--width", "32", "--height", "24"});
  ASSERT_EQ(synth.exit_code, 0) << describe(synth);
  const std::string out_dir = temp_path("run");
  const CommandResult r = mpi_tessera(
      2, {"train", demo_config_, "--set", "data.path=" + scene, "--set", "run.out_dir=" + out_dir,
          "--set", "train.steps=6", "--set", "nerf.rays_per_step=256", "--set", "nerf.unit_rays=64",
          "--set", "train.log_every=3", "--set", "eval.max_views=1", "--set", "checkpoint.policy=segments",
          "--set", "checkpoint.every=1", "--verbose"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_TRUE(contains(r.err, "step 6/6 loss ")) << "progress line:\n" << describe(r);
  // --verbose: the line ends with the seconds per phase, the ray family's then the run's;
  // density_mlp is checkpointed (every = 1 leaves the last segment, color_mlp, kept), so its
  // recompute has a phase of its own.
  EXPECT_TRUE(contains(r.err, " | sample ")) << describe(r);
  for (const char* phase : {" march ", " encode ", " mlp ", " composite ", " backward ",
                            " recompute ", " gradient_sync ", " optimizer ", " skip_check "})
    EXPECT_TRUE(contains(r.err, phase)) << phase << " missing\n" << describe(r);
  EXPECT_TRUE(contains(r.err, "eval psnr")) << describe(r);
  const std::vector<std::string> records = lines_of(read_file(out_dir + "/metrics.jsonl"));
  ASSERT_GE(records.size(), 2u) << "metrics.jsonl";
  for (const char* key : {"\"step\":3", "\"loss\":", "\"lr\":", "\"sampling_rate\":",
                                 "\"rays_per_s\":", "\"peak_mem_bytes\":", "\"psnr\":",
                                 "\"phase_s\":{", "\"sample\":", "\"recompute\":",
                                 "\"skip_check\":"})
    EXPECT_TRUE(contains(records[0], key)) << key << " missing in " << records[0];
  EXPECT_TRUE(fs::exists(out_dir + "/logs/rank-0.log"));
  EXPECT_TRUE(fs::exists(out_dir + "/logs/rank-1.log"));
  EXPECT_TRUE(contains(read_file(out_dir + "/logs/rank-1.log"), "[rank 1]"));
  EXPECT_TRUE(contains(read_file(out_dir + "/logs/rank-0.log"), "1 of 2 segments recomputed"))
      << read_file(out_dir + "/logs/rank-0.log");
  size_t renders = 0, targets = 0;
  for (const auto& entry : fs::directory_iterator(out_dir + "/renders")) {
    const std::string name = entry.path().filename().string();
    renders += name.rfind("step-", 0) == 0 ? 1 : 0;
    targets += name.rfind("target-view-", 0) == 0 ? 1 : 0;
  }
  EXPECT_EQ(renders, 1u) << "one eval view at the end";
  EXPECT_EQ(targets, 1u) << "and the target it was scored against";
  // A radiance field has no samples to draw.
  const CommandResult sample = tessera(
      {"sample", out_dir + "/snapshots/step-00000006.h5", "--out", temp_path("samples")});
  EXPECT_EQ(sample.exit_code, 2) << describe(sample);
  EXPECT_TRUE(contains(sample.err, "model 'nerf-hash' is not a generative model")) << describe(sample);
}

// The third family end to end: shapes from `synth`, `train` on 2 ranks, `eval` of its snapshot
// (the denoising loss and the generative metrics) and of its run folder, `sample` to PLY files
// (refused a second time into the same folder), and `render`, which has no camera to render,
// refused.
TEST_F(CliTest, PointDiffusionTrainsOnTwoRanksAndItsSnapshotEvaluates) {
  const std::string shapes = temp_dir_ + "/shapes.h5";
  const std::string out_dir = temp_dir_ + "/diffusion";
  ASSERT_EQ(tessera({"synth", "--preset", "shapes", "--count", "20", "--points", "64", "--out",
                     shapes}).exit_code, 0);
  const CommandResult r = tessera({"train", demo_config_, "--set", "model.name=point-diffusion",
                                   "--set", "data.path=" + shapes});
  EXPECT_EQ(r.exit_code, 2) << describe(r);  // the demo's [nerf] keys are not this model's
  EXPECT_TRUE(contains(r.err, "key 'nerf.rays_per_step' is not read by model 'point-diffusion'"))
      << describe(r);
  const std::string config = temp_file(
      "diffusion.toml", "[model]\nname = \"point-diffusion\"\n[data]\npath = \"" + shapes +
                            "\"\n[run]\nout_dir = \"" + out_dir + "\"\n[train]\nsteps = 4\n"
                            "log_every = 2\n[diffusion]\nwidth = 16\ndepth = 1\nheads = 2\n"
                            "tokens = 32\nbatch = 4\nwarmup_steps = 0\n");
  const CommandResult train = mpi_tessera(2, {"train", config});
  ASSERT_EQ(train.exit_code, 0) << describe(train);
  EXPECT_TRUE(contains(train.err, "step 4/4 loss ")) << describe(train);
  EXPECT_TRUE(contains(train.err, "shapes/s")) << describe(train);
  EXPECT_TRUE(contains(train.err, "eval denoise_loss ")) << describe(train);
  const std::string snapshot = out_dir + "/snapshots/step-00000004.h5";
  const CommandResult eval = mpi_tessera(2, {"eval", snapshot});
  ASSERT_EQ(eval.exit_code, 0) << describe(eval);
  EXPECT_TRUE(contains(eval.out, "\"model\":\"point-diffusion\"")) << describe(eval);
  EXPECT_TRUE(contains(eval.out, "\"val\":{\"1nna\":")) << describe(eval);
  for (const char* key : {"\"denoise_loss\":", "\"mmd\":", "\"cov\":", "\"shapes\":2"})
    EXPECT_TRUE(contains(eval.out, key)) << key << " missing: " << describe(eval);
  // A run folder, or its snapshots/, stands for its newest snapshot; a folder without one is
  // refused (exit 2).
  const CommandResult info = tessera({"info", out_dir});
  ASSERT_EQ(info.exit_code, 0) << describe(info);
  EXPECT_TRUE(contains(info.out, snapshot + ": ")) << describe(info);
  const CommandResult by_folder = tessera({"eval", out_dir + "/snapshots", "--split", "val"});
  ASSERT_EQ(by_folder.exit_code, 0) << describe(by_folder);
  EXPECT_TRUE(contains(by_folder.out, "\"snapshot\":\"" + snapshot + "\"")) << describe(by_folder);
  fs::create_directories(temp_dir_ + "/empty_run");
  const CommandResult empty = tessera({"eval", temp_dir_ + "/empty_run"});
  EXPECT_EQ(empty.exit_code, 2) << describe(empty);
  EXPECT_TRUE(contains(empty.err, "no snapshot that validates in " + temp_dir_ + "/empty_run"))
      << describe(empty);
  const std::string samples = temp_dir_ + "/samples";
  const std::vector<std::string> sample_args = {"sample", snapshot, "--out", samples, "--count",
                                                "3", "--steps", "5", "--sampler", "ddpm"};
  const CommandResult sample = mpi_tessera(2, sample_args);
  ASSERT_EQ(sample.exit_code, 0) << describe(sample);
  EXPECT_TRUE(contains(sample.err, "3 samples (ddpm, 5 steps, 32 points each)")) << describe(sample);
  for (const char* file : {"sample-0000.ply", "sample-0001.ply", "sample-0002.ply"}) {
    const std::string ply = read_file(samples + "/" + file);
    EXPECT_TRUE(contains(ply, "element vertex 32\n")) << file;
    // The header, then 32 records of 3 floats and 3 bytes.
    EXPECT_EQ(ply.size() - (ply.find("end_header\n") + 11), 32u * 15) << file;
  }
  EXPECT_FALSE(fs::exists(samples + "/sample-0003.ply"));
  const CommandResult again = tessera(sample_args);
  EXPECT_EQ(again.exit_code, 2) << describe(again);
  EXPECT_TRUE(contains(again.err, "already holds samples")) << describe(again);
  const CommandResult steps = tessera({"sample", snapshot, "--out", temp_dir_ + "/s2", "--steps",
                                       "5000"});
  EXPECT_EQ(steps.exit_code, 2) << describe(steps);
  EXPECT_TRUE(contains(steps.err, "sampling steps = 5000 must lie in [1, 1000]")) << describe(steps);
  const CommandResult render = tessera({"render", snapshot, "--out", temp_dir_ + "/r"});
  EXPECT_EQ(render.exit_code, 2) << describe(render);
  EXPECT_TRUE(contains(render.err, "not on camera views: there is nothing to render"))
      << describe(render);
}

// ---- config-reference --------------------------------------------------------------------------

TEST_F(CliTest, ConfigReferenceMatchesDocs) {
  const std::string doc = read_file((fs::path(source_dir_) / "docs" / "config.md").string());
  const std::string begin_marker = "<!-- BEGIN GENERATED -->\n";
  const std::string end_marker = "<!-- END GENERATED -->";
  const size_t begin = doc.find(begin_marker);
  ASSERT_NE(begin, std::string::npos) << "docs/config.md lacks " << begin_marker;
  const size_t start = begin + begin_marker.size();
  const size_t end = doc.find(end_marker, start);
  ASSERT_NE(end, std::string::npos) << "docs/config.md lacks " << end_marker;
  const std::string generated = doc.substr(start, end - start);
  ASSERT_FALSE(generated.empty());

  const CommandResult r = tessera({"config-reference"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, generated);
  EXPECT_TRUE(contains(r.out, "`train.steps`")) << describe(r);
}

// ---- bench allreduce under mpiexec ---------------------------------------------------------------

TEST_F(CliTest, BenchAllreduceTwoRanksPrintsOneJsonLinePerSize) {
  const CommandResult r = mpi_tessera(2, {"bench", "allreduce", "--min-bytes", "4096",
                                          "--max-bytes", "65536", "--iters", "3", "--warmup", "1"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 5u) << "one line per size 4096..65536 from rank 0 only\n" << describe(r);
  int64_t expected_bytes = 4096;
  for (const auto& line : lines) {
    std::map<std::string, std::string> fields;
    ASSERT_TRUE(parse_flat_json(line, fields)) << "not a flat JSON object: " << line;
    EXPECT_EQ(fields["bench"], "\"allreduce\"") << line;
    EXPECT_TRUE(fields.count("backend")) << line;
    EXPECT_EQ(json_number(fields["ranks"]), 2.0) << line;
    EXPECT_EQ(json_number(fields["bytes"]), static_cast<double>(expected_bytes)) << line;
    for (const char* key : {"tessera_s", "raw_s", "busbw_gbs"}) {
      ASSERT_TRUE(fields.count(key)) << key << " missing: " << line;
      const double value = json_number(fields[key]);
      EXPECT_TRUE(value > 0.0) << key << " = '" << fields[key] << "' is not positive: " << line;
    }
    expected_bytes *= 2;
  }
}

TEST_F(CliTest, BenchAllreduceBadRangeExits2Once) {
  const CommandResult r =
      mpi_tessera(2, {"bench", "allreduce", "--min-bytes", "8", "--max-bytes", "4"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
  // Reported before MPI starts, by the launcher's rank 0 only.
  const std::string message = "--min-bytes <= --max-bytes";
  const size_t first = r.err.find(message);
  ASSERT_NE(first, std::string::npos) << describe(r);
  EXPECT_EQ(r.err.find(message, first + 1), std::string::npos) << "printed more than once\n"
                                                                << describe(r);
}

}  // namespace
}  // namespace tessera
