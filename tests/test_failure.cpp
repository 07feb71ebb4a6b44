// Failure handling of a real multi-rank job: a rank killed mid-collective, a stalled rank, a
// frozen rank (the heartbeat) and a rank raising an error must end every process of the job
// within 60 s with a non-zero code; a job suspended as a whole must not be taken for a loss.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace {

namespace fs = std::filesystem;

// docs/distributed.md: nothing may hang; every rank must be gone within this.
constexpr auto kDeadline = std::chrono::seconds(60);
constexpr int kRanks = 3;

struct JobResult {
  bool finished = false;
  int exit_code = -1;
  double seconds = 0;
  std::string output;
  std::vector<pid_t> rank_pids;
};

bool process_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  // A zombie (Z) or dead (X) process no longer runs; only its parent has not reaped it.
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z' &&
         line[paren + 2] != 'X';
}

std::vector<pid_t> read_rank_pids(const fs::path& dir) {
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    std::ifstream pid_file(dir / ("rank-" + std::to_string(r) + ".pid"));
    pid_t pid = 0;
    if (pid_file >> pid) pids.push_back(pid);
  }
  return pids;
}

// Runs `mpiexec -n 3 failure_probe MODE DIR TIMEOUT HEARTBEAT` in its own process group;
// `during(dir)`, if given, runs while the job does.
JobResult run_job(const std::string& mode, double timeout_s, double heartbeat_s = 0.0,
                  const std::function<void(const fs::path&)>& during = nullptr) {
  const char* mpiexec = std::getenv("TESSERA_MPIEXEC");
  EXPECT_NE(mpiexec, nullptr) << "TESSERA_MPIEXEC is unset (run through ctest)";
  JobResult result;
  if (mpiexec == nullptr) return result;
  const fs::path dir = fs::temp_directory_path() /
                       ("tessera-failure-" + mode + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path log = dir / "output.txt";
  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child == 0) {
    setpgid(0, 0);
    std::freopen(log.c_str(), "w", stdout);
    dup2(fileno(stdout), fileno(stderr));
    const std::string timeout = std::to_string(timeout_s);
    const std::string heartbeat = std::to_string(heartbeat_s);
    execlp(mpiexec, mpiexec, "-n", std::to_string(kRanks).c_str(), "--oversubscribe",
           TESSERA_FAILURE_PROBE, mode.c_str(), dir.c_str(), timeout.c_str(), heartbeat.c_str(),
           nullptr);
    _exit(127);
  }
  if (during) during(dir);
  int status = 0;
  while (std::chrono::steady_clock::now() - start < kDeadline) {
    if (waitpid(child, &status, WNOHANG) == child) {
      result.finished = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.rank_pids = read_rank_pids(dir);
  if (!result.finished) {  // a hang: clean up so the suite itself cannot hang
    kill(-child, SIGKILL);
    for (pid_t pid : result.rank_pids) kill(pid, SIGKILL);
    waitpid(child, &status, 0);
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  result.output = text.str();
  fs::remove_all(dir);
  return result;
}

void expect_all_ranks_gone(const JobResult& job) {
  EXPECT_EQ(job.rank_pids.size(), static_cast<size_t>(kRanks)) << "not every rank started";
  // mpiexec has returned; its ranks may take a moment to be torn down.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (pid_t pid : job.rank_pids) {
    while (process_alive(pid) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(process_alive(pid)) << "rank process " << pid << " outlived the job";
  }
}

TEST(Failure, RankKilledMidCollectiveEndsTheJob) {
  const JobResult job = run_job("kill", 600.0);
  ASSERT_TRUE(job.finished) << "job still running after 60 s:\n" << job.output;
  EXPECT_NE(job.exit_code, 0) << job.output;
  EXPECT_LT(job.seconds, 60.0);
  expect_all_ranks_gone(job);
}

TEST(Failure, StalledPeerTimesOutWithExitCode3) {
  const JobResult job = run_job("stall", 3.0);
  ASSERT_TRUE(job.finished) << "job still running after 60 s:\n" << job.output;
  EXPECT_EQ(job.exit_code, 3) << job.output;
  EXPECT_NE(job.output.find("did not complete within 3 s"), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("tessera: rank "), std::string::npos) << "no rank named:\n" << job.output;
  expect_all_ranks_gone(job);
}

// A rank whose every thread stops (a node gone, seen from its peers, is the same silence): the
// watchdog's timeout is 600 s, so only the heartbeat can end the job within the deadline.
TEST(Failure, FrozenRankEndsTheJobThroughTheHeartbeat) {
  const JobResult job = run_job("freeze", 600.0, 2.0);
  ASSERT_TRUE(job.finished) << "job still running after 60 s:\n" << job.output;
  EXPECT_EQ(job.exit_code, 3) << job.output;
  // Rank 0 watches rank 2, the frozen one.
  EXPECT_NE(job.output.find("rank 2 on "), std::string::npos) << job.output;
  EXPECT_NE(job.output.find("sent no heartbeat for 2 s"), std::string::npos) << job.output;
  expect_all_ranks_gone(job);
}

// The whole job stopped (SIGSTOP to every rank, as `scontrol suspend` does) for twice the
// heartbeat's silence, then continued: no rank may take that for a lost peer.
TEST(Failure, SuspendedJobIsNotTakenForALostRank) {
  constexpr double kHeartbeatS = 2.0;
  const auto suspend = [](const fs::path& dir) {
    std::vector<pid_t> pids;
    for (int i = 0; i < 300 && pids.size() < static_cast<size_t>(kRanks); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      pids = read_rank_pids(dir);
    }
    ASSERT_EQ(pids.size(), static_cast<size_t>(kRanks)) << "the ranks did not start";
    std::this_thread::sleep_for(std::chrono::seconds(1));
    for (pid_t pid : pids) kill(pid, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::duration<double>(2 * kHeartbeatS + 1));
    for (pid_t pid : pids) kill(pid, SIGCONT);
  };
  const JobResult job = run_job("pause", 600.0, kHeartbeatS, suspend);
  ASSERT_TRUE(job.finished) << "job still running after 60 s:\n" << job.output;
  EXPECT_EQ(job.exit_code, 0) << job.output;
  EXPECT_EQ(job.output.find("heartbeat"), std::string::npos) << job.output;
  expect_all_ranks_gone(job);
}

TEST(Failure, ErrorOnOneRankAbortsAllWithExitCode3) {
  const JobResult job = run_job("throw", 600.0);
  ASSERT_TRUE(job.finished) << "job still running after 60 s:\n" << job.output;
  EXPECT_EQ(job.exit_code, 3) << job.output;
  EXPECT_NE(job.output.find("rank 2: injected failure"), std::string::npos) << job.output;
  expect_all_ranks_gone(job);
}

}  // namespace
