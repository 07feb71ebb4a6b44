// End-to-end tests of `tessera bench gaussians` (under mpiexec), `tessera bench diffusion` and
// `tessera bench nerf --precision`: the JSON lines they print, their help and their exit code 2
// on bad input.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/cuda.h>
#include <torch/types.h>

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





// The repository (CTest sets TESSERA_SOURCE_DIR), for its configs.
std::string source_dir() {
  const char* dir = std::getenv("TESSERA_SOURCE_DIR");
  return dir != nullptr && *dir != 0 ? dir : ".";
}

// How often `needle` occurs in `text`.
int occurrences(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

class BenchCliTest : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"TESSERA_BINARY", "TESSERA_MPIEXEC"}) {
      const char* value = std::getenv(name);
      ASSERT_TRUE(value && *value) << name << " is not set; run this test through CTest "
                                   << "(ctest -R test_bench_cli)";
    }
    binary_ = std::getenv("TESSERA_BINARY");
    mpiexec_ = std::getenv("TESSERA_MPIEXEC");
    std::string pattern = (fs::path(testing::TempDir()) / "tessera_bench_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
    temp_dir_ = pattern;
  }

  void TearDown() override {
    if (!temp_dir_.empty()) remove_tree(temp_dir_);
  }

  // Runs `command` with /bin/sh; stdout and stderr are captured separately.
  CommandResult run_shell(const std::string& command) {
    const CommandResult result = test::run_shell(command, temp_dir_);
    if (result.exit_code < 0) ADD_FAILURE() << "could not run: " << command;
    return result;
  }

  // `tessera ARGS`, or `mpiexec -n RANKS --oversubscribe tessera ARGS` when ranks > 0.
  CommandResult tessera(int ranks, const std::vector<std::string>& args) {
    std::string command = quote(binary_);
    if (ranks > 0)
      command = quote(mpiexec_) + " -n " + std::to_string(ranks) + " --oversubscribe " + command;
    for (const auto& arg : args) command += " " + quote(arg);
    return run_shell(command);
  }

  std::string binary_, mpiexec_, temp_dir_;
};

// ---- bench gaussians ---------------------------------------------------------------------------

TEST_F(BenchCliTest, GaussiansTwoRanksPrintsOneJsonLine) {
  const CommandResult r = tessera(2, {"bench", "gaussians", "--count", "2000", "--steps", "1",
                                      "--warmup", "0", "--size", "32", "--views", "4"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 1u) << "one JSON line, from rank 0 only\n" << describe(r);
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(lines[0])) << lines[0];
  // The fields the issue asks for, in its order, then the extra ones.
  const std::vector<std::string> required = {"bench", "count", "ranks", "step_s",
                                             "gaussians_per_s", "peak_bytes_per_rank"};
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(lines[0]);
  std::vector<std::string> keys;
  for (const auto& item : ordered.items()) keys.push_back(item.key());
  ASSERT_GE(keys.size(), required.size()) << lines[0];
  EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + required.size()), required)
      << lines[0];
  EXPECT_EQ(j.at("bench"), "gaussians");
  EXPECT_EQ(j.at("count").get<int64_t>(), 2000);
  EXPECT_EQ(j.at("ranks").get<int>(), 2);
  const double step_s = j.at("step_s").get<double>();
  EXPECT_GT(step_s, 0.0) << lines[0];
  EXPECT_NEAR(j.at("gaussians_per_s").get<double>(), 2000.0 / step_s, 1e-3 * 2000.0 / step_s)
      << lines[0];
  const int64_t peak = j.at("peak_bytes_per_rank").get<int64_t>();
  // At least the owned parameters: half of 2000 Gaussians x 59 floats.
  EXPECT_GE(peak, 1000 * 59 * 4) << lines[0];
  EXPECT_GT(j.at("steady_peak_bytes_per_rank").get<int64_t>(), 0) << lines[0];
  EXPECT_LE(j.at("steady_peak_bytes_per_rank").get<int64_t>(), peak) << lines[0];
  const int64_t per_rank = j.at("max_gaussians_per_rank").get<int64_t>();
  EXPECT_GE(per_rank, 1000) << lines[0];
  EXPECT_LE(per_rank, 2000) << lines[0];
  EXPECT_EQ(j.at("size").get<int>(), 32) << lines[0];
  // Rank 0's seconds per phase of its one timed step: the step's phases, which together make up
  // its wall time (step_s is the slowest rank's, and rank 0 waits for it in the collectives).
  const nlohmann::json& phases = j.at("phases_s");
  double phase_sum = 0;
  for (const char* phase : {"project", "sh", "exchange", "bin", "rasterize", "loss",
                            "rasterize_bwd", "project_bwd", "optimizer", "densify"}) {
    ASSERT_TRUE(phases.contains(phase)) << phase << " missing: " << lines[0];
    EXPECT_GE(phases.at(phase).get<double>(), 0.0) << phase;
    phase_sum += phases.at(phase).get<double>();
  }
  EXPECT_GT(phases.at("rasterize").get<double>(), 0.0) << lines[0];
  EXPECT_GT(phases.at("rasterize_bwd").get<double>(), 0.0) << lines[0];
  // One timed step: rank 0's phases split a part of its step, which step_s (the slowest rank's
  // wall time around it) contains. How much of the step they cover depends on the scheduling of
  // oversubscribed ranks, so no lower bound here: PhaseTimer's test checks the split itself.
  EXPECT_LE(phase_sum, step_s * 1.01 + 1e-3) << lines[0];
  EXPECT_TRUE(contains(r.err, "[bench gaussians]")) << "progress on stderr\n" << describe(r);
}

// --scene without --count: the Gaussians start from the dataset's points, as training does.
TEST_F(BenchCliTest, GaussiansSceneStartsFromItsPoints) {
  const std::string scene = (fs::path(temp_dir_) / "scene.h5").string();
  const CommandResult synth = tessera(0, {"synth", "--preset", "objects", "--out", scene,
                                          "--views", "6", "--width", "32", "--height", "24"});
  ASSERT_EQ(synth.exit_code, 0) << describe(synth);
  const size_t at = synth.out.find(" points,");
  ASSERT_NE(at, std::string::npos) << describe(synth);
  const size_t from = synth.out.rfind(' ', at - 1) + 1;
  const int64_t points = std::stoll(synth.out.substr(from, at - from));
  ASSERT_GT(points, 0) << describe(synth);
  const CommandResult r = tessera(2, {"bench", "gaussians", "--scene", scene, "--steps", "1",
                                      "--warmup", "0"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 1u) << describe(r);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j.at("count").get<int64_t>(), points) << lines[0];
  EXPECT_EQ(j.at("size").get<int>(), 32) << lines[0];
  EXPECT_TRUE(contains(r.err, "initializing from the points of")) << describe(r);
}

TEST_F(BenchCliTest, GaussiansBadCountExits2Once) {
  const CommandResult r = tessera(2, {"bench", "gaussians", "--count", "0"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
  // Found before MPI starts, reported by the launcher's rank 0 only.
  EXPECT_EQ(occurrences(r.err, "--count must be >= 1"), 1) << describe(r);
}

TEST_F(BenchCliTest, GaussiansWithoutCountExits2) {
  const CommandResult r = tessera(0, {"bench", "gaussians", "--steps", "1"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--count is required without --scene")) << describe(r);
}

TEST_F(BenchCliTest, GaussiansBadStepsExits2) {
  const CommandResult r = tessera(0, {"bench", "gaussians", "--count", "10", "--steps", "0"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--steps must be >= 1")) << describe(r);
}

TEST_F(BenchCliTest, GaussiansHelpDescribesEveryFlag) {
  const CommandResult r = tessera(0, {"bench", "gaussians", "--help"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* flag : {"--count", "--steps", "--warmup", "--views-per-step", "--sh-degree",
                           "--scene", "--preset", "--views", "--size", "--device", "--seed",
                           "--timeout", "median", "peak_bytes_per_rank"})
    EXPECT_TRUE(contains(r.out, flag)) << "help lacks " << flag << "\n" << describe(r);
  const CommandResult list = tessera(0, {"bench", "--help"});
  EXPECT_TRUE(contains(list.out, "gaussians")) << describe(list);
}

// ---- plan --------------------------------------------------------------------------------------

// `tessera plan` predicts what `tessera bench gaussians` measures: the constants it plans with
// must stay those of the code (a step holding 160 more bytes per Gaussian fails this).
TEST_F(BenchCliTest, PlanPredictsTheBenchOnOneAndTwoRanks) {
  const std::string config = source_dir() + "/configs/demo_gaussians.toml";
  ASSERT_TRUE(fs::exists(config)) << config;
  for (const int ranks : {1, 2}) {
    const CommandResult bench = tessera(ranks, {"bench", "gaussians", "--count", "40000", "--steps", "1",
                                                "--warmup", "0", "--size", "48", "--views", "4"});
    ASSERT_EQ(bench.exit_code, 0) << describe(bench);
    const nlohmann::json measured = nlohmann::json::parse(lines_of(bench.out).at(0));
    const CommandResult plan =
        tessera(0, {"plan", config, "--gaussians", "40000", "--ranks", std::to_string(ranks),
                    "--image-size", "48", "--train-views", "0"});
    ASSERT_EQ(plan.exit_code, 0) << describe(plan);
    const std::vector<std::string> lines = lines_of(plan.out);
    ASSERT_EQ(lines.size(), 1u) << describe(plan);
    const nlohmann::json predicted = nlohmann::json::parse(lines[0]);
    for (const char* key : {"count", "ranks", "size", "max_gaussians_per_rank"})
      EXPECT_EQ(predicted.at(key), measured.at(key)) << key << "\n" << lines[0];
    const double peak = measured.at("peak_bytes_per_rank").get<double>();
    EXPECT_NEAR(predicted.at("peak_bytes_per_rank").get<double>(), peak, 0.15 * peak)
        << ranks << " rank(s)\nplan:  " << lines[0] << "\nbench: " << bench.out;
    EXPECT_NEAR(predicted.at("peak_bytes_per_gaussian").get<double>(),
                measured.at("peak_bytes_per_gaussian").get<double>(),
                0.15 * measured.at("peak_bytes_per_gaussian").get<double>());
    // One view per step: its image and gradient, the tile costs, the skip agreement.
    EXPECT_NEAR(predicted.at("allreduce_bytes_per_step").get<double>(),
                measured.at("allreduce_bytes_per_step").get<double>(), 1.0) << lines[0];
    if (ranks == 1) {
      EXPECT_EQ(measured.at("all_to_all_bytes_per_step").get<double>(), 0.0);
      EXPECT_EQ(predicted.at("all_to_all_bytes_per_step").get<double>(), 0.0);
    } else {
      EXPECT_GT(measured.at("all_to_all_bytes_per_step").get<double>(), 0.0) << bench.out;
    }
  }
}

// The largest scene that fits: max_count fits, a few more per rank do not.
TEST_F(BenchCliTest, PlanFindsTheLargestSceneThatFits) {
  const std::string config = source_dir() + "/configs/demo_gaussians.toml";
  const auto plan = [&](const std::string& count) {
    const CommandResult r = tessera(0, {"plan", config, "--gaussians", count, "--ranks", "8",
                                        "--image-size", "1920x1080", "--train-views", "300",
                                        "--gpu-memory", "141GB"});
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    return nlohmann::json::parse(lines_of(r.out).at(0));
  };
  const nlohmann::json first = plan("100M");
  EXPECT_EQ(first.at("count").get<int64_t>(), 100000000);
  EXPECT_EQ(first.at("size").get<int64_t>(), 1920);
  EXPECT_EQ(first.at("height").get<int64_t>(), 1080);
  EXPECT_EQ(first.at("target_cache_bytes").get<int64_t>(), int64_t{300} * 1920 * 1080 * 12);
  const int64_t max_count = first.at("max_count").get<int64_t>();
  ASSERT_GT(max_count, 100000000) << first.dump();
  EXPECT_EQ(max_count % 8, 0);
  const nlohmann::json at_max = plan(std::to_string(max_count));
  EXPECT_TRUE(at_max.at("fits").get<bool>()) << at_max.dump();
  EXPECT_LE(at_max.at("peak_bytes_per_rank").get<double>(), 0.9 * 141e9);
  const nlohmann::json over = plan(std::to_string(max_count + 8 * 16));
  EXPECT_FALSE(over.at("fits").get<bool>()) << over.dump();
}

TEST_F(BenchCliTest, PlanBadInputExits2) {
  const std::string source = source_dir();
  const std::string config = source + "/configs/demo_gaussians.toml";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"plan", config, "--gaussians", "0", "--image-size", "64"}, "--gaussians '0' must be a whole number"},
      {{"plan", config, "--gaussians", "0.6", "--image-size", "64"}, "must be a whole number from 1 to 1e15"},
      {{"plan", config, "--gaussians", "2e15", "--image-size", "64"}, "must be a whole number from 1 to 1e15"},
      {{"plan", config, "--gaussians", "1M", "--image-size", "64", "--gpu-memory", "inf"},
       "at most 1 EB"},
      {{"plan", config, "--gaussians", "ten", "--image-size", "64"}, "is not a number"},
      {{"plan", config, "--gaussians", "10X", "--image-size", "64"}, "the suffix must be k, M or B"},
      {{"plan", config, "--gaussians", "1M", "--image-size", "64y"}, "WIDTHxHEIGHT"},
      {{"plan", config, "--gaussians", "1M", "--image-size", "64", "--gpu-memory", "8 parsecs"},
       "the unit must be"},
      {{"plan", source + "/configs/demo_nerf.toml", "--gaussians", "1M", "--image-size", "64"},
       "the capacity plan is for the gaussians family"},
      {{"plan", config, "--gaussians", "1M", "--ranks", "0", "--image-size", "64"}, "--ranks"},
      {{"plan", temp_dir_ + "/missing.toml", "--gaussians", "1M"}, "missing.toml"},
  };
  for (const auto& [args, message] : cases) {
    const CommandResult r = tessera(0, args);
    EXPECT_EQ(r.exit_code, 2) << describe(r);
    EXPECT_TRUE(r.out.empty()) << describe(r);
    EXPECT_TRUE(contains(r.err, message)) << "expected '" << message << "'\n" << describe(r);
  }
}

TEST_F(BenchCliTest, PlanHelpDescribesEveryFlag) {
  const CommandResult r = tessera(0, {"plan", "--help"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  for (const char* flag : {"--gaussians", "--ranks", "--image-size", "--train-views",
                           "--gpu-memory", "--usable", "--visible", "--ranks-touched", "--set",
                           "peak_bytes_per_rank"})
    EXPECT_TRUE(contains(r.out, flag)) << "help lacks " << flag << "\n" << describe(r);
}

// ---- bench diffusion ---------------------------------------------------------------------------

TEST_F(BenchCliTest, DiffusionPrintsOneJsonLinePerPolicyWithRatiosAgainstNone) {
  const CommandResult r =
      tessera(0, {"bench", "diffusion", "--tokens", "48", "--width", "16", "--depth", "2",
                  "--heads", "2", "--batch", "2", "--steps", "1", "--warmup", "0"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 4u) << describe(r);
  std::map<std::string, nlohmann::json> by_policy;
  for (const std::string& line : lines) {
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(line)) << line;
    EXPECT_EQ(j.at("bench"), "diffusion");
    EXPECT_EQ(j.at("tokens").get<int>(), 48);
    EXPECT_GT(j.at("step_s").get<double>(), 0.0) << line;
    by_policy[j.at("policy").get<std::string>()] = j;
  }
  ASSERT_EQ(by_policy.size(), 4u) << describe(r);
  const nlohmann::json& none = by_policy.at("none");
  EXPECT_DOUBLE_EQ(none.at("time_ratio").get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(none.at("peak_ratio").get<double>(), 1.0);
  // Parameters, gradients and Adam's two moments are part of every peak.
  EXPECT_GE(none.at("peak_bytes").get<int64_t>(), 16 * none.at("parameters").get<int64_t>());
  const nlohmann::json& blocks = by_policy.at("blocks");
  EXPECT_EQ(blocks.at("recomputed_blocks").get<int>(), 2);
  EXPECT_LT(blocks.at("stored_ratio").get<double>(), 0.5) << blocks.dump();
  EXPECT_NEAR(blocks.at("stored_ratio").get<double>(),
              blocks.at("stored_bytes").get<double>() / none.at("stored_bytes").get<double>(), 1e-3);
  EXPECT_LT(by_policy.at("attention").at("stored_ratio").get<double>(), 1.0);
  EXPECT_EQ(by_policy.at("budget").at("recomputed_blocks").get<int>(), 1) << "half the blocks";
  EXPECT_TRUE(contains(r.err, "[bench diffusion]")) << describe(r);
}

TEST_F(BenchCliTest, DiffusionBadSettingsExit2) {
  const CommandResult first = tessera(0, {"bench", "diffusion", "--policies", "blocks,none"});
  EXPECT_EQ(first.exit_code, 2) << describe(first);
  EXPECT_TRUE(contains(first.err, "--policies must start with none")) << describe(first);
  const CommandResult unknown = tessera(0, {"bench", "diffusion", "--policies", "none,segments"});
  EXPECT_EQ(unknown.exit_code, 2) << describe(unknown);
  EXPECT_TRUE(contains(unknown.err, "not one of point-diffusion's")) << describe(unknown);
  const CommandResult heads = tessera(0, {"bench", "diffusion", "--width", "30", "--heads", "4"});
  EXPECT_EQ(heads.exit_code, 2) << describe(heads);
  EXPECT_TRUE(contains(heads.err, "--width must be a multiple of --heads")) << describe(heads);
  const CommandResult help = tessera(0, {"bench", "diffusion", "--help"});
  for (const char* flag : {"--tokens", "--width", "--depth", "--heads", "--batch", "--dropout",
                           "--steps", "--warmup", "--policies", "--budget-mib", "--precision",
                           "--device", "--seed", "--timeout", "peak_ratio"})
    EXPECT_TRUE(contains(help.out, flag)) << "help lacks " << flag << "\n" << describe(help);
}

// ---- bench nerf --precision --------------------------------------------------------------------

TEST_F(BenchCliTest, NerfJsonLinesCarryThePrecision) {
  const CommandResult r =
      tessera(0, {"bench", "nerf", "--cases", "throughput", "--models", "nerf-mlp", "--size", "16",
                  "--views", "4", "--train-rays", "64", "--steps", "1", "--warmup", "0",
                  "--precision", "fp32"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 1u) << describe(r);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j.at("precision"), "fp32") << lines[0];
  EXPECT_GT(j.at("rays_per_s").get<double>(), 0.0) << lines[0];
}

// The checkpoint case: one line per policy with the step split into forward, backward and the
// checkpoints' recomputes, which only the policies that checkpoint have.
TEST_F(BenchCliTest, NerfCheckpointReportsTheRecomputeShare) {
  const CommandResult r =
      tessera(0, {"bench", "nerf", "--cases", "checkpoint", "--size", "16", "--views", "4",
                  "--rays", "128", "--repeats", "1"});
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  std::map<std::string, nlohmann::json> by_policy;
  for (const std::string& line : lines_of(r.out)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    by_policy[j.at("policy").get<std::string>()] = j;
  }
  ASSERT_EQ(by_policy.size(), 4u) << describe(r);
  for (const auto& [policy, j] : by_policy) {
    const double step = j.at("step_s").get<double>();
    const double parts = j.at("forward_s").get<double>() + j.at("backward_s").get<double>() +
                         j.at("recompute_s").get<double>();
    EXPECT_GT(j.at("forward_s").get<double>(), 0.0) << policy;
    EXPECT_GT(j.at("backward_s").get<double>(), 0.0) << policy;
    // Parts of the step's wall time; how much of it they cover depends on the scheduling of
    // oversubscribed ranks, so only the upper bound (the split is PhaseTimer's test).
    EXPECT_LE(parts, step * 1.01) << policy;
    EXPECT_NEAR(j.at("recompute_share").get<double>(), j.at("recompute_s").get<double>() / step,
                1e-3) << policy;
    EXPECT_GT(j.at("vs_none").get<double>(), 0.0) << policy;
  }
  EXPECT_EQ(by_policy.at("none").at("recompute_s").get<double>(), 0.0);
  EXPECT_EQ(by_policy.at("none").at("vs_none").get<double>(), 1.0);
  EXPECT_GT(by_policy.at("segments").at("recompute_s").get<double>(), 0.0);
  EXPECT_LT(by_policy.at("segments").at("recompute_share").get<double>(), 1.0);
  EXPECT_LT(by_policy.at("segments").at("peak_bytes").get<int64_t>(),
            by_policy.at("none").at("peak_bytes").get<int64_t>());
  // nerf-mlp's 3 trunk segments and its heads: every = 1 leaves the heads (the last) kept.
  EXPECT_EQ(by_policy.at("all").at("checkpointed").get<int>(), 4);
  EXPECT_EQ(by_policy.at("segments").at("checkpointed").get<int>(), 3);
  EXPECT_LE(by_policy.at("budget").at("checkpointed").get<int>(), 3);
  EXPECT_TRUE(contains(r.err, "while recomputed")) << "the budget plan on stderr\n" << describe(r);
}

TEST_F(BenchCliTest, NerfFp16OnCpuExits2) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: fp16 would run";
  const CommandResult r = tessera(2, {"bench", "nerf", "--precision", "fp16"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(r.out.empty()) << describe(r);
  EXPECT_EQ(occurrences(r.err, "needs a CUDA device"), 1) << describe(r);
}

TEST_F(BenchCliTest, NerfUnknownPrecisionExits2) {
  const CommandResult r = tessera(0, {"bench", "nerf", "--precision", "fp8"});
  EXPECT_EQ(r.exit_code, 2) << describe(r);
  EXPECT_TRUE(contains(r.err, "--precision")) << describe(r);
}

}  // namespace
}  // namespace tessera
