// The run directory's lock and the check that every rank sees the same run directory
// (framework/run_lock.h).
#include "framework/run_lock.h"

#include <fcntl.h>
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

#include "distributed/agreement.h"
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

// What a holder line says without its token.
std::string describe(const std::string& holder) { return holder.substr(0, holder.find(" token ")); }

}  // namespace

std::string RunDirLock::path(const std::string& out_dir) {
  return (std::filesystem::path(out_dir) / "run.lock").string();
}

RunDirLock::RunDirLock(distributed::ProcessContext& context, const std::string& out_dir) {
  const std::string file = path(out_dir);
  std::string problem;  // rank 0's: only it takes the lock
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
        holder = describe(holder);
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
  const distributed::Failure locked = distributed::agree_on_failure(context, problem, "run directory lock");
  if (locked.failed()) throw UserError(locked.message);
  if (context.size() == 1) return;

  // Every rank reads the holder line back from its own view of RUN_DIR. Rank 0 reads through its
  // descriptor: closing any other descriptor of the file would drop the process's fcntl lock.
  {
    distributed::Watchdog::Scope watch(context.watchdog(), "run directory lock");
    distributed::broadcast_string(context, line, 0);
  }
  std::string seen;
  if (context.rank() == 0) {
    seen.resize(line.size());
    if (pread(fd_, seen.data(), seen.size(), 0) != static_cast<ssize_t>(seen.size())) seen.clear();
  } else {
    std::ifstream in(file);
    std::getline(in, seen);
  }
  std::string mine;
  if (seen != line) {
    std::error_code ignored;
    const std::string cwd = std::filesystem::current_path(ignored).string();
    mine = "run.out_dir " + out_dir + " is not the same directory on every rank: rank " +
           std::to_string(context.rank()) + " on " + context.info().hostname + " " +
           (seen.empty() ? "does not find " + file + ", which rank 0 just wrote ("
                         : "finds another " + file + " (" + describe(seen) +
                               "), not the one rank 0 just wrote (") +
           describe(line) + ")" +
           (std::filesystem::path(out_dir).is_relative() ? "; the path is relative to " + cwd
                                                          : std::string()) +
           "; put run.out_dir on a filesystem every node shares, as an absolute path";
  }
  const distributed::Failure failure =
      distributed::agree_on_failure(context, mine, "run directory check");
  if (failure.failed()) throw UserError(failure.message);
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the lock
}

}  // namespace tessera
