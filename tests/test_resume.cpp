// `tessera train` end to end in new processes under mpiexec: snapshots and resume (DESIGN
// invariants 4 and 6: exact resume, another world size, a killed rank, SIGTERM) and 3DGS runs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "framework/snapshot.h"

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
        << "[train]\nsteps = 24\nrays_per_step = 256\nlog_every = 4\n"
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
  for (const char* needle : {"tessera-snapshot version 1", "step:         24", "model:        nerf-hash",
                             "world size:   2 rank(s)", "checksums:    all datasets verified",
                             "[model]", "hash_grid.0 ["})
    EXPECT_NE(info.output.find(needle), std::string::npos) << needle << "\n" << info.output;
  const Job eval = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "eval", final_snapshot}, 120);
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  EXPECT_NE(eval.output.find("{\"model\":\"nerf-hash\",\"ranks\":2,"), std::string::npos) << eval.output;
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

// model.name = "gaussians" on 2 ranks: trains with densification, writes metrics, eval renders and
// the INRIA PLY; resuming a Gaussian run is refused until its snapshots exist.
TEST_F(ResumeTest, GaussiansTrainOnTwoRanksAndExportPly) {
  std::ofstream(dir_ + "/gaussians.toml")
      << "[data]\npath = \"" << dir_ << "/scene.h5\"\n"
      << "[model]\nname = \"gaussians\"\ndensify_from = 5\ndensify_until = 16\ndensify_every = 5\n"
      << "densify_grad_threshold = 2e-5\n"
      << "[train]\nsteps = 20\nlog_every = 10\n"
      << "[eval]\nmax_views = 1\n"
      << "[distributed]\nthreads = 1\n";
  const std::string out = dir_ + "/gs";
  const Job job = run({mpiexec_, "-n", "2", "--oversubscribe", binary_, "train",
                       dir_ + "/gaussians.toml", "--set", "run.out_dir=" + out}, 180);
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
  std::ifstream ply(out + "/gaussians.ply", std::ios::binary);
  std::string first;
  std::getline(ply, first);
  EXPECT_EQ(first, "ply");
  EXPECT_NE(job.output.find("initial Gaussians on 2 rank(s)"), std::string::npos) << job.output;

  const Job resume = run({binary_, "train", dir_ + "/gaussians.toml", "--set",
                          "run.out_dir=" + out, "--resume", "auto"}, 60);
  EXPECT_EQ(resume.exit_code, 2) << resume.output;
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

// SIGTERM to every rank (as a scheduler sends at a time limit): one snapshot, exit code 0.
TEST_F(ResumeTest, SigtermWritesASnapshotAndExitsCleanly) {
  const std::string run_dir = dir_ + "/term";
  bool sent = false;
  const Job job = run(train(2, run_dir, {"--set", "train.steps=100000", "--set",
                                          "snapshot.every=0"}), 60, [&] {
    if (sent) return;
    const auto ranks = processes_with(run_dir, binary_);
    if (ranks.size() < 2 || !fs::exists(run_dir + "/metrics.jsonl") ||
        fs::file_size(run_dir + "/metrics.jsonl") == 0)
      return;  // wait until training is under way
    for (pid_t pid : ranks) kill(pid, SIGTERM);
    sent = true;
  });
  ASSERT_TRUE(sent) << job.output;
  ASSERT_TRUE(job.finished) << job.output;
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_NE(job.output.find("stopped by a signal"), std::string::npos) << job.output;
  const auto newest = find_latest_snapshot(run_dir + "/snapshots");
  ASSERT_TRUE(newest.has_value()) << job.output;
  EXPECT_GT(*snapshot_step(*newest), 0);
}

}  // namespace
}  // namespace tessera
