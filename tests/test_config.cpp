// Tests of the typed config: defaults, parsing, round trip, every error message, --set overrides,
// the families' sections (defaults from their structs, keys a model does not read refused, stored
// configs of earlier versions), and that docs/config.md matches the generated key reference.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "distributed/errors.h"
#include "framework/config.h"
#include "framework/family.h"
#include "models/builtin.h"
#include "models/diffusion/diffusion_config.h"
#include "models/gaussians/gaussian_family.h"
#include "models/nerf/nerf_config.h"
#include "models/nerf/nerf_family.h"
#include "tests/test_util.h"

namespace tessera {
namespace {

using models::gaussians::GaussianConfig;
using models::gaussians::GaussianTrainerOptions;
using models::nerf::NerfConfig;

// The built-in families, registered before any test: their sections are part of the schema.
const FamilyRegistry& families() {
  static const FamilyRegistry registry = [] {
    FamilyRegistry r;
    models::register_builtin_families(r);
    return r;
  }();
  return registry;
}
const bool kFamiliesRegistered = (families(), true);

const char* const kBeginMarker = "<!-- BEGIN GENERATED -->\n";
const char* const kEndMarker = "<!-- END GENERATED -->";

std::string source_dir() {
  const char* dir = std::getenv("TESSERA_SOURCE_DIR");
  return dir && *dir ? dir : ".";
}

using test::error_of;

std::string parse_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(text, "cfg.toml", overrides); });
}

std::string set_error(const std::string& override_text) {
  return error_of([&] { parse_config("", "cfg.toml", {override_text}); });
}

void expect_same(const Config& a, const Config& b) {
  EXPECT_EQ(a.run.name, b.run.name);
  EXPECT_EQ(a.run.out_dir, b.run.out_dir);
  EXPECT_EQ(a.run.seed, b.run.seed);
  EXPECT_EQ(a.run.log_level, b.run.log_level);
  EXPECT_EQ(a.data.path, b.data.path);
  EXPECT_EQ(a.model.name, b.model.name);
  EXPECT_EQ(a.train.steps, b.train.steps);
  EXPECT_EQ(a.distributed.backend, b.distributed.backend);
  EXPECT_EQ(a.distributed.timeout_s, b.distributed.timeout_s);  // exact, not approximate
  EXPECT_EQ(a.distributed.threads, b.distributed.threads);
  EXPECT_EQ(a.distributed.check_agreement, b.distributed.check_agreement);
  EXPECT_EQ(a.distributed.first_bucket_mib, b.distributed.first_bucket_mib);
  EXPECT_EQ(a.distributed.bucket_mib, b.distributed.bucket_mib);
  EXPECT_EQ(a.train.precision, b.train.precision);
  EXPECT_EQ(a.train.log_every, b.train.log_every);
  EXPECT_EQ(a.sampling.schedule, b.sampling.schedule);
  EXPECT_EQ(a.sampling.rate_max, b.sampling.rate_max);
  EXPECT_EQ(a.sampling.rate_min, b.sampling.rate_min);
  EXPECT_EQ(a.sampling.step_every, b.sampling.step_every);
  EXPECT_EQ(a.sampling.step_factor, b.sampling.step_factor);
  EXPECT_EQ(a.sampling.rescale_lr, b.sampling.rescale_lr);
  EXPECT_EQ(a.checkpoint.policy, b.checkpoint.policy);
  EXPECT_EQ(a.checkpoint.segments, b.checkpoint.segments);
  EXPECT_EQ(a.checkpoint.every, b.checkpoint.every);
  EXPECT_EQ(a.checkpoint.budget_mib, b.checkpoint.budget_mib);
  EXPECT_EQ(a.eval.every, b.eval.every);
  EXPECT_EQ(a.eval.split, b.eval.split);
  EXPECT_EQ(a.eval.max_views, b.eval.max_views);
  // Covers keys added later that this list does not name yet (source_path is only a comment).
  Config a_text = a, b_text = b;
  a_text.source_path = b_text.source_path = "";
  EXPECT_EQ(to_toml(a_text), to_toml(b_text));
}

const GaussianConfig& gs_defaults() {
  static const GaussianConfig kDefaults{};
  return kDefaults;
}

const char* const kEveryKey = R"(
[run]
name = "exp-1.a_b"
out_dir = "/scratch/exp1"
seed = 42
log_level = "debug"

[data]
path = "data/lego.h5"

[model]
name = "gaussians"

[train]
steps = 1234

[gaussians]
views_per_step = 3
max_screen_radius = 12.5
lr_means = 3e-4
sh_degree = 2
lr_sqrt_batch = false

[distributed]
backend = "nccl"
timeout_s = 12.5
threads = 8
check_agreement = true
)";

TEST(ConfigDefaults, EmptyTextGivesEveryDefault) {
  const Config c = parse_config("", "text");
  EXPECT_EQ(c.run.name, "run");
  EXPECT_EQ(c.run.out_dir, "runs/run");
  EXPECT_EQ(c.run.seed, 0);
  EXPECT_EQ(c.run.log_level, "info");
  EXPECT_EQ(c.data.path, "");
  EXPECT_EQ(c.model.name, "nerf-hash");
  EXPECT_EQ(c.train.steps, 30000);
  EXPECT_EQ(c.distributed.backend, "auto");
  EXPECT_EQ(c.distributed.timeout_s, 600.0);
  EXPECT_EQ(c.distributed.threads, 0);
  EXPECT_FALSE(c.distributed.check_agreement);
  EXPECT_EQ(c.source_path, "");
}

TEST(ConfigParse, EveryKeyIsRead) {
  const Config c = parse_config(kEveryKey, "text");
  EXPECT_EQ(c.run.name, "exp-1.a_b");
  EXPECT_EQ(c.run.out_dir, "/scratch/exp1");
  EXPECT_EQ(c.run.seed, 42);
  EXPECT_EQ(c.run.log_level, "debug");
  EXPECT_EQ(c.data.path, "data/lego.h5");
  EXPECT_EQ(c.model.name, "gaussians");
  EXPECT_EQ(c.train.steps, 1234);
  const auto& g = c.section<GaussianConfig>();
  EXPECT_EQ(g.views_per_step, 3);
  EXPECT_EQ(g.densify.max_screen_radius, 12.5);
  EXPECT_EQ(g.rates.means_init, 3e-4);
  EXPECT_EQ(g.max_sh_degree, 2);
  EXPECT_FALSE(g.sqrt_batch_lr_scaling);
  EXPECT_EQ(g.densify.densify_every, gs_defaults().densify.densify_every);  // untouched
  EXPECT_EQ(c.distributed.backend, "nccl");
  EXPECT_EQ(c.distributed.timeout_s, 12.5);
  EXPECT_EQ(c.distributed.threads, 8);
  EXPECT_TRUE(c.distributed.check_agreement);
}

TEST(ConfigToml, RoundTripsEveryKey) {
  for (const std::string& text : {std::string(""), std::string(kEveryKey)}) {
    const Config c = parse_config(text, "text");
    expect_same(parse_config(to_toml(c), "resolved"), c);
  }
}

TEST(ConfigToml, RoundTripsAwkwardStringsAndFloats) {
  Config c = parse_config("", "text");
  c.data.path = "dir with \"quotes\"\\back\tslash\nnewline \x01 caf\xC3\xA9.h5";
  c.run.out_dir = "'single' # not a comment";
  for (const double timeout : {0.1, 1e-300, 1.0 / 3.0, 86400.0, 600.0, 2.5e-7}) {
    c.distributed.timeout_s = timeout;
    expect_same(parse_config(to_toml(c), "resolved"), c);
  }
}

TEST(ConfigToml, MentionsSourceOnlyInAComment) {
  const std::string path = ::testing::TempDir() + "/roundtrip_src.toml";
  std::ofstream(path) << "[train]\nsteps = 7\n";
  const Config c = load_config(path);
  const std::string text = to_toml(c);
  const std::string comment = "# Resolved Tessera config, loaded from \"" + path + "\"";
  EXPECT_NE(text.find(comment), std::string::npos) << text;
  const Config back = parse_config(text, "resolved");
  expect_same(back, c);
  EXPECT_EQ(back.source_path, "");
  std::remove(path.c_str());
}

TEST(ConfigFile, DemoConfigLoads) {
  const std::string path = source_dir() + "/configs/demo_nerf.toml";
  const Config c = load_config(path);
  EXPECT_EQ(c.run.name, "demo_nerf");
  EXPECT_EQ(c.run.out_dir, "runs/demo_nerf");
  EXPECT_EQ(c.model.name, "nerf-hash");
  EXPECT_EQ(c.data.path, "runs/demo_scene.h5");
  EXPECT_EQ(c.train.steps, 800);
  EXPECT_EQ(c.section<NerfConfig>().rays_per_step, 2048);
  EXPECT_EQ(c.eval.max_views, 2);
  EXPECT_EQ(c.source_path, path);
}

// Every config the project ships loads and passes its model's own checks (what `tessera train`
// runs before MPI), so that launch/demo and the README's commands start.
TEST(ConfigFile, EveryShippedConfigLoadsAndPassesItsModelsChecks) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(source_dir() + "/configs")) {
    if (entry.path().extension() != ".toml") continue;
    const std::string path = entry.path().string();
    SCOPED_TRACE(path);
    Config c;
    ASSERT_NO_THROW(c = load_config(path)) << error_of([&] { load_config(path); });
    const FamilyInfo& family = families().get(c.model.name, path);
    if (family.check_config) {
      EXPECT_NO_THROW(family.check_config(c));
    }
    ++count;
  }
  EXPECT_GE(count, 5) << "demo_nerf, demo_gaussians, demo_diffusion, capture_nerf, capture_gaussians";
}

TEST(ConfigFile, DemoDiffusionConfigTrainsPointDiffusionOnTheDemoShapes) {
  const Config c = load_config(source_dir() + "/configs/demo_diffusion.toml");
  EXPECT_EQ(c.model.name, "point-diffusion");
  EXPECT_EQ(c.data.path, "runs/demo_shapes.h5");
  EXPECT_EQ(c.eval.split, "test");
  EXPECT_EQ(c.section<models::diffusion::DiffusionConfig>().sampler, "ddpm");
}

TEST(ConfigFile, NameDefaultsToFileStem) {
  const std::string path = ::testing::TempDir() + "/my_scene-v2.toml";
  std::ofstream(path) << "[train]\nsteps = 10\n";
  const Config c = load_config(path);
  EXPECT_EQ(c.run.name, "my_scene-v2");
  EXPECT_EQ(c.run.out_dir, "runs/my_scene-v2");
  std::remove(path.c_str());
}

TEST(ConfigFile, StemThatIsNotARunNameAsksForAnExplicitName) {
  const std::string path = ::testing::TempDir() + "/bad stem.toml";
  std::ofstream(path) << "";
  const std::string msg = error_of([&] { load_config(path); });
  EXPECT_EQ(msg.rfind(path + ": key 'run.name' = \"bad stem\" is invalid", 0), 0u) << msg;
  EXPECT_NE(msg.find("set 'run.name' explicitly"), std::string::npos) << msg;
  EXPECT_EQ(load_config(path, {"run.name=ok"}).run.name, "ok");
  std::remove(path.c_str());
}

TEST(ConfigFile, MissingFileNamesPathAndReason) {
  EXPECT_EQ(error_of([] { load_config("/nonexistent/x.toml"); }),
            "/nonexistent/x.toml: cannot read config file (No such file or directory)");
  EXPECT_EQ(error_of([] { load_config(::testing::TempDir()); }),
            ::testing::TempDir() + ": cannot read config file (Is a directory)");
}

TEST(ConfigErrors, UnknownKeySuggestsClosestWithLine) {
  EXPECT_EQ(parse_error("[run]\nseed = 1\n\n[train]\nstpes = 3\n"),
            "cfg.toml:5: unknown key 'train.stpes' (did you mean 'train.steps'?)");
  EXPECT_EQ(parse_error("[distributed]\ncheck_agrement = true\n"),
            "cfg.toml:2: unknown key 'distributed.check_agrement' "
            "(did you mean 'distributed.check_agreement'?)");
  // The right key in the wrong section.
  EXPECT_EQ(parse_error("[run]\nsteps = 3\n"),
            "cfg.toml:2: unknown key 'run.steps' (did you mean 'train.steps'?)");
}

TEST(ConfigErrors, UnknownKeyFarFromAnyListsTheSectionsKeys) {
  EXPECT_EQ(parse_error("[distributed]\nwhatever = 1\n"),
            "cfg.toml:2: unknown key 'distributed.whatever' "
            "(known keys in [distributed]: backend, timeout_s, heartbeat_s, threads, check_agreement, "
            "first_bucket_mib, bucket_mib)");
}

TEST(ConfigErrors, UnknownSectionListsKnownSections) {
  const std::string known =
      "known sections: run, data, model, train, sampling, checkpoint, snapshot, eval, distributed, "
      "nerf, gaussians, diffusion";
  EXPECT_EQ(parse_error("\n[trian]\nsteps = 1\n"),
            "cfg.toml:2: unknown section 'trian' (did you mean 'train'?); " + known);
  EXPECT_EQ(parse_error("[optimizer]\n"), "cfg.toml:1: unknown section 'optimizer'; " + known);
}

TEST(ConfigErrors, ProblemsAreAllReportedInFileOrder) {
  const std::string msg = parse_error("[train]\nsteps = 0\n[run]\nzzz = 1\nseed = -1\n");
  EXPECT_EQ(msg,
            "cfg.toml:2: key 'train.steps' = 0 is out of range [1, 1000000000]\n"
            "cfg.toml:4: unknown key 'run.zzz' (known keys in [run]: name, out_dir, seed, "
            "log_level, verbose, tensorboard, deterministic)\n"
            "cfg.toml:5: key 'run.seed' = -1 is out of range (must be >= 0)");
}

TEST(ConfigErrors, WrongTypeNamesKeyAndBothTypes) {
  EXPECT_EQ(parse_error("[train]\nsteps = \"many\"\n"),
            "cfg.toml:2: key 'train.steps' must be an integer, got string");
  EXPECT_EQ(parse_error("[distributed]\ncheck_agreement = 1\n"),
            "cfg.toml:2: key 'distributed.check_agreement' must be a boolean, got integer");
  EXPECT_EQ(parse_error("[run]\nname = 3\n"),
            "cfg.toml:2: key 'run.name' must be a string, got integer");
  EXPECT_EQ(parse_error("[distributed]\ntimeout_s = \"10\"\n"),
            "cfg.toml:2: key 'distributed.timeout_s' must be a float, got string");
}

TEST(ConfigErrors, FloatIsNeverAnInteger) {
  EXPECT_EQ(parse_error("[train]\nsteps = 100.0\n"),
            "cfg.toml:2: key 'train.steps' must be an integer, got float");
  EXPECT_EQ(parse_error("[train]\nsteps = 1e3\n"),
            "cfg.toml:2: key 'train.steps' must be an integer, got float");
}

TEST(ConfigErrors, IntegerIsAcceptedAsFloat) {
  const Config c = parse_config("[distributed]\ntimeout_s = 30\n", "text");
  EXPECT_EQ(c.distributed.timeout_s, 30.0);
}

TEST(ConfigErrors, OutOfRangeAtBothEnds) {
  EXPECT_EQ(parse_error("[train]\nsteps = 0\n"),
            "cfg.toml:2: key 'train.steps' = 0 is out of range [1, 1000000000]");
  EXPECT_EQ(parse_error("[train]\nsteps = 1000000001\n"),
            "cfg.toml:2: key 'train.steps' = 1000000001 is out of range [1, 1000000000]");
  EXPECT_EQ(parse_error("[distributed]\ntimeout_s = 0.0\n"),
            "cfg.toml:2: key 'distributed.timeout_s' = 0.0 is out of range (0, 86400]");
  EXPECT_EQ(parse_error("[distributed]\ntimeout_s = 86400.5\n"),
            "cfg.toml:2: key 'distributed.timeout_s' = 86400.5 is out of range (0, 86400]");
  EXPECT_EQ(parse_error("[distributed]\ntimeout_s = nan\n"),
            "cfg.toml:2: key 'distributed.timeout_s' = nan is out of range (0, 86400]");
  EXPECT_EQ(parse_error("[distributed]\nthreads = -2\n"),
            "cfg.toml:2: key 'distributed.threads' = -2 is out of range (must be >= 0)");
  // The bounds themselves are inside.
  const Config lo = parse_config("[train]\nsteps = 1\n", "text");
  EXPECT_EQ(lo.train.steps, 1);
  const Config hi =
      parse_config("[train]\nsteps = 1000000000\n[distributed]\ntimeout_s = 86400\n", "text");
  EXPECT_EQ(hi.train.steps, 1000000000);
  EXPECT_EQ(hi.distributed.timeout_s, 86400.0);
}

TEST(ConfigErrors, BadChoiceListsTheChoices) {
  EXPECT_EQ(parse_error("[distributed]\nbackend = \"foo\"\n"),
            "cfg.toml:2: key 'distributed.backend' must be one of auto, mpi, nccl; got 'foo'");
  EXPECT_EQ(parse_error("[run]\nlog_level = \"INFO\"\n"),
            "cfg.toml:2: key 'run.log_level' must be one of trace, debug, info, warn, error; "
            "got 'INFO'");
}

TEST(ConfigErrors, BadRunNameAndEmptyOutDir) {
  EXPECT_EQ(parse_error("[run]\nname = \"a/b\"\n"),
            "cfg.toml:2: key 'run.name' = \"a/b\" is invalid: use only letters, digits, '.', "
            "'_' and '-'");
  EXPECT_EQ(parse_error("[run]\nname = \"\"\n"),
            "cfg.toml:2: key 'run.name' = \"\" is invalid: it must not be empty");
  EXPECT_EQ(parse_error("[run]\nname = \"..\"\n"),
            "cfg.toml:2: key 'run.name' = \"..\" is invalid: '.' and '..' are not run names");
  EXPECT_EQ(parse_error("[run]\nout_dir = \"\"\n"),
            "cfg.toml:2: key 'run.out_dir' = \"\" is invalid: it must not be empty");
}

TEST(ConfigErrors, SyntaxErrorHasLineAndColumn) {
  const std::string msg = parse_error("[train]\nsteps = 3\nseed = = 4\n");
  EXPECT_EQ(msg.rfind("cfg.toml:3:", 0), 0u) << msg;
  EXPECT_NE(msg.find(": TOML syntax error: "), std::string::npos) << msg;
  EXPECT_EQ(parse_error("[train\n").rfind("cfg.toml:1:", 0), 0u);
}

TEST(ConfigErrors, NestingArraysAndTopLevelKeysNameTheKey) {
  EXPECT_EQ(parse_error("[train.steps]\nx = 1\n"),
            "cfg.toml:1: key 'train.steps' must be an integer, got table "
            "(tables nest no deeper than section.key)");
  EXPECT_EQ(parse_error("[run]\nname.first = \"a\"\n"),
            "cfg.toml:2: key 'run.name' must be a string, got table "
            "(tables nest no deeper than section.key)");
  EXPECT_EQ(parse_error("[train]\nsteps = [1, 2]\n"),
            "cfg.toml:2: key 'train.steps' must be an integer, got array");
  EXPECT_EQ(parse_error("steps = 5\n"),
            "cfg.toml:1: key 'steps' is outside any section; put it under a [section] "
            "(did you mean 'train.steps'?)");
  EXPECT_EQ(parse_error("train = 5\n"),
            "cfg.toml:1: section 'train' must be a table ([train]), got integer");
  EXPECT_EQ(parse_error("[[train]]\nsteps = 5\n"),
            "cfg.toml:1: section 'train' must be a table ([train]), got array");
}

TEST(ConfigSections, EmptySectionsTakeDefaultsAndUnknownKeysListTheKnownOnes) {
  const Config c = parse_config("[sampling]\n[checkpoint]\n[snapshot]\n[eval]\n", "text");
  EXPECT_EQ(c.train.steps, 30000);
  EXPECT_EQ(c.sampling.schedule, "constant");
  EXPECT_EQ(c.checkpoint.policy, "none");
  EXPECT_EQ(c.snapshot.every, 1000);
  EXPECT_EQ(c.snapshot.keep, 3);
  EXPECT_TRUE(c.snapshot.parallel);
  EXPECT_EQ(c.eval.split, "val");
  EXPECT_EQ(parse_error("[snapshot]\nrate = 1\n"),
            "cfg.toml:2: unknown key 'snapshot.rate' (known keys in [snapshot]: every, keep, "
            "parallel)");
}

TEST(ConfigOverrides, ValuesOfEveryKind) {
  const Config c = parse_config(kEveryKey, "text",
                                {"train.steps=500", "run.name=other", "run.log_level=\"warn\"",
                                 "run.out_dir=/tmp/run", "distributed.check_agreement=false",
                                 "distributed.timeout_s=7", "data.path = a b.h5"});
  EXPECT_EQ(c.train.steps, 500);
  EXPECT_EQ(c.run.name, "other");
  EXPECT_EQ(c.run.log_level, "warn");
  EXPECT_EQ(c.run.out_dir, "/tmp/run");
  EXPECT_FALSE(c.distributed.check_agreement);
  EXPECT_EQ(c.distributed.timeout_s, 7.0);
  EXPECT_EQ(c.data.path, "a b.h5");
  EXPECT_EQ(c.run.seed, 42);  // untouched keys keep the file's value
}

TEST(ConfigOverrides, QuotedStringsAndStringsThatLookLikeOtherTypes) {
  const Config c = parse_config("", "text",
                                {"run.name=\"quoted\"", "model.name=2024", "data.path=\"=x=\""});
  EXPECT_EQ(c.run.name, "quoted");
  EXPECT_EQ(c.model.name, "2024");
  EXPECT_EQ(c.data.path, "=x=");
}

TEST(ConfigOverrides, KeyAbsentFromFileAndLaterOverridesWin) {
  const Config c = parse_config("[run]\nseed = 1\n", "text",
                                {"distributed.threads=3", "run.seed=5", "run.seed=6"});
  EXPECT_EQ(c.distributed.threads, 3);
  EXPECT_EQ(c.run.seed, 6);
}

TEST(ConfigOverrides, BadKeyIsReportedWithTheOverride) {
  EXPECT_EQ(set_error("train.stpes=3"),
            "--set train.stpes=3: unknown key 'train.stpes' (did you mean 'train.steps'?)");
  EXPECT_EQ(set_error("trian.steps=3").rfind(
                "--set trian.steps=3: unknown section 'trian' (did you mean 'train'?)", 0),
            0u);
  EXPECT_EQ(set_error("steps=3"),
            "--set steps=3: key 'steps' is outside any section; put it under a [section] "
            "(did you mean 'train.steps'?)");
  EXPECT_EQ(set_error("train.steps.x=3"),
            "--set train.steps.x=3: key 'train.steps.x' must be section.key "
            "(one level of nesting)");
}

TEST(ConfigOverrides, BadValueIsReportedWithTheOverride) {
  EXPECT_EQ(set_error("train.steps=abc"),
            "--set train.steps=abc: key 'train.steps' must be an integer, got string");
  EXPECT_EQ(set_error("train.steps=2.5"),
            "--set train.steps=2.5: key 'train.steps' must be an integer, got float");
  EXPECT_EQ(set_error("train.steps=0"),
            "--set train.steps=0: key 'train.steps' = 0 is out of range [1, 1000000000]");
  EXPECT_EQ(set_error("distributed.check_agreement=yes"),
            "--set distributed.check_agreement=yes: key 'distributed.check_agreement' must be "
            "a boolean, got string");
  EXPECT_EQ(set_error("distributed.backend=gloo"),
            "--set distributed.backend=gloo: key 'distributed.backend' must be one of auto, mpi, "
            "nccl; got 'gloo'");
}

TEST(ConfigOverrides, MalformedOverride) {
  EXPECT_EQ(set_error("train.steps"),
            "--set train.steps: expected section.key=value (missing '=')");
  EXPECT_EQ(set_error("=5"), "--set =5: empty key; expected section.key=value");
  // File problems come first, then override problems in order.
  EXPECT_EQ(parse_error("[train]\nsteps = 0\n", {"x", "run.seed=-1"}),
            "cfg.toml:2: key 'train.steps' = 0 is out of range [1, 1000000000]\n"
            "--set x: expected section.key=value (missing '=')\n"
            "--set run.seed=-1: key 'run.seed' = -1 is out of range (must be >= 0)");
}

TEST(ConfigOutDir, DefaultFollowsRunName) {
  EXPECT_EQ(parse_config("[run]\nname = \"lego\"\n", "text").run.out_dir, "runs/lego");
  EXPECT_EQ(parse_config("[run]\nname = \"lego\"\n", "text", {"run.name=chair"}).run.out_dir,
            "runs/chair");
  EXPECT_EQ(parse_config("", "text", {"run.name=chair"}).run.out_dir, "runs/chair");
  // An explicit out_dir is kept whatever the name.
  EXPECT_EQ(parse_config("[run]\nout_dir = \"o\"\n", "text", {"run.name=chair"}).run.out_dir,
            "o");
}

// ---- The families' sections ---------------------------------------------------------------------

TEST(ConfigFamilies, DefaultsAreTheOptionStructsInitializers) {
  const Config parsed = parse_config("", "text");
  const Config in_code;  // a Config built in code holds no section: the struct's defaults
  for (const Config* c : {&parsed, &in_code}) {
    const NerfConfig& n = c->section<NerfConfig>();
    EXPECT_EQ(n.hash.levels, models::nerf::NerfHashOptions{}.levels);
    EXPECT_EQ(n.hash.finest_resolution, models::nerf::NerfHashOptions{}.finest_resolution);
    EXPECT_EQ(n.mlp.width, models::nerf::NerfMlpOptions{}.width);
    EXPECT_EQ(n.rays_per_step, 4096);
    const auto& g = c->section<GaussianConfig>();
    EXPECT_EQ(g.densify.max_screen_radius, 20.0);  // INRIA's
    EXPECT_EQ(g.densify.percent_dense, 0.01);
    EXPECT_EQ(g.rates.means_init, 1.6e-4);
    EXPECT_EQ(g.sh_degree_interval, 1000);
  }
  // The reference prints the same defaults (a float key's shortest text).
  const std::string md = config_reference_markdown();
  EXPECT_NE(md.find("| `nerf.hash_levels` | integer | `12` |"), std::string::npos) << md;
  EXPECT_NE(md.find("| `gaussians.max_screen_radius` | float | `20.0` |"), std::string::npos);
  EXPECT_NE(md.find("| `nerf.distortion_weight` | float | `0.0` |"), std::string::npos);
}

TEST(ConfigFamilies, EveryHyperparameterReachesTheFamilysOptions) {
  const Config g = parse_config("[model]\nname = \"gaussians\"\n", "text",
                                {"gaussians.lr_means=3.2e-4", "gaussians.lr_means_final=2e-6",
                                 "gaussians.lr_scales=0.004", "gaussians.lr_opacities=0.025",
                                 "gaussians.percent_dense=0.02", "gaussians.min_opacity=0.01",
                                 "gaussians.max_screen_radius=30", "gaussians.ssim_weight=0.3",
                                 "gaussians.densify_grad_threshold=3e-4", "run.seed=9"});
  const GaussianTrainerOptions o = models::gaussians::gaussian_trainer_options(g);
  EXPECT_EQ(o.rates.means_init, 3.2e-4);
  EXPECT_EQ(o.rates.means_final, 2e-6);
  EXPECT_EQ(o.rates.scales, 0.004);
  EXPECT_EQ(o.rates.opacities, 0.025);
  EXPECT_EQ(o.densify.percent_dense, 0.02);
  EXPECT_EQ(o.densify.prune_opacity, 0.01);
  EXPECT_EQ(o.densify.max_screen_radius, 30.0);
  EXPECT_EQ(o.densify.grad_threshold, 3e-4);
  EXPECT_EQ(o.ssim_weight, 0.3);
  EXPECT_EQ(o.densify.seed, 9u);  // from [run], not the section
  EXPECT_EQ(o.steps, 30000);

  const Config n = parse_config("[model]\nname = \"nerf-mlp\"\n[nerf]\nmlp_width = 64\n"
                                "mlp_layers = 6\nmlp_skip_layer = 3\nrays_per_step = 1024\n"
                                "lr = 5e-3\nbackground = \"dataset\"\n", "text");
  EXPECT_EQ(n.section<NerfConfig>().mlp.width, 64);
  EXPECT_EQ(n.section<NerfConfig>().mlp.layers, 6);
  EXPECT_EQ(n.section<NerfConfig>().mlp.skip_layer, 3);
  const models::nerf::RayTrainerOptions t = models::nerf::trainer_options(n);
  EXPECT_EQ(t.nerf.rays_per_step, 1024);
  EXPECT_EQ(t.nerf.lr, 5e-3);
  EXPECT_EQ(lr_schedule_options(t.nerf, t.steps).lr, 5e-3);
  EXPECT_EQ(t.nerf.background, "dataset");
}

TEST(ConfigFamilies, AKeyTheModelDoesNotReadIsRefusedByName) {
  // Another family's key, in the file and by --set.
  EXPECT_EQ(parse_error("[model]\nname = \"gaussians\"\n[nerf]\nrays_per_step = 512\n"),
            "cfg.toml:4: key 'nerf.rays_per_step' is not read by model 'gaussians' (only by "
            "nerf-hash, nerf-mlp); remove it, or set model.name to a model that reads it");
  EXPECT_EQ(parse_error("[model]\nname = \"gaussians\"\n", {"nerf.lr=0.1"}),
            "--set nerf.lr=0.1: key 'nerf.lr' is not read by model 'gaussians' (only by "
            "nerf-hash, nerf-mlp); remove it, or set model.name to a model that reads it");
  EXPECT_EQ(parse_error("[gaussians]\nviews_per_step = 2\n"),  // model.name defaults to nerf-hash
            "cfg.toml:2: key 'gaussians.views_per_step' is not read by model 'nerf-hash' (only by "
            "gaussians); remove it, or set model.name to a model that reads it");
  // One model's key in the shared section of its family.
  EXPECT_EQ(parse_error("[nerf]\nmlp_width = 64\n"),
            "cfg.toml:2: key 'nerf.mlp_width' is not read by model 'nerf-hash' (only by "
            "nerf-mlp); remove it, or set model.name to a model that reads it");
  // An opt-in framework key the family does not declare (FamilyInfo::shared_keys).
  EXPECT_EQ(parse_error("[model]\nname = \"gaussians\"\n[checkpoint]\nsegments = \"a\"\n"),
            "cfg.toml:4: key 'checkpoint.segments' is not read by model 'gaussians' (only by "
            "nerf-hash, nerf-mlp); remove it, or set model.name to a model that reads it");
  // The third family's section, and a framework key it does not read.
  EXPECT_EQ(parse_error("[model]\nname = \"point-diffusion\"\n[sampling]\nschedule = \"step\"\n"),
            "cfg.toml:4: key 'sampling.schedule' is not read by model 'point-diffusion' (only by "
            "nerf-hash, nerf-mlp, gaussians); remove it, or set model.name to a model that reads "
            "it");
  EXPECT_EQ(parse_config("[model]\nname = \"point-diffusion\"\n[diffusion]\nwidth = 64\n", "t")
                .section<models::diffusion::DiffusionConfig>().width,
            64);
  // The model an override chooses decides.
  EXPECT_NE(parse_error("[nerf]\nlr = 0.02\n", {"model.name=gaussians"})
                .find("cfg.toml:2: key 'nerf.lr' is not read by model 'gaussians'"),
            std::string::npos);
  // An empty section of another family sets nothing.
  EXPECT_EQ(parse_config("[model]\nname = \"gaussians\"\n[nerf]\n", "text").model.name,
            "gaussians");
}

TEST(ConfigFamilies, ChecksAcrossKeysNameThem) {
  const Config mlp = parse_config("[model]\nname = \"nerf-mlp\"\n[nerf]\nmlp_layers = 4\n"
                                  "mlp_skip_layer = 4\n", "cfg.toml");
  EXPECT_EQ(error_of([&] { families().get("nerf-mlp", "t").check_config(mlp); }),
            "nerf.mlp_skip_layer (4) must be less than nerf.mlp_layers (4)");
  const Config hash = parse_config("[nerf]\nhash_base_resolution = 64\nhash_max_resolution = 32\n",
                                   "cfg.toml");
  EXPECT_EQ(error_of([&] { families().get("nerf-hash", "t").check_config(hash); }),
            "nerf.hash_max_resolution (32) must be at least nerf.hash_base_resolution (64)");
}

// A family declares the opt-in framework keys it reads: only those, and only opt-in ones (the
// run's own keys every model reads).
TEST(ConfigFamilies, SharedKeysAreOptInFrameworkKeys) {
  auto info = [](const std::string& name, std::vector<std::string> shared) {
    FamilyInfo f;
    f.name = name;
    f.create = [](const FamilyContext&) -> std::unique_ptr<ModelFamily> { return nullptr; };
    f.shared_keys = std::move(shared);
    return f;
  };
  FamilyRegistry registry;
  EXPECT_THROW(registry.add(info("t-steps", {"train.steps"})), std::logic_error);
  EXPECT_THROW(registry.add(info("t-nerf", {"nerf.lr"})), std::logic_error);
  EXPECT_THROW(registry.add(info("t-none", {"checkpoint.nonexistent"})), std::logic_error);
  FamilyInfo choices = info("t-choices", {"sampling"});
  choices.key_choices = {{"checkpoint.policy", {"none"}}};  // a key it does not read
  EXPECT_THROW(registry.add(std::move(choices)), std::logic_error);
  EXPECT_FALSE(registry.contains("t-steps"));  // refused before it joined the schema
  // A section's name declares all its opt-in keys; the run's keys need no declaration.
  const Config nerf = parse_config("", "cfg.toml", {"sampling.rate_min=0.5", "train.steps=7"});
  EXPECT_EQ(nerf.sampling.rate_min, 0.5);
  EXPECT_EQ(nerf.train.steps, 7);
  EXPECT_NE(parse_error("", {"model.name=point-diffusion", "sampling.rate_min=0.5"})
                .find("key 'sampling.rate_min' is not read by model 'point-diffusion'"),
            std::string::npos);
}

// A family lists the checkpoint policies it implements (FamilyInfo::key_choices); the config
// refuses any other at load, naming that model's, and the reference lists each model's.
TEST(ConfigFamilies, CheckpointPolicyIsOneOfTheModelsOwn) {
  families();
  const std::string gaussians = error_of([] {
    parse_config("[model]\nname = \"gaussians\"\n[checkpoint]\npolicy = \"segments\"\n",
                 "cfg.toml");
  });
  EXPECT_NE(gaussians.find("cfg.toml:4"), std::string::npos) << gaussians;
  EXPECT_NE(gaussians.find("key 'checkpoint.policy' = \"segments\" is not one of model "
                           "'gaussians''s: none, budget"),
            std::string::npos) << gaussians;
  const std::string nerf = error_of([] {
    parse_config("", "cfg.toml", {"model.name=nerf-mlp", "checkpoint.policy=blocks"});
  });
  EXPECT_NE(nerf.find("is not one of model 'nerf-mlp''s: none, segments, budget"),
            std::string::npos) << nerf;
  EXPECT_EQ(parse_config("[model]\nname = \"point-diffusion\"\n[checkpoint]\n"
                         "policy = \"attention\"\n", "cfg.toml").checkpoint.policy,
            "attention");
  const std::string reference = config_reference_markdown();
  EXPECT_NE(reference.find("gaussians: `none`, `budget`"), std::string::npos);
  EXPECT_NE(reference.find("nerf-hash: `none`, `segments`, `budget`"), std::string::npos);
}

TEST(ConfigFamilies, ResolvedTomlHoldsOnlyWhatTheModelReadsAndRoundTrips) {
  for (const char* model : {"nerf-hash", "nerf-mlp", "gaussians"}) {
    std::vector<std::string> sets = {std::string("model.name=") + model};
    if (std::string(model) == "gaussians") sets.push_back("gaussians.lr_quats=2e-3");
    if (std::string(model) == "nerf-mlp") sets.push_back("nerf.mlp_samples_per_ray=32");
    if (std::string(model) == "nerf-hash") sets.push_back("nerf.distortion_weight=0.002");
    const Config c = parse_config("", "text", sets);
    const std::string text = to_toml(c);
    const bool gaussians = std::string(model) == "gaussians";
    EXPECT_EQ(text.find("\n[nerf]\n") != std::string::npos, !gaussians) << text;
    EXPECT_EQ(text.find("\n[gaussians]\n") != std::string::npos, gaussians) << text;
    EXPECT_EQ(text.find("\nsegments = ") != std::string::npos, !gaussians) << text;
    EXPECT_EQ(text.find("\nhash_levels = ") != std::string::npos, std::string(model) == "nerf-hash");
    EXPECT_EQ(text.find("\nmlp_width = ") != std::string::npos, std::string(model) == "nerf-mlp");
    const Config back = parse_config(text, "resolved");  // strict: every key written is read
    expect_same(back, c);
    if (gaussians) {
      EXPECT_EQ(back.section<GaussianConfig>().rates.quats, 2e-3);
    } else {
      EXPECT_EQ(back.section<NerfConfig>().mlp.samples_per_ray, c.section<NerfConfig>().mlp.samples_per_ray);
      EXPECT_EQ(back.section<NerfConfig>().hash.distortion_weight,
                c.section<NerfConfig>().hash.distortion_weight);
    }
  }
  // A float field keeps its value through the text (0.002f is not the double 0.002).
  const Config hash = parse_config("[nerf]\ndistortion_weight = 0.002\n", "text");
  EXPECT_EQ(hash.section<NerfConfig>().hash.distortion_weight, 0.002f);
  EXPECT_NE(to_toml(hash).find("\ndistortion_weight = 0.002\n"), std::string::npos);
}

// Snapshots written before the families had sections store every key of every model in [model]
// and [train]; such a stored config still restores its run (tessera eval/render/export/resume).
TEST(ConfigFamilies, StoredConfigOfAnEarlierVersionRestores) {
  const std::string nerf_run =
      "[run]\nname = \"old\"\n[model]\nname = \"nerf-hash\"\nhash_levels = 13\n"
      "march_steps = 300\nviews_per_step = 1\ndensify_from = 500\n"
      "[train]\nsteps = 50\nrays_per_step = 1024\nlr = 0.005\nbackground = \"dataset\"\n"
      "[checkpoint]\nsegments = \"\"\n";
  const Config n = parse_stored_config(nerf_run, "old.h5 (stored config)");
  EXPECT_EQ(n.section<NerfConfig>().hash.levels, 13);
  EXPECT_EQ(n.section<NerfConfig>().hash.steps_per_diagonal, 300);
  EXPECT_EQ(n.section<NerfConfig>().rays_per_step, 1024);
  EXPECT_EQ(n.section<NerfConfig>().lr, 0.005);
  EXPECT_EQ(n.section<NerfConfig>().background, "dataset");
  EXPECT_EQ(n.train.steps, 50);
  const std::string gaussians_run =
      "[model]\nname = \"gaussians\"\nhash_levels = 12\ndensify_from = 7\nviews_per_step = 2\n"
      "[train]\nsteps = 40\nrays_per_step = 4096\nlr = 0.01\nadam_eps = 1e-15\n"
      "[checkpoint]\nsegments = \"\"\nevery = 0\n[distributed]\nbucket_mib = 25.0\n";
  const Config g = parse_stored_config(gaussians_run, "old.h5 (stored config)");
  EXPECT_EQ(g.section<GaussianConfig>().densify.densify_from, 7);
  EXPECT_EQ(g.section<GaussianConfig>().views_per_step, 2);
  EXPECT_EQ(g.section<GaussianConfig>().rates.adam_eps, 1e-15);
  EXPECT_EQ(parse_config(to_toml(g), "resolved").section<GaussianConfig>().views_per_step, 2);
  // The user's overrides on a stored config are checked as strictly as ever.
  const std::string msg = error_of([&] {
    parse_stored_config(gaussians_run, "old.h5 (stored config)", {"nerf.rays_per_step=8"});
  });
  EXPECT_NE(msg.find("--set nerf.rays_per_step=8: key 'nerf.rays_per_step' is not read by model "
                     "'gaussians'"), std::string::npos) << msg;
  // A plain parse of the same text refuses what it does not know.
  EXPECT_NE(error_of([&] { parse_config(gaussians_run, "cfg.toml"); })
                .find("cfg.toml:3: unknown key 'model.hash_levels' (did you mean 'nerf.hash_levels'?)"),
            std::string::npos);
}

// docs/config.md embeds config_reference_markdown() between the GENERATED markers.
// TESSERA_UPDATE_DOCS=1 rewrites that block instead of checking it.
TEST(ConfigReference, DocsConfigMdIsInSync) {
  const std::string path = source_dir() + "/docs/config.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path << " (set TESSERA_SOURCE_DIR to the repository root)";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string doc = buffer.str();
  const size_t begin = doc.find(kBeginMarker);
  const size_t end = doc.find(kEndMarker);
  ASSERT_NE(begin, std::string::npos) << path << " lacks the line " << kBeginMarker;
  ASSERT_NE(end, std::string::npos) << path << " lacks the line " << kEndMarker;
  ASSERT_LT(begin, end);
  const size_t body = begin + std::string(kBeginMarker).size();
  const std::string expected = config_reference_markdown();
  if (const char* update = std::getenv("TESSERA_UPDATE_DOCS"); update && *update) {
    std::ofstream(path) << doc.substr(0, body) << expected << doc.substr(end);
    return;
  }
  EXPECT_EQ(doc.substr(body, end - body), expected)
      << path << " is out of date with the config schema (framework/config_schema.cpp). "
      << "Regenerate it with: TESSERA_UPDATE_DOCS=1 TESSERA_SOURCE_DIR=<repo root> test_config "
         "--gtest_filter=ConfigReference.*";
}

TEST(ConfigReference, ListsEverySectionAndKey) {
  const std::string md = config_reference_markdown();
  for (const char* needle : {"## [run]", "## [sampling]", "## [distributed]", "## [nerf]",
                             "## [gaussians]", "Read by `nerf-hash`, `nerf-mlp`.",
                             "Read by: nerf-hash.", "Read by: nerf-mlp.",
                             "`gaussians.lr_means`", "`gaussians.percent_dense`", "`run.name`",
                             "`train.steps`", "`distributed.check_agreement`", "`30000`",
                             "`[1, 1000000000]`", "`(0, 86400]`", "`auto`, `mpi`, `nccl`"}) {
    EXPECT_NE(md.find(needle), std::string::npos) << needle;
  }
}

}  // namespace
}  // namespace tessera
