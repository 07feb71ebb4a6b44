#include "framework/data/video.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "distributed/errors.h"
#include "framework/data/image_io.h"

extern char** environ;

namespace tessera::data {

namespace fs = std::filesystem;

std::string find_ffmpeg() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / "ffmpeg";
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  throw UserError("--video needs ffmpeg, which is not on PATH: install Debian's ffmpeg "
                  "(`apt-get install ffmpeg`; launch/setup does), or render PNGs with --out only");
}

void check_video_path(const std::string& path) {
  const fs::path p(path);
  if (p.extension() != ".mp4")
    throw UserError("--video " + path + ": the video must be an .mp4 file (H.264)");
  if (fs::is_directory(p)) throw UserError("--video " + path + " is a folder");
  const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(parent))
    throw UserError("--video " + path + ": the folder " + parent.string() + " does not exist");
}

VideoWriter::VideoWriter(const std::string& path, int64_t width, int64_t height, int fps)
    : path_(path), width_(width), height_(height) {
  const fs::path p(path);
  partial_ = (p.parent_path() / (p.stem().string() + ".partial.mp4")).string();
  const std::string ffmpeg = find_ffmpeg();
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  fcntl(fds[1], F_SETFD, FD_CLOEXEC);  // ffmpeg must not hold the write end, or it never ends
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  const std::vector<std::string> args = {
      ffmpeg, "-hide_banner", "-loglevel", "error", "-nostdin", "-y",
      "-f", "rawvideo", "-pix_fmt", "rgb24",
      "-s", std::to_string(width) + "x" + std::to_string(height),
      "-framerate", std::to_string(fps), "-i", "pipe:0",
      "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264", "-crf", "18",
      "-pix_fmt", "yuv420p", "-movflags", "+faststart", "-f", "mp4", partial_};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // -nostdin is for ffmpeg's keyboard commands; the frames come through pipe:0 all the same.
  const int rc = posix_spawn(&pid_, ffmpeg.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[0]);
  if (rc != 0) {
    close(fds[1]);
    pid_ = -1;
    throw UserError("cannot start " + ffmpeg + ": " + std::strerror(rc));
  }
  pipe_ = fds[1];
}

VideoWriter::~VideoWriter() {
  if (pid_ < 0) return;
  stop();
  std::error_code ec;
  fs::remove(partial_, ec);
}

void VideoWriter::stop() {
  if (pipe_ >= 0) close(pipe_);
  pipe_ = -1;
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
}

void VideoWriter::add_frame(const torch::Tensor& image) {
  if (image.dim() != 3 || image.size(0) != height_ || image.size(1) != width_ || image.size(2) != 3)
    throw std::invalid_argument("VideoWriter::add_frame: a frame of another size than " +
                                std::to_string(width_) + "x" + std::to_string(height_));
  const torch::Tensor bytes = unit_to_bytes(image);
  const char* data = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  size_t left = static_cast<size_t>(bytes.numel());
  // A dead ffmpeg must give EPIPE here, not a SIGPIPE that ends the process.
  struct sigaction ignore = {}, previous = {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ignore, &previous);
  while (left > 0) {
    const ssize_t n = write(pipe_, data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      sigaction(SIGPIPE, &previous, nullptr);
      throw UserError("ffmpeg stopped taking frames (" + std::string(std::strerror(err)) +
                      "); its message is above");
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
  sigaction(SIGPIPE, &previous, nullptr);
  ++frames_;
}

void VideoWriter::finish() {
  close(pipe_);
  pipe_ = -1;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::error_code ec;
    fs::remove(partial_, ec);
    throw UserError("ffmpeg could not write " + path_ + " (its message is above)");
  }
  fs::rename(partial_, path_);
}

}  // namespace tessera::data
