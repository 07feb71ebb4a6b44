// MP4 videos of rendered frames, encoded by Debian's `ffmpeg` (H.264, yuv420p) fed raw RGB
// frames through a pipe. The file appears whole or not at all: ffmpeg writes NAME.partial.mp4
// beside it, which finish() renames and which an unfinished writer removes.
#pragma once

#include <sys/types.h>
#include <torch/types.h>

#include <cstdint>
#include <string>

namespace tessera::data {

// The ffmpeg on PATH; UserError (saying how to get it) when there is none.
std::string find_ffmpeg();
// UserError unless `path` names an .mp4 file whose folder exists and that is not a folder.
void check_video_path(const std::string& path);

class VideoWriter {
 public:
  // Starts ffmpeg for frames of width x height at `fps` frames per second. An odd width or
  // height is padded by one black pixel (H.264's 4:2:0 needs even sizes).
  VideoWriter(const std::string& path, int64_t width, int64_t height, int fps);
  ~VideoWriter();  // unfinished: stops ffmpeg and removes the partial file
  VideoWriter(const VideoWriter&) = delete;
  VideoWriter& operator=(const VideoWriter&) = delete;

  // One frame, float [H, W, 3] in [0, 1] (clamped; 8 bits per channel, rounded) of the size
  // given at construction.
  void add_frame(const torch::Tensor& image);
  // Ends the stream, waits for ffmpeg and renames the partial file to `path`. UserError when
  // ffmpeg failed (its own message is on stderr).
  void finish();
  int64_t frames() const { return frames_; }

 private:
  void stop();

  std::string path_, partial_;
  int64_t width_, height_, frames_ = 0;
  int pipe_ = -1;
  pid_t pid_ = -1;
};

}  // namespace tessera::data
