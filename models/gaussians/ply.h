// INRIA 3DGS .ply export and import: binary little-endian float32 vertices with the properties
// x y z nx ny nz f_dc_0..2 f_rest_0..44 opacity scale_0..2 rot_0..3, values before activation.
#pragma once

#include <array>
#include <cstdint>
#include <cstdio>
#include <string>

#include <torch/types.h>

#include "models/gaussians/gaussian_params.h"

namespace tessera::models::gaussians {

// Float properties per vertex written by write_ply (3 + 3 + 3 + 45 + 1 + 3 + 4).
constexpr int64_t kPlyProperties = 62;

// The exact header write_ply writes for n Gaussians (ends with "end_header\n").
std::string ply_header(int64_t n);

// Writes `params` (any device) to `path` atomically: into "<path>.tmp-<pid>", then renamed. The
// normals are zero; f_rest is channel-major: f_rest_{c * 15 + k} = sh_rest[:, k, c]. Throws
// UserError when the file cannot be written (the temporary file is removed).
void write_ply(const std::string& path, const GaussianParams& params);

// The same file written in pieces, so that a scene larger than one process's memory can be
// exported a chunk at a time: the header for `count` Gaussians at construction, then append()
// the rows in order, then finish(), which checks that `count` rows came and renames the
// temporary file into place. Destroyed unfinished (an exception), it removes the temporary file:
// `path` is whole or untouched.
class PlyWriter {
 public:
  PlyWriter(const std::string& path, int64_t count);
  ~PlyWriter();
  PlyWriter(const PlyWriter&) = delete;
  PlyWriter& operator=(const PlyWriter&) = delete;
  void append(const GaussianParams& rows);
  void finish();

 private:
  std::string path_, tmp_;
  int64_t count_ = 0, written_ = 0;
  std::FILE* file_ = nullptr;
};

// Reads an INRIA-layout .ply. Properties are found by name (any order; normals optional; other
// float properties ignored); f_rest may hold 0, 9, 24 or 45 values (SH degree 0..3), missing
// higher coefficients are zero. Throws tessera::UserError naming the file and the problem for
// anything else: not a ply, not binary_little_endian 1.0, no vertex element or another element,
// a non-float or list property, a missing property, an f_rest count or numbering that is not a
// degree's, a vertex count that is not a number, or a data size that does not match the count.
// The tensors are float32 leaves that require grad, on `device`.
// With parts > 1 only the even slice `part` of the vertices is read (the whole file is still
// validated); `total` receives the file's vertex count.
GaussianParams read_ply(const std::string& path, torch::Device device = torch::kCPU,
                        int64_t part = 0, int64_t parts = 1, int64_t* total = nullptr);

// PLY files are in the capture's own coordinates (the dataset's normalization undone: docs/
// datasets.md, "Scene normalization"), training is in the dataset's world. The normalization is a
// similarity without rotation, world = scale * capture + offset, so only means and log_scales
// change; rotations, opacities and SH coefficients are the same in both.
// In place on detached copies: returns new tensors (leaves that require grad, like read_ply's).
GaussianParams world_to_capture(const GaussianParams& params, double scale,
                                const std::array<double, 3>& offset);
GaussianParams capture_to_world(const GaussianParams& params, double scale,
                                const std::array<double, 3>& offset);

}  // namespace tessera::models::gaussians
