// `tessera train` end to end in new processes under mpiexec: snapshots and resume (docs/training_loop.md
// invariants 4 and 6: exact resume, another world size, a killed rank, SIGTERM), for NeRF and
// 3DGS runs, and `tessera export`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "framework/data/file_seal.h"
#include "framework/data/image_io.h"
#include "framework/data/synth.h"
#include "framework/data/synth_geometry.h"
#include "framework/data/h5.h"
#include "framework/snapshot.h"
#include "framework/trainer_run.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;

struct Job {
  bool finished = false;
  int exit_code = -1;
  double seconds = 0;
  std::string output;
};

// Process ids whose command line mentions `marker` (the run directory, unique to a test).
std::vector<pid_t> processes_with(const std::string& marker, const std::string& binary) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "cmdline");
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.rfind(binary, 0) == 0 && cmdline.find(marker) != std::string::npos)
      pids.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return pids;
}

class ResumeTest : public testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("TESSERA_BINARY");
    const char* mpiexec = std::getenv("TESSERA_MPIEXEC");
    ASSERT_TRUE(binary && mpiexec) << "TESSERA_BINARY / TESSERA_MPIEXEC unset (run through ctest)";
    binary_ = binary;
    mpiexec_ = mpiexec;
    dir_ = (fs::temp_directory_path() / ("tessera-resume-" + std::to_string(getpid()) + "-" +
                                         testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const Job synth = run({binary_, "synth", "--preset", "objects", "--views", "8", "--width", "32",
                           "--height", "24", "--out", dir_ + "/scene.h5"}, 120);
    ASSERT_EQ(synth.exit_code, 0) << synth.output;
    std::ofstream(dir_ + "/run.toml")
        << "[data]\npath = \"" << dir_ << "/scene.h5\"\n"
        << "[model]\nname = \"nerf-hash\"\n"
        << "[train]\nsteps = 24\nlog_every = 4\n"
        << "[nerf]\nrays_per_step = 256\n"
        << "adam_eps = 1e-4\n"  // see test_nerf_invariants: keeps reassociation from compounding
        << "[snapshot]\nevery = 4\nkeep = 2\n"
        << "[eval]\nmax_views = 1\n"
        << "[distributed]\nthreads = 1\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs argv (in its own process group) until it ends or `deadline_s` passes; `during` is called
  // every 50 ms while it runs.
  Job run(const std::vector<std::string>& argv, double deadline_s,
          const std::function<void()>& during = {}) {
    Job job;
    const std::string log = dir_ + "/output-" + std::to_string(++jobs_) + ".txt";
    const auto start = std::chrono::steady_clock::now();
    const pid_t child = fork();
    if (child == 0) {
      setpgid(0, 0);
      std::freopen(log.c_str(), "w", stdout);
      dup2(fileno(stdout), fileno(stderr));
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    int status = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < deadline_s) {
      if (waitpid(child, &status, WNOHANG) == child) {
        job.finished = true;
        break;
      }
      if (during) during();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!job.finished) {
      kill(-child, SIGKILL);
      for (pid_t pid : processes_with(dir_, binary_)) kill(pid, SIGKILL);
      waitpid(child, &status, 0);
    }
    job.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    job.output = text.str();
    return job;
  }

  std::vector<std::string> train(int ranks, const std::string& out_dir,
                                 const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv{mpiexec_, "-n", std::to_string(ranks), "--oversubscribe",
                                  binary_, "train", dir_ + "/run.toml", "--set",
                                  "run.out_dir=" + out_dir};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  // Every parameter and Adam moment of two snapshots: the count of datasets that differ bitwise,
  // and the largest difference relative to the largest parameter.
  static std::pair<int, double> compare(const std::string& a, const std::string& b) {
    const SnapshotReader ra(a), rb(b);
    int differ = 0;
    double worst = 0, scale = 0;
    for (const std::string& group : {std::string("params"), std::string("optimizer")})
      for (const std::string& name : ra.names(group)) {
        const std::string key = group + "/" + name;
        EXPECT_TRUE(rb.has(key)) << key;
        if (!rb.has(key)) continue;
        const torch::Tensor x = ra.read(key), y = rb.read(key);
        if (!torch::equal(x, y)) ++differ;
        if (group == "params" && x.is_floating_point()) {
          worst = std::max(worst, (x.to(torch::kFloat64) - y.to(torch::kFloat64)).abs().max().item<double>());
          scale = std::max(scale, y.abs().max().item<double>());
        }
      }
    return {differ, scale > 0 ? worst / scale : 0.0};
  }

  // A tiny 3DGS run: densification at steps 5, 10 and 15, snapshots every 5 steps.
  void write_gaussians_config() {
    std::ofstream(dir_ + "/gaussians.toml")
        << "[data]\npath = \"" << dir_ << "/scene.h5\"\n"
        << "[model]\nname = \"gaussians\"\n"
        << "[gaussians]\ndensify_from = 5\ndensify_until = 16\ndensify_every = 5\n"
        << "densify_grad_threshold = 2e-5\nsh_degree_interval = 5\n"
        << "[train]\nsteps = 20\nlog_every = 10\n"
        << "[snapshot]\nevery = 5\nkeep = 0\n"
        << "[eval]\nmax_views = 1\n"
        << "[distributed]\nthreads = 1\n";
  }
  std::vector<std::string> gaussians_train(int ranks, const std::string& out_dir,
                                           const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv{mpiexec_, "-n", std::to_string(ranks), "--oversubscribe",
                                  binary_, "train", dir_ + "/gaussians.toml", "--set",
                                  "run.out_dir=" + out_dir};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }
  // Runs `argv` (a training of `run_dir`), sends SIGTERM to every rank once training is under
  // way, and expects a clean stop (exit code 4, kExitStopped: "stopped by a signal") with a
  // snapshot; returns the newest snapshot's step.
  int64_t run_and_terminate(const std::vector<std::string>& argv, const std::string& run_dir,
                            int timeout_s) {
    bool sent = false;
    const Job job = run(argv, timeout_s, [&] {
      if (sent) return;
      const auto ranks = processes_with(run_dir, binary_);
      if (ranks.size() < 2 || !fs::exists(run_dir + "/metrics.jsonl") ||
          fs::file_size(run_dir + "/metrics.jsonl") == 0)
        return;  // wait until training is under way
      for (pid_t pid : ranks) kill(pid, SIGTERM);
      sent = true;
    });
    EXPECT_TRUE(sent) << job.output;
    EXPECT_TRUE(job.finished) << job.output;
    EXPECT_EQ(job.exit_code, kExitStopped) << job.output;
    EXPECT_NE(job.output.find("stopped by a signal"), std::string::npos) << job.output;
    const auto newest = find_latest_snapshot(run_dir + "/snapshots");
    EXPECT_TRUE(newest.has_value()) << job.output;
    return newest ? *snapshot_step(*newest) : -1;
  }
  static std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // A binary PLY: its header (through "end_header\n") and its float32 values.
  static std::pair<std::string, std::vector<float>> split_ply(const std::string& bytes) {
    const std::string end = "end_header\n";
    const size_t at = bytes.find(end);
    if (at == std::string::npos) return {"", {}};
    std::vector<float> values((bytes.size() - at - end.size()) / sizeof(float));
    std::memcpy(values.data(), bytes.data() + at + end.size(), values.size() * sizeof(float));
    return {bytes.substr(0, at + end.size()), values};
  }
  // `header` with its vertex count replaced by n (what models/gaussians ply_header(n) writes).
  static std::string ply_header_like(const std::string& header, int64_t n) {
    const std::string key = "element vertex ";
    const size_t at = header.find(key);
    if (at == std::string::npos) return "";
    const size_t eol = header.find('\n', at);
    return header.substr(0, at + key.size()) + std::to_string(n) + header.substr(eol);
  }

  std::string binary_, mpiexec_, dir_;
  int jobs_ = 0;
};

TEST_F(ResumeTest, StraightEqualsInterruptedAndResumedInNewProcesses) {
  const Job straight = run(train(2, dir_ + "/straight"), 120);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const Job first = run(train(2, dir_ + "/split", {"--until", "12"}), 120);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(fs::exists(snapshot_path(dir_ + "/split/snapshots", 12)));
  EXPECT_FALSE(fs::exists(snapshot_path(dir_ + "/split/snapshots", 16)));
  const Job second = run(train(2, dir_ + "/split", {"--resume", "auto"}), 120);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("at step 12"), std::string::npos) << second.output;
  const auto [differ, relative] = compare(snapshot_path(dir_ + "/split/snapshots", 24),
                                          snapshot_path(dir_ + "/straight/snapshots", 24));
  EXPECT_EQ(differ, 0) << "datasets differ; largest relative parameter difference " << relative;
  // `tessera info`, `eval` and `render` on the final snapshot (eval and render on 2 ranks).
  const std::string final_snapshot = snapshot_path(dir_ + "/straight/snapshots", 24);
  const Job info = run({binary_, "info", final_snapshot}, 60);
  ASSERT_EQ(info.exit_code, 0) << info.output;
  for (const char* needle : {"tessera-snapshot version 2", "step:         24", "model:        nerf-hash",
                             "world size:   2 rank(s)", "checksums:    all datasets verified",
                             "[model]", "hash_grid.0 ["})
    EXPECT_NE(info.output.find(needle), std::string::npos) << needle << "\n" << info.output;
  const Job eval = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "eval", final_snapshot}, 120);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("\"model\":\"nerf-hash\",\"ranks\":2,"), std::string::npos) << eval.output;
  EXPECT_NE(eval.output.find("{\"layout\":\"the model replicated on 2 rank(s)"), std::string::npos)
      << eval.output;
  EXPECT_NE(eval.output.find("\"val\":{\"psnr\":"), std::string::npos) << eval.output;
  const Job render = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "render", final_snapshot,
                          "--out", dir_ + "/renders", "--orbit", "3"}, 120);
  ASSERT_EQ(render.exit_code, 0) << render.output;
  for (const char* name : {"orbit-000.png", "orbit-001.png", "orbit-002.png"})
    EXPECT_TRUE(fs::exists(dir_ + "/renders/" + name)) << name << "\n" << render.output;

  // Rotation kept the newest two.
  EXPECT_FALSE(fs::exists(snapshot_path(dir_ + "/split/snapshots", 12)));
  EXPECT_TRUE(fs::exists(snapshot_path(dir_ + "/split/snapshots", 20)));

  // Two ranks resumed as three: equal within float reassociation.
  const std::string resharded = dir_ + "/resharded";
  fs::create_directories(resharded + "/snapshots");
  fs::copy_file(snapshot_path(dir_ + "/straight/snapshots", 20), snapshot_path(resharded + "/snapshots", 20));
  const Job three = run(train(3, resharded, {"--resume", "auto"}), 120);
  ASSERT_EQ(three.exit_code, 0) << three.output;
  const auto [differ3, relative3] = compare(snapshot_path(resharded + "/snapshots", 24),
                                            snapshot_path(dir_ + "/straight/snapshots", 24));
  std::printf("2 ranks resumed as 3: %d datasets not bitwise equal, largest relative parameter "
              "difference %.3g\n", differ3, relative3);
  EXPECT_LE(relative3, 1e-5);
}

// `tessera bench snapshot` on 2 ranks: one JSON line per mode, both files the same size.
TEST_F(ResumeTest, SnapshotBenchReportsBothModes) {
  const Job job = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "bench", "snapshot",
                       "--count", "1001", "--repeats", "1", "--dir", dir_}, 60);
  ASSERT_EQ(job.exit_code, 0) << job.output;
  // 1001 Gaussians x 59 floats x 3 (value and two Adam moments) x 4 bytes, plus HDF5 overhead.
  const int64_t payload = 1001LL * 59 * 3 * 4;
  int lines = 0;
  std::istringstream in(job.output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("{\"bench\":\"snapshot\"", 0) != 0) continue;
    ++lines;
    const size_t at = line.find("\"bytes\":");
    ASSERT_NE(at, std::string::npos) << line;
    const int64_t bytes = std::stoll(line.substr(at + 8));
    EXPECT_GE(bytes, payload) << line;
    EXPECT_LT(bytes, payload + 200000) << line;
    for (const char* key : {"\"seal_s\":", "\"plain_read_s\":", "\"seal_vs_plain_read\":"}) {
      const size_t field = line.find(key);
      ASSERT_NE(field, std::string::npos) << key << " in " << line;
      EXPECT_GT(std::stod(line.substr(field + std::string(key).size())), 0.0) << key << line;
    }
  }
  EXPECT_EQ(lines, 2) << job.output;
}

// --resume auto skips a damaged newest snapshot with a warning; a snapshot of another dataset
// is refused with exit code 2.
TEST_F(ResumeTest, AutoSkipsDamagedSnapshotsAndOtherDatasetsAreRefused) {
  const std::string run_dir = dir_ + "/damaged";
  const Job first = run(train(1, run_dir, {"--until", "8"}), 120);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string newest = snapshot_path(run_dir + "/snapshots", 8);
  ASSERT_TRUE(fs::exists(newest));
  fs::resize_file(newest, fs::file_size(newest) / 2);  // as a crash mid-copy would leave it
  const Job resumed = run(train(1, run_dir, {"--until", "12", "--resume", "auto"}), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("warning: --resume auto: skipping"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("step-00000004.h5 at step 4"), std::string::npos) << resumed.output;

  const Job other = run({binary_, "synth", "--preset", "objects", "--views", "9", "--width", "32",
                         "--height", "24", "--out", dir_ + "/other.h5"}, 120);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const Job refused = run(train(1, run_dir, {"--set", "data.path=" + dir_ + "/other.h5",
                                             "--resume", snapshot_path(run_dir + "/snapshots", 12)}), 120);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("trained on another dataset"), std::string::npos) << refused.output;
}

// model.name = "gaussians" on 2 ranks: trains with densification, writes metrics, eval renders,
// snapshots and the INRIA PLY. Interrupted with --until and resumed (--resume auto) on 2 ranks
// it writes the same PLY byte for byte; resumed on 3 ranks it completes; `tessera export` of a
// snapshot writes the PLY of that step (of the final one: the run's gaussians.ply) and refuses
// anything that is not a sound Gaussian snapshot with exit code 2, writing nothing.
TEST_F(ResumeTest, GaussiansResumeExactlyAndExportPly) {
  write_gaussians_config();
  const std::string out = dir_ + "/gs";
  const Job job = run(gaussians_train(2, out), 180);
  ASSERT_EQ(job.exit_code, 0) << job.output;
  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line, last;
  int records = 0;
  while (std::getline(metrics, line)) {
    ++records;
    last = line;
  }
  EXPECT_EQ(records, 3) << "steps 10 and 20, then the summary";
  EXPECT_NE(last.find("\"summary\":true"), std::string::npos) << last;
  EXPECT_NE(last.find("\"eval_psnr\":"), std::string::npos) << last;
  ASSERT_TRUE(fs::is_directory(out + "/renders"));
  EXPECT_FALSE(fs::is_empty(out + "/renders")) << "no eval render\n" << job.output;
  const std::string straight_ply = read_file(out + "/gaussians.ply");
  EXPECT_EQ(straight_ply.rfind("ply\n", 0), 0u);
  EXPECT_NE(job.output.find("initial Gaussians on 2 rank(s)"), std::string::npos) << job.output;
  for (int64_t step : {5, 10, 15, 20})
    EXPECT_TRUE(fs::exists(snapshot_path(out + "/snapshots", step))) << step;

  // Interrupted after step 8 (a snapshot, no PLY), then resumed on as many ranks.
  const std::string split = dir_ + "/gs-split";
  const Job first = run(gaussians_train(2, split, {"--until", "8"}), 180);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(fs::exists(snapshot_path(split + "/snapshots", 8)));
  EXPECT_FALSE(fs::exists(split + "/gaussians.ply"));
  const Job second = run(gaussians_train(2, split, {"--resume", "auto"}), 180);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("step-00000008.h5 at step 8"), std::string::npos) << second.output;
  EXPECT_TRUE(read_file(split + "/gaussians.ply") == straight_ply)
      << "the resumed run's PLY differs from the uninterrupted run's";
  // metrics.jsonl: the first run's record of step 8, then the resumed run's; one summary.
  std::ifstream split_metrics(split + "/metrics.jsonl");
  std::vector<std::string> steps;
  int summaries = 0;
  while (std::getline(split_metrics, line)) {
    if (line.find("\"summary\":true") != std::string::npos) ++summaries;
    const size_t at = line.find("\"step\":");
    if (at != std::string::npos)
      steps.push_back(line.substr(at + 7, line.find_first_of(",}", at) - at - 7));
  }
  EXPECT_EQ(steps, (std::vector<std::string>{"8", "10", "20"}));
  EXPECT_EQ(summaries, 1);

  // The snapshot of step 10 written by 2 ranks, resumed by 3.
  const std::string three = dir_ + "/gs-three";
  fs::create_directories(three + "/snapshots");
  fs::copy_file(snapshot_path(out + "/snapshots", 10), snapshot_path(three + "/snapshots", 10));
  const Job resharded = run(gaussians_train(3, three, {"--resume", "auto"}), 180);
  ASSERT_EQ(resharded.exit_code, 0) << resharded.output;
  EXPECT_NE(resharded.output.find("at step 10"), std::string::npos) << resharded.output;
  const std::string three_ply = read_file(three + "/gaussians.ply");
  EXPECT_EQ(three_ply.rfind("ply\n", 0), 0u);
  // run.deterministic (the default): 3 ranks continue with the bits of 2, so the resumed run's
  // PLY is the uninterrupted run's byte for byte.
  EXPECT_TRUE(three_ply == straight_ply)
      << "2 ranks resumed as 3: the PLY differs from the uninterrupted run's";
  std::fflush(stdout);  // before the next fork: a child would flush this buffer again

  // `tessera export`, no mpirun: the final snapshot gives the run's PLY byte for byte; step 10
  // gives the PLY header of its Gaussian count and count x 62 floats.
  const std::string exported = dir_ + "/export-20.ply";
  const Job export20 =
      run({binary_, "export", snapshot_path(out + "/snapshots", 20), "--ply", exported}, 60);
  ASSERT_EQ(export20.exit_code, 0) << export20.output;
  EXPECT_TRUE(read_file(exported) == straight_ply)
      << "the export of the final snapshot differs from gaussians.ply";
  // `tessera eval --ply` scores the exported PLY on the run's dataset as `tessera eval` scores
  // the snapshot it came from (the PLY holds the capture's coordinates and the canonical order,
  // so the two agree to float rounding, not bitwise); `render --ply` renders it.
  auto scores = [](const Job& job) {
    std::istringstream lines(job.output);
    for (std::string line; std::getline(lines, line);)
      if (!line.empty() && line[0] == '{') return nlohmann::json::parse(line).at("splits").at("val");
    return nlohmann::json();
  };
  const Job snapshot_eval =
      run({binary_, "eval", snapshot_path(out + "/snapshots", 20), "--split", "val"}, 60);
  ASSERT_EQ(snapshot_eval.exit_code, 0) << snapshot_eval.output;
  const Job ply_eval = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "eval", "--ply",
                            exported, "--scene", dir_ + "/scene.h5", "--split", "val"}, 60);
  ASSERT_EQ(ply_eval.exit_code, 0) << ply_eval.output;
  const nlohmann::json want = scores(snapshot_eval), got = scores(ply_eval);
  ASSERT_TRUE(want.is_object() && got.is_object()) << snapshot_eval.output << ply_eval.output;
  EXPECT_EQ(got.at("views"), want.at("views"));
  EXPECT_NEAR(got.at("psnr").get<double>(), want.at("psnr").get<double>(), 0.01) << ply_eval.output;
  EXPECT_NEAR(got.at("ssim").get<double>(), want.at("ssim").get<double>(), 1e-4) << ply_eval.output;
  const Job ply_render = run({binary_, "render", "--ply", exported, "--scene", dir_ + "/scene.h5",
                              "--orbit", "1", "--out", dir_ + "/ply-orbit"}, 60);
  ASSERT_EQ(ply_render.exit_code, 0) << ply_render.output;
  EXPECT_TRUE(fs::exists(dir_ + "/ply-orbit/orbit-000.png"));
  // Bad input: no --scene, a file no family reads.
  const Job no_scene = run({binary_, "eval", "--ply", exported}, 60);
  EXPECT_EQ(no_scene.exit_code, 2) << no_scene.output;
  EXPECT_NE(no_scene.output.find("--scene"), std::string::npos) << no_scene.output;
  const Job not_a_model =
      run({binary_, "eval", "--ply", dir_ + "/scene.h5", "--scene", dir_ + "/scene.h5"}, 60);
  EXPECT_EQ(not_a_model.exit_code, 2) << not_a_model.output;
  EXPECT_NE(not_a_model.output.find("no model family reads this file"), std::string::npos)
      << not_a_model.output;

  const std::string snapshot10 = snapshot_path(out + "/snapshots", 10);
  const Job export10 = run({binary_, "export", snapshot10, "--ply", dir_ + "/export-10.ply"}, 60);
  ASSERT_EQ(export10.exit_code, 0) << export10.output;
  const int64_t n10 = SnapshotReader(snapshot10).shape("params/means").at(0);
  const auto [header10, values10] = split_ply(read_file(dir_ + "/export-10.ply"));
  EXPECT_EQ(header10, ply_header_like(split_ply(straight_ply).first, n10));
  EXPECT_EQ(static_cast<int64_t>(values10.size()), n10 * 62);
  EXPECT_NE(export10.output.find("wrote " + std::to_string(n10) + " Gaussians (step 10)"),
            std::string::npos) << export10.output;
  const Job info = run({binary_, "info", snapshot10}, 60);
  ASSERT_EQ(info.exit_code, 0) << info.output;
  for (const std::string& needle : {std::string("model:        gaussians"),
                                    "gaussians:    " + std::to_string(n10),
                                    std::string("checksums:    all datasets verified")})
    EXPECT_NE(info.output.find(needle), std::string::npos) << needle << "\n" << info.output;

  // Refused with exit code 2, nothing written: a missing file, a damaged snapshot, a NeRF one.
  const std::string refused_ply = dir_ + "/refused.ply";
  const Job missing = run({binary_, "export", dir_ + "/none.h5", "--ply", refused_ply}, 60);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  const std::string damaged = dir_ + "/damaged.h5";
  fs::copy_file(snapshot10, damaged);
  {
    // One bit flipped in the data of params/sh_rest (its checksum no longer matches).
    int64_t offset = 0;
    {
      const data::h5::Id file = data::h5::open_file_read_only(damaged);
      const data::h5::Id dataset = data::h5::open_dataset(file.get(), "params/sh_rest");
      const haddr_t at = H5Dget_offset(dataset.get());
      ASSERT_NE(at, HADDR_UNDEF);
      offset = static_cast<int64_t>(data::seal::kBlockBytes + at) + 100;  // after the seal
    }
    std::fstream f(damaged, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c = 0;
    f.read(&c, 1);
    f.seekp(offset);
    c = static_cast<char>(c ^ 0x08);
    f.write(&c, 1);
  }
  const Job bad = run({binary_, "export", damaged, "--ply", refused_ply}, 60);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  const std::string truncated = dir_ + "/truncated.h5";
  fs::copy_file(snapshot10, truncated);
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  const Job cut = run({binary_, "export", truncated, "--ply", refused_ply}, 60);
  EXPECT_EQ(cut.exit_code, 2) << cut.output;
  const Job nerf = run(train(1, dir_ + "/nerf", {"--until", "1"}), 120);
  ASSERT_EQ(nerf.exit_code, 0) << nerf.output;
  const Job not_gaussians = run({binary_, "export", snapshot_path(dir_ + "/nerf/snapshots", 1),
                                 "--ply", refused_ply}, 60);
  EXPECT_EQ(not_gaussians.exit_code, 2) << not_gaussians.output;
  EXPECT_NE(not_gaussians.output.find("nothing to export"), std::string::npos)
      << not_gaussians.output;
  EXPECT_FALSE(fs::exists(refused_ply));
}

// SIGTERM to every rank of a Gaussian run: one snapshot, exit code 4; --resume auto continues
// from it to the end (the PLY).
TEST_F(ResumeTest, GaussiansSigtermWritesASnapshotAndResumes) {
  write_gaussians_config();
  const std::string run_dir = dir_ + "/gs-term";
  const int64_t step = run_and_terminate(
      gaussians_train(2, run_dir, {"--set", "train.steps=100000", "--set", "train.log_every=1",
                                   "--set", "snapshot.every=0"}),
      run_dir, 90);
  ASSERT_GT(step, 0);
  EXPECT_FALSE(fs::exists(run_dir + "/gaussians.ply"));
  const Job resumed = run(gaussians_train(2, run_dir, {"--set",
                                                       "train.steps=" + std::to_string(step + 2),
                                                       "--resume", "auto"}),
                          90);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step " + std::to_string(step)), std::string::npos)
      << resumed.output;
  EXPECT_TRUE(fs::exists(snapshot_path(run_dir + "/snapshots", step + 2)));
  EXPECT_TRUE(fs::exists(run_dir + "/gaussians.ply"));
}

// A Gaussian run started from a PLY, with view sampling, coarse to fine and one view per pass
// chosen by the [checkpoint] budget: the metrics show each, and a budget policy without a
// budget is bad input.
TEST_F(ResumeTest, GaussiansFromPlyScheduledPassesThenEvalAndRender) {
  write_gaussians_config();
  const std::string seed_run = dir_ + "/gs-seed";
  const Job seed = run(gaussians_train(1, seed_run, {"--set", "train.steps=2"}), 90);
  ASSERT_EQ(seed.exit_code, 0) << seed.output;
  const std::string ply = seed_run + "/gaussians.ply";
  const std::string header = split_ply(read_file(ply)).first;
  const size_t at = header.find("element vertex ");
  ASSERT_NE(at, std::string::npos) << header;
  const long long vertices = std::atoll(header.c_str() + at + 15);
  ASSERT_GT(vertices, 0);

  const std::string out = dir_ + "/gs-ply";
  const std::vector<std::string> settings = {
      "--set", "gaussians.init_ply=" + ply, "--set", "gaussians.views_per_step=2",
      "--set", "gaussians.num_downscales=1", "--set", "gaussians.resolution_schedule=3",
      "--set", "gaussians.densify_from=100", "--set", "sampling.schedule=step",
      "--set", "sampling.rate_min=0.5", "--set", "sampling.step_every=2",
      "--set", "checkpoint.policy=budget", "--set", "checkpoint.budget_mib=0.001",
      "--set", "train.steps=6", "--set", "train.log_every=1", "--set", "snapshot.every=0"};
  const Job job = run(gaussians_train(2, out, settings), 120);
  ASSERT_EQ(job.exit_code, 0) << job.output;
  EXPECT_NE(job.output.find(std::to_string(vertices) + " initial Gaussians on 2 rank(s)"),
            std::string::npos) << job.output;
  std::ifstream metrics(out + "/metrics.jsonl");
  std::string line;
  std::vector<std::string> records;
  while (std::getline(metrics, line))
    if (line.find("\"summary\"") == std::string::npos) records.push_back(line);
  ASSERT_EQ(records.size(), 6u) << job.output;
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string scale = i < 3 ? "\"resolution_scale\":2.0" : "\"resolution_scale\":1.0";
    EXPECT_NE(records[i].find(scale), std::string::npos) << records[i];
    EXPECT_NE(records[i].find("\"views_per_pass\":1"), std::string::npos) << records[i];
  }
  EXPECT_NE(records.front().find("\"sampling_rate\":1.0"), std::string::npos) << records.front();
  EXPECT_NE(records.back().find("\"sampling_rate\":0.5"), std::string::npos) << records.back();
  EXPECT_TRUE(fs::exists(out + "/gaussians.ply"));

  // `tessera eval` of the final snapshot on the eval views of the run scores exactly what the
  // run's last eval did; `tessera render --orbit` renders a Gaussian snapshot too.
  const std::string last = snapshot_path(out + "/snapshots", 6);
  const Job eval = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "eval", last, "--split",
                        "val", "--max-views", "1"},
                       60);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  auto number_after = [](const std::string& text, const std::string& key) {
    const size_t at = text.find(key);
    if (at == std::string::npos) return std::string("(missing ") + key + ")";
    const size_t end = text.find_first_of(",}", at + key.size());
    return text.substr(at + key.size(), end - at - key.size());
  };
  const std::string summary = read_file(out + "/metrics.jsonl");
  EXPECT_EQ(number_after(eval.output, "\"psnr\":"), number_after(summary, "\"eval_psnr\":"))
      << eval.output << summary;
  EXPECT_NE(eval.output.find("\"model\":\"gaussians\""), std::string::npos) << eval.output;
  const Job orbit = run({binary_, "render", last, "--out", dir_ + "/gs-orbit", "--orbit", "2"}, 60);
  ASSERT_EQ(orbit.exit_code, 0) << orbit.output;
  EXPECT_TRUE(fs::exists(dir_ + "/gs-orbit/orbit-000.png"));
  EXPECT_TRUE(fs::exists(dir_ + "/gs-orbit/orbit-001.png"));
  // --max-views spreads over the views as a run's eval picks them: 2 of an orbit of 4 are
  // views 0 and 2 (the first two would be 0 and 1).
  const Job spread = run({binary_, "render", last, "--out", dir_ + "/gs-spread", "--orbit", "4",
                          "--max-views", "2"},
                         60);
  ASSERT_EQ(spread.exit_code, 0) << spread.output;
  EXPECT_TRUE(fs::exists(dir_ + "/gs-spread/orbit-000.png"));
  EXPECT_TRUE(fs::exists(dir_ + "/gs-spread/orbit-002.png"));
  EXPECT_FALSE(fs::exists(dir_ + "/gs-spread/orbit-001.png"));

  // `render --video`: on 2 ranks, an H.264 MP4 with one frame per view, of the PNGs' size,
  // in order (each decoded frame is nearest its own PNG); bad input is refused before any work
  // and leaves no file.
  const std::string video = dir_ + "/orbit.mp4";
  const Job rendered = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "render", last,
                            "--orbit", "4", "--out", dir_ + "/gs-video", "--video", video,
                            "--fps", "12"},
                           120);
  ASSERT_EQ(rendered.exit_code, 0) << rendered.output;
  EXPECT_NE(rendered.output.find("video " + video + ": 4 frames at 12 fps"), std::string::npos)
      << rendered.output;
  const torch::Tensor first = data::read_image_file(dir_ + "/gs-video/orbit-000.png").rgb;
  const Job probe = run({"ffprobe", "-v", "error", "-select_streams", "v:0", "-count_frames",
                         "-show_entries", "stream=codec_name,width,height,nb_read_frames,r_frame_rate",
                         "-of", "csv=p=0", video},
                        60);
  ASSERT_EQ(probe.exit_code, 0) << probe.output;
  EXPECT_EQ(probe.output, "h264," + std::to_string(first.size(1)) + "," +
                              std::to_string(first.size(0)) + ",12/1,4\n");
  for (int frame = 0; frame < 4; ++frame) {
    const std::string png = dir_ + "/frame-" + std::to_string(frame) + ".png";
    const Job extract = run({"ffmpeg", "-v", "error", "-y", "-i", video, "-vf",
                             "select=eq(n\\," + std::to_string(frame) + ")", "-frames:v", "1", png},
                            60);
    ASSERT_EQ(extract.exit_code, 0) << extract.output;
    const torch::Tensor decoded = data::read_image_file(png).rgb.to(torch::kFloat32);
    std::vector<double> error;
    for (int view = 0; view < 4; ++view) {
      char name[32];
      std::snprintf(name, sizeof name, "/gs-video/orbit-%03d.png", view);
      const torch::Tensor expected = data::read_image_file(dir_ + name).rgb.to(torch::kFloat32);
      error.push_back((decoded - expected).abs().mean().item<double>());
    }
    EXPECT_EQ(std::min_element(error.begin(), error.end()) - error.begin(), frame)
        << "frame " << frame << " mean absolute errors against the 4 views: " << error[0] << " "
        << error[1] << " " << error[2] << " " << error[3];
    EXPECT_LT(error[frame], 6.0) << "frame " << frame << ": H.264 at crf 18 is far closer";
  }
  const Job avi = run({binary_, "render", last, "--orbit", "2", "--video", dir_ + "/o.avi"}, 60);
  EXPECT_EQ(avi.exit_code, 2) << avi.output;
  EXPECT_NE(avi.output.find("must be an .mp4 file"), std::string::npos) << avi.output;
  const Job no_ffmpeg = run({"/usr/bin/env", "PATH=" + dir_ + "/no-such-bin", binary_, "render",
                             last, "--orbit", "2", "--video", dir_ + "/none.mp4"},
                            60);
  EXPECT_EQ(no_ffmpeg.exit_code, 2) << no_ffmpeg.output;
  EXPECT_NE(no_ffmpeg.output.find("needs ffmpeg"), std::string::npos) << no_ffmpeg.output;
  EXPECT_FALSE(fs::exists(dir_ + "/none.mp4"));
  EXPECT_FALSE(fs::exists(dir_ + "/none.partial.mp4"));
  const Job nothing = run({binary_, "render", last, "--orbit", "2"}, 60);
  EXPECT_EQ(nothing.exit_code, 2) << nothing.output;
  EXPECT_NE(nothing.output.find("give --out DIR"), std::string::npos) << nothing.output;

  const Job bad = run(gaussians_train(1, dir_ + "/gs-nobudget",
                                      {"--set", "checkpoint.policy=budget", "--set",
                                       "checkpoint.budget_mib=0"}),
                      60);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("budget_mib"), std::string::npos) << bad.output;
  const Job missing = run(gaussians_train(1, dir_ + "/gs-noply",
                                          {"--set", "gaussians.init_ply=" + dir_ + "/none.ply"}),
                          60);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("none.ply"), std::string::npos) << missing.output;
}

// A float32 .npy as `tessera render --outputs` writes it: the shape from the header, the values.
torch::Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.compare(0, 8, std::string("\x93NUMPY\x01\x00", 8)), 0) << path;
  if (bytes.size() < 10) return {};
  const size_t header_size = static_cast<uint8_t>(bytes[8]) | (static_cast<uint8_t>(bytes[9]) << 8);
  const std::string header = bytes.substr(10, header_size);
  EXPECT_NE(header.find("'descr': '<f4'"), std::string::npos) << header;
  EXPECT_EQ((10 + header_size) % 64, 0u) << header;
  int64_t h = 0, w = 0;
  EXPECT_EQ(std::sscanf(header.c_str() + header.find("'shape': ("), "'shape': (%ld, %ld)", &h, &w), 2)
      << header;
  EXPECT_EQ(bytes.size(), 10 + header_size + static_cast<size_t>(h * w) * 4) << path;
  if (bytes.size() != 10 + header_size + static_cast<size_t>(h * w) * 4) return {};
  return torch::from_blob(const_cast<char*>(bytes.data()) + 10 + header_size, {h, w}, torch::kFloat32)
      .clone();
}

// The exact depth along the optical axis of every pixel centre of a synth camera (0: no hit).
torch::Tensor exact_depth(const data::synth::SynthScene& scene, const data::Camera& camera) {
  torch::Tensor depth = torch::zeros({camera.height, camera.width}, torch::kFloat32);
  const auto& m = camera.camera_to_world;
  const data::synth::Vec3 eye{m[3], m[7], m[11]}, axis{m[2], m[6], m[10]};
  for (int v = 0; v < camera.height; ++v)
    for (int u = 0; u < camera.width; ++u) {
      const data::synth::SurfaceHit hit = data::synth::trace(scene, data::synth::camera_ray(camera, u + 0.5, v + 0.5));
      if (hit.shape < 0) continue;
      const data::synth::Vec3 d = hit.point - eye;
      depth[v][u] = static_cast<float>(d.x * axis.x + d.y * axis.y + d.z * axis.z);
    }
  return depth;
}

// `tessera render --outputs rgb,depth,alpha` on 2 ranks against the exact depth of synth scenes:
// 3DGS (started from the scene's surface points) on the tabletop, which is written normalized as
// a photo capture is, so its depth must come back in the capture's units (the synth's); nerf-hash
// on the objects scene, whose alpha must separate the objects from the background.
TEST_F(ResumeTest, RenderedDepthAndAlphaMatchTheExactDepthOfSynthScenes) {
  // Bounds on the relative depth error over the pixels seen (alpha > 0.5), from the errors
  // measured (gaussians: median 0.015-0.051, 90th percentile 0.07-0.21; nerf-hash: 0.017-0.022,
  // 0.036-0.046): an expected depth blends the surfaces of a pixel that straddles an edge, and a
  // Gaussian's depth is its centre's, so oblique surfaces (the table) err most. A depth in the
  // normalized frame (the tabletop's scale) or along the ray instead of the optical axis exceeds
  // them.
  struct Case {
    std::string family, preset, config;
    int steps;
    double median, p90;
  };
  const std::vector<Case> cases = {
      {"gaussians", "tabletop", "[model]\nname = \"gaussians\"\n", 300, 0.08, 0.3},
      {"nerf-hash", "objects", "[model]\nname = \"nerf-hash\"\n[nerf]\nrays_per_step = 1024\n",
       300, 0.035, 0.07}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.family + " on " + c.preset);
    data::synth::SynthOptions options;
    options.preset = c.preset;
    options.views = 16;
    options.width = 40;
    options.height = 32;
    const std::string scene_path = dir_ + "/" + c.preset + ".h5";
    data::synth::write_synth_scene(options, scene_path, {});
    const data::synth::SynthScene scene = data::synth::build_scene(options);
    const std::string config = dir_ + "/" + c.family + "-depth.toml";
    std::ofstream(config) << "[data]\npath = \"" << scene_path << "\"\n" << c.config
                          << "[train]\nsteps = " << c.steps << "\nlog_every = 100\n"
                          << "[eval]\nmax_views = 1\n";
    const std::string run_dir = dir_ + "/" + c.family + "-depth";
    const Job train = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "train", config,
                           "--set", "run.out_dir=" + run_dir}, 300);
    ASSERT_EQ(train.exit_code, 0) << train.output;
    const std::string out = dir_ + "/" + c.family + "-outputs";
    const Job render = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "render", run_dir,
                            "--split", "test", "--outputs", "rgb,depth,alpha", "--out", out}, 120);
    ASSERT_EQ(render.exit_code, 0) << render.output;
    for (size_t view : {size_t{4}, size_t{12}}) {  // the test views (index % 8 == 4)
      const std::string stem = out + "/test-" + std::string(view < 10 ? "00" : "0") + std::to_string(view);
      for (const char* file : {".png", ".depth.png", ".alpha.png"}) EXPECT_TRUE(fs::exists(stem + file)) << stem + file;
      // 16-bit greyscale: IHDR's bit depth 16, colour type 0.
      const std::string png = read_file(stem + ".depth.png");
      ASSERT_GT(png.size(), 26u);
      EXPECT_EQ(static_cast<int>(png[24]), 16);
      EXPECT_EQ(static_cast<int>(png[25]), 0);
      const torch::Tensor depth = read_npy(stem + ".depth.npy");
      const torch::Tensor alpha = read_npy(stem + ".alpha.npy");
      const torch::Tensor truth = exact_depth(scene, scene.cameras[view]);
      ASSERT_TRUE(depth.defined() && alpha.defined());
      ASSERT_EQ(depth.sizes(), truth.sizes());
      ASSERT_EQ(alpha.sizes(), truth.sizes());
      const torch::Tensor hit = truth > 0;
      const torch::Tensor seen = hit & (alpha > 0.5);
      EXPECT_GT(seen.sum().item<double>(), 0.9 * hit.sum().item<double>())
          << "alpha > 0.5 on too few of the pixels that hit a surface";
      if (!scene.with_alpha) {
        EXPECT_TRUE(hit.all().item<bool>()) << "every tabletop ray hits";
      } else {
        const torch::Tensor miss = ~hit;
        EXPECT_GT((miss & (alpha < 0.5)).sum().item<double>(), 0.9 * miss.sum().item<double>())
            << "alpha >= 0.5 on too many background pixels";
      }
      const torch::Tensor relative =
          ((depth - truth).abs() / truth.clamp_min(1e-6)).masked_select(seen);
      const double median = relative.median().item<double>();
      const double p90 = std::get<0>(relative.sort()).select(0, (relative.size(0) * 9) / 10).item<double>();
      std::printf("%s view %zu: relative depth error median %.4f, 90th percentile %.4f over %lld "
                  "pixels\n", c.family.c_str(), view, median, p90,
                  static_cast<long long>(relative.size(0)));
      std::fflush(stdout);  // before the next fork copies the buffer
      EXPECT_LT(median, c.median);
      EXPECT_LT(p90, c.p90);
    }
  }
}

// A Gaussian scene rendered and scored on 1, 2 and 4 ranks, from a snapshot and from a PLY: each
// rank holds its slice of the Gaussians (a PLY is read in slices), the output says how they are
// spread, and the renders equal the 1-rank render within float rounding. Measured: bitwise equal
// at one thread per rank (this config); with the default thread share (2 threads on 1 rank, 1
// each on 2 or 4 ranks of a 2-core machine) depth and alpha differ by 1-2 float ulps (2.4e-7 of
// 5, 1.5e-8 of 1) and no 8-bit colour changes.
TEST_F(ResumeTest, ShardedRenderAndEvalOnOneTwoAndFourRanksMatchOneRank) {
  write_gaussians_config();
  const std::string run_dir = dir_ + "/gs-sharded";
  const Job train = run(gaussians_train(2, run_dir), 120);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string ply = run_dir + "/gaussians.ply";
  ASSERT_TRUE(fs::exists(ply)) << train.output;
  // Each rank logs its memory by kind at the start: 59 floats per Gaussian at SH degree 3, as
  // much of gradients, twice that of Adam moments.
  const std::string log = read_file(run_dir + "/logs/rank-1.log");
  for (const char* needle : {"memory of rank 1 (", "  parameters ", "(236 B per Gaussian)",
                             "  optimizer (Adam) ", "(472 B per Gaussian)", "one view's pass"})
    EXPECT_NE(log.find(needle), std::string::npos) << needle << "\n" << log;
  struct Source {
    std::string name;
    std::vector<std::string> args;
  };
  for (const Source& source : {Source{"snapshot", {run_dir}},
                               Source{"ply", {"--ply", ply, "--scene", dir_ + "/scene.h5"}}}) {
    SCOPED_TRACE(source.name);
    std::vector<std::string> views;
    double psnr1 = 0;
    for (int ranks : {1, 2, 4}) {
      SCOPED_TRACE(std::to_string(ranks) + " ranks");
      const std::string out = dir_ + "/sharded-" + source.name + "-" + std::to_string(ranks);
      std::vector<std::string> render{mpiexec_, "-n", std::to_string(ranks), "--oversubscribe",
                                      binary_, "render"};
      render.insert(render.end(), source.args.begin(), source.args.end());
      for (const char* a : {"--split", "test", "--outputs", "rgb,depth,alpha", "--out"}) render.push_back(a);
      render.push_back(out);
      const Job job = run(render, 120);
      ASSERT_EQ(job.exit_code, 0) << job.output;
      EXPECT_NE(job.output.find("Gaussians sharded over " + std::to_string(ranks) + " rank(s)"),
                std::string::npos) << job.output;
      std::vector<std::string> eval{mpiexec_, "-n", std::to_string(ranks), "--oversubscribe",
                                    binary_, "eval"};
      eval.insert(eval.end(), source.args.begin(), source.args.end());
      for (const char* a : {"--split", "test"}) eval.push_back(a);
      const Job scored = run(eval, 120);
      ASSERT_EQ(scored.exit_code, 0) << scored.output;
      std::string json_line, line;  // the last line that is a JSON object
      std::istringstream lines(scored.output);
      while (std::getline(lines, line))
        if (!line.empty() && line.front() == '{') json_line = line;
      ASSERT_FALSE(json_line.empty()) << scored.output;
      const nlohmann::json result = nlohmann::json::parse(json_line);
      EXPECT_NE(result.value("layout", "").find("sharded over " + std::to_string(ranks)),
                std::string::npos) << result.dump();
      const double psnr = result["splits"]["test"]["psnr"].get<double>();
      if (ranks == 1) {
        psnr1 = psnr;
        for (const auto& entry : fs::directory_iterator(out)) views.push_back(entry.path().filename().string());
        std::sort(views.begin(), views.end());
        ASSERT_EQ(views.size(), 5u) << "the test view's png, depth png/npy, alpha png/npy";
        continue;
      }
      EXPECT_NEAR(psnr, psnr1, 1e-4);
      const std::string one = dir_ + "/sharded-" + source.name + "-1";
      for (const std::string& name : views) {
        SCOPED_TRACE(name);
        if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) {
          const torch::Tensor a = read_npy(one + "/" + name), b = read_npy(out + "/" + name);
          ASSERT_TRUE(a.defined() && b.defined());
          ASSERT_EQ(a.sizes(), b.sizes());
          const double scale = std::max(a.abs().max().item<double>(), 1e-6);
          const double diff = (a - b).abs().max().item<double>();
          std::printf("%s on %d ranks: %s max difference %.3g (of %.3g)\n", source.name.c_str(),
                      ranks, name.c_str(), diff, scale);
          std::fflush(stdout);
          EXPECT_LE(diff, 1e-5 * scale);
        } else if (name.find(".depth.") == std::string::npos && name.find(".alpha.") == std::string::npos) {
          const torch::Tensor a = data::read_image_file(one + "/" + name).rgb.to(torch::kInt32);
          const torch::Tensor b = data::read_image_file(out + "/" + name).rgb.to(torch::kInt32);
          ASSERT_EQ(a.sizes(), b.sizes());
          EXPECT_LE((a - b).abs().max().item<int>(), 1) << "a colour off by more than 8-bit rounding";
          EXPECT_GE((a == b).to(torch::kFloat32).mean().item<double>(), 0.999);
        }
      }
    }
  }
}

// `tessera render --camera-path`: a nerfstudio camera path made of the test views' poses (as the
// dataset's nerfstudio export writes them) renders exactly those views; the same path in a
// nerfstudio run's normalized frame renders them with --dataparser-transforms and not without.
TEST_F(ResumeTest, CameraPathRendersTheViewsOfItsPoses) {
  write_gaussians_config();
  const std::string run_dir = dir_ + "/gs-path";
  const Job train = run(gaussians_train(1, run_dir, {"--set", "train.steps=4"}), 90);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const Job convert = run({binary_, "convert", dir_ + "/scene.h5", "--to", "nerfstudio", dir_ + "/ns"}, 60);
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  const nlohmann::json transforms = nlohmann::json::parse(read_file(dir_ + "/ns/transforms.json"));
  const auto& tests = transforms["test_filenames"];
  // A rotation about z by 0.5 rad, a shift and a scale, as nerfstudio's dataparser records them.
  const double c = std::cos(0.5), s = std::sin(0.5), scale = 0.4;
  const double rot[3][3] = {{c, -s, 0}, {s, c, 0}, {0, 0, 1}}, shift[3] = {0.3, -0.2, 0.5};
  nlohmann::json path = {{"camera_type", "perspective"}, {"fps", 12}, {"seconds", 1}};
  nlohmann::json normalized = path;
  for (const auto& frame : transforms["frames"]) {
    if (std::find(tests.begin(), tests.end(), frame["file_path"]) == tests.end()) continue;
    path["render_width"] = normalized["render_width"] = frame["w"];
    path["render_height"] = normalized["render_height"] = frame["h"];
    const double fov = 2 * std::atan(frame["h"].get<double>() / 2 / frame["fl_y"].get<double>()) * 180 / M_PI;
    std::vector<double> m, n(16, 0.0);
    for (const auto& row : frame["transform_matrix"])
      for (const auto& v : row) m.push_back(v.get<double>());
    for (int r = 0; r < 3; ++r) {
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 3; ++j) n[r * 4 + k] += rot[r][j] * m[j * 4 + k];
      double p = shift[r];
      for (int j = 0; j < 3; ++j) p += rot[r][j] * m[j * 4 + 3];
      n[r * 4 + 3] = scale * p;
    }
    n[15] = 1;
    path["camera_path"].push_back({{"camera_to_world", m}, {"fov", fov}, {"aspect", 1}});
    normalized["camera_path"].push_back({{"camera_to_world", n}, {"fov", fov}, {"aspect", 1}});
  }
  ASSERT_EQ(path["camera_path"].size(), 1u) << "the scene's test view";
  std::ofstream(dir_ + "/path.json") << path.dump();
  std::ofstream(dir_ + "/path_ns.json") << normalized.dump();
  nlohmann::json dataparser = {{"scale", scale}, {"transform", nlohmann::json::array()}};
  for (int r = 0; r < 3; ++r) dataparser["transform"].push_back({rot[r][0], rot[r][1], rot[r][2], shift[r]});
  std::ofstream(dir_ + "/dataparser_transforms.json") << dataparser.dump();

  const auto render = [&](const std::vector<std::string>& extra, const std::string& out) {
    std::vector<std::string> argv{binary_, "render", run_dir, "--out", dir_ + "/" + out};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run(argv, 60);
  };
  const Job views = render({"--split", "test"}, "views");
  ASSERT_EQ(views.exit_code, 0) << views.output;
  const Job plain = render({"--camera-path", dir_ + "/path.json"}, "plain");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const Job undone = render({"--camera-path", dir_ + "/path_ns.json", "--dataparser-transforms",
                             dir_ + "/dataparser_transforms.json"}, "undone");
  ASSERT_EQ(undone.exit_code, 0) << undone.output;
  const Job kept = render({"--camera-path", dir_ + "/path_ns.json"}, "kept");
  ASSERT_EQ(kept.exit_code, 0) << kept.output;
  const torch::Tensor want = data::read_image_file(dir_ + "/views/test-004.png").rgb;
  EXPECT_TRUE(torch::equal(data::read_image_file(dir_ + "/plain/path-000.png").rgb, want));
  const torch::Tensor back = data::read_image_file(dir_ + "/undone/path-000.png").rgb.to(torch::kInt32);
  EXPECT_LE((back - want.to(torch::kInt32)).abs().max().item<int>(), 1) << "the normalization undone";
  EXPECT_GT((data::read_image_file(dir_ + "/kept/path-000.png").rgb.to(torch::kInt32) -
             want.to(torch::kInt32)).abs().to(torch::kFloat32).mean().item<double>(), 10.0)
      << "without the dataparser transforms the cameras are elsewhere";

  // Bad paths: exit 2, nothing rendered.
  nlohmann::json fisheye = path, wide = path, short_matrix = path;
  fisheye["camera_type"] = "fisheye";
  wide["camera_path"][0]["fov"] = 180;
  short_matrix["camera_path"][0]["camera_to_world"] = {1, 0, 0};
  for (const auto& [name, bad, needle] :
       {std::tuple{"fisheye", fisheye, "camera_type"}, std::tuple{"wide", wide, "\"fov\""},
        std::tuple{"short", short_matrix, "camera_to_world"}}) {
    std::ofstream(dir_ + "/" + name + ".json") << bad.dump();
    const Job job = render({"--camera-path", dir_ + "/" + name + ".json"}, std::string("bad-") + name);
    EXPECT_EQ(job.exit_code, 2) << job.output;
    EXPECT_NE(job.output.find(needle), std::string::npos) << job.output;
    EXPECT_FALSE(fs::exists(dir_ + "/bad-" + name + "/path-000.png"));
  }
  const Job missing = render({"--camera-path", dir_ + "/none.json"}, "missing");
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  const Job both = render({"--camera-path", dir_ + "/path.json", "--orbit", "3"}, "both");
  EXPECT_EQ(both.exit_code, 2) << both.output;
}

TEST_F(ResumeTest, BadResumePathIsBadInput) {
  std::ofstream(dir_ + "/junk.h5") << "not hdf5";
  const Job job = run(train(1, dir_ + "/bad", {"--resume", dir_ + "/junk.h5"}), 60);
  EXPECT_EQ(job.exit_code, 2) << job.output;
  EXPECT_NE(job.output.find("--resume"), std::string::npos) << job.output;
}

// A rank killed with SIGKILL mid-training: the job ends within 60 s with a non-zero code, the
// newest complete snapshot loads, and resuming finishes with the parameters of an uninterrupted
// run (same world size: bitwise).
TEST_F(ResumeTest, KilledRankLosesNothing) {
  const std::string run_dir = dir_ + "/killed";
  const std::vector<std::string> longer{"--set", "train.steps=60"};
  pid_t victim = 0;
  const Job killed = run(train(3, run_dir, longer), 60, [&] {
    if (victim != 0 || !fs::exists(snapshot_path(run_dir + "/snapshots", 8))) return;
    const auto ranks = processes_with(run_dir, binary_);
    if (ranks.size() < 3) return;
    victim = ranks[1];
    kill(victim, SIGKILL);
  });
  ASSERT_NE(victim, 0) << "no snapshot appeared to kill after:\n" << killed.output;
  ASSERT_TRUE(killed.finished) << "the job outlived 60 s after a rank was killed";
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  EXPECT_TRUE(processes_with(run_dir, binary_).empty()) << "rank processes outlived the job";
  const auto newest = find_latest_snapshot(run_dir + "/snapshots");
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(validate_snapshot(*newest), "");
  ASSERT_LT(*snapshot_step(*newest), 60) << "the run finished before the kill";
  const Job resumed = run(train(3, run_dir, {"--set", "train.steps=60", "--resume", "auto"}), 120);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const Job straight = run(train(3, dir_ + "/uninterrupted", longer), 120);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto [differ, relative] = compare(snapshot_path(run_dir + "/snapshots", 60),
                                          snapshot_path(dir_ + "/uninterrupted/snapshots", 60));
  EXPECT_EQ(differ, 0) << "largest relative parameter difference " << relative;
}

// Two jobs at once: a second job on a run directory in use is refused (exit code 2, naming the
// first job) and leaves the first one's files alone (before, it truncated metrics.jsonl under
// the running job); a job on another run directory runs beside it.
TEST_F(ResumeTest, ASecondJobOnARunDirInUseIsRefused) {
  const std::string run_dir = dir_ + "/busy";
  const std::string metrics = run_dir + "/metrics.jsonl";
  Job second, beside;
  bool done = false;
  const Job first = run(
      train(2, run_dir, {"--set", "train.steps=100000", "--set", "train.log_every=1", "--set",
                         "snapshot.every=0"}),
      180, [&] {
        if (done || !fs::exists(metrics) || fs::file_size(metrics) == 0) return;
        done = true;
        second = run(train(1, run_dir, {"--set", "train.steps=4"}), 90);
        beside = run(train(1, dir_ + "/beside", {"--set", "train.steps=4"}), 90);
        for (pid_t pid : processes_with(run_dir, binary_)) kill(pid, SIGTERM);
      });
  ASSERT_TRUE(done) << first.output;
  EXPECT_EQ(first.exit_code, kExitStopped) << first.output;
  EXPECT_EQ(second.exit_code, 2) << second.output;
  EXPECT_NE(second.output.find("is in use by another training job (host "), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find(" pid "), std::string::npos) << second.output;
  EXPECT_EQ(beside.exit_code, 0) << beside.output;
  // The first job's records are whole, from its first step on.
  std::ifstream in(metrics);
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto first_record = nlohmann::json::parse(line, nullptr, false);
  ASSERT_TRUE(first_record.is_object()) << line;
  EXPECT_EQ(first_record.value("step", int64_t{-1}), 1) << line;
  // Once the first job has ended its lock is gone: the run can be resumed.
  const Job resumed = run(train(2, run_dir, {"--set", "train.steps=" +
      std::to_string(*snapshot_step(*find_latest_snapshot(run_dir + "/snapshots")) + 1),
      "--resume", "auto"}), 90);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}

// A relative run.out_dir under different working directories is two directories: the ranks would
// disagree on every snapshot (resume would start at step 0 on some). Refused at start, exit 2.
TEST_F(ResumeTest, ARunDirThatDiffersBetweenRanksIsRefused) {
  fs::create_directories(dir_ + "/cwd-a");
  fs::create_directories(dir_ + "/cwd-b");
  std::vector<std::string> argv{mpiexec_, "--oversubscribe"};
  for (const std::string& cwd : {dir_ + "/cwd-a", dir_ + "/cwd-b"}) {
    if (argv.size() > 2) argv.push_back(":");
    for (const std::string& a : {std::string("-n"), std::string("1"), std::string("--wdir"), cwd,
                                 binary_, std::string("train"), dir_ + "/run.toml",
                                 std::string("--set"), std::string("run.out_dir=run")})
      argv.push_back(a);
  }
  const Job job = run(argv, 90);
  EXPECT_EQ(job.exit_code, 2) << job.output;
  EXPECT_NE(job.output.find("is not the same directory on every rank: rank 1"), std::string::npos)
      << job.output;
  EXPECT_NE(job.output.find("the path is relative to " + dir_ + "/cwd-b"), std::string::npos)
      << job.output;
  EXPECT_FALSE(fs::exists(dir_ + "/cwd-a/run/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir_ + "/cwd-a/run/snapshots"));
}

// SIGTERM to every rank (as a scheduler sends at a time limit): one snapshot, exit code 4, so
// that a scheduler does not count the job as completed.
TEST_F(ResumeTest, SigtermWritesASnapshotAndExitsCleanly) {
  const std::string run_dir = dir_ + "/term";
  EXPECT_GT(run_and_terminate(train(2, run_dir, {"--set", "train.steps=100000", "--set",
                                                 "snapshot.every=0"}),
                              run_dir, 60),
            0);
}

}  // namespace
}  // namespace tessera
