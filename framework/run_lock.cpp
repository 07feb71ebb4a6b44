// The run directory's lock and the check that every rank sees the same run directory
// (framework/run_lock.h).
#include "framework/run_lock.h"

#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "distributed/errors.h"
#include "distributed/watchdog.h"

namespace tessera {

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// What run.lock says of its holder: one line, also the token the other ranks look for.
std::string holder_line(const std::string& hostname) {
  std::random_device entropy;
  const uint64_t token = (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^
                         static_cast<uint64_t>(getpid()) ^
                         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const std::time_t now = std::time(nullptr);
  char when[32] = {0};
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  std::ostringstream line;
  line << "host " << hostname << " pid " << getpid() << " job "
       << env_or("SLURM_JOB_ID", "none") << " since " << when << " token " << std::hex << token;
  return line.str();
}

// Sends rank `root`'s text to every rank. Collective.
std::string broadcast_text(distributed::ProcessContext& context, std::string text, int root,
                           const std::string& what) {
  distributed::Watchdog::Scope watch(context.watchdog(), what);
  int length = static_cast<int>(text.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, root, context.world()));
  text.resize(static_cast<size_t>(length));
  MPI_CHECK(MPI_Bcast(text.data(), length, MPI_CHAR, root, context.world()));
  return text;
}

}  // namespace

std::string RunDirLock::path(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / "run.lock").string();
}

RunDirLock::RunDirLock(distributed::ProcessContext& context, const std::string& out_dir) {
  const std::string file = path(out_dir);
  std::string problem;  // rank 0's, agreed below
  std::string line;
  if (context.rank() == 0) {
    std::error_code ignored;
    std::filesystem::create_directories(out_dir, ignored);
    fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      problem = "cannot open " + file + ": " + std::strerror(errno) + "; check run.out_dir";
    } else {
      struct flock lock {};
      lock.l_type = F_WRLCK;
      lock.l_whence = SEEK_SET;
      if (fcntl(fd_, F_SETLK, &lock) != 0) {
        const int error = errno;
        std::ifstream in(file);
        std::string holder;
        std::getline(in, holder);
        const size_t token_at = holder.find(" token ");
        if (token_at != std::string::npos) holder.resize(token_at);
        problem = error == EAGAIN || error == EACCES
                      ? "run.out_dir " + out_dir + " is in use by another training job (" +
                            (holder.empty() ? std::string("holder unknown") : holder) +
                            "); stop that job or give this one another run.out_dir"
                      : "cannot lock " + file + ": " + std::strerror(error) +
                            " (the filesystem of run.out_dir must support POSIX locks, as "
                            "local disks, NFSv4 and Lustre do)";
        ::close(fd_);
        fd_ = -1;
      } else {
        line = holder_line(context.info().hostname);
        const std::string text = line + "\n";
        if (ftruncate(fd_, 0) != 0 ||
            pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()) ||
            fsync(fd_) != 0)
          problem = "cannot write " + file + ": " + std::strerror(errno);
      }
    }
  }
  problem = broadcast_text(context, problem, 0, "run directory lock");
  if (!problem.empty()) throw UserError(problem);
  if (context.size() == 1) return;

  // Every rank reads the holder line back from its own view of RUN_DIR. Rank 0 reads through its
  // descriptor: closing any other descriptor of the file would drop the process's fcntl lock.
  line = broadcast_text(context, line, 0, "run directory lock");
  std::string seen;
  if (context.rank() == 0) {
    seen.resize(line.size());
    if (pread(fd_, seen.data(), seen.size(), 0) != static_cast<ssize_t>(seen.size())) seen.clear();
  } else {
    std::ifstream in(file);
    std::getline(in, seen);
  }
  int first_bad = seen == line ? context.size() : context.rank();
  {
    distributed::Watchdog::Scope watch(context.watchdog(), "run directory check");
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, context.world()));
  }
  if (first_bad == context.size()) return;
  std::string mine;
  if (context.rank() == first_bad) {
    std::error_code ignored;
    const std::string cwd = std::filesystem::current_path(ignored).string();
    const auto describe = [](const std::string& holder) {
      return holder.substr(0, holder.find(" token "));
    };
    mine = "run.out_dir " + out_dir + " is not the same directory on every rank: rank " +
           std::to_string(first_bad) + " on " + context.info().hostname + " " +
           (seen.empty() ? "does not find " + file + ", which rank 0 just wrote ("
                         : "finds another " + file + " (" + describe(seen) +
                               "), not the one rank 0 just wrote (") +
           describe(line) + ")" +
           (std::filesystem::path(out_dir).is_relative() ? "; the path is relative to " + cwd
                                                          : std::string()) +
           "; put run.out_dir on a filesystem every node shares, as an absolute path";
  }
  throw UserError(broadcast_text(context, mine, first_bad, "run directory check"));
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock
}

}  // namespace tessera
