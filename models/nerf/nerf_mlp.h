// nerf-mlp: the classic NeRF (Mildenhall et al. 2020): positional encoding, an MLP with a skip
// connection, stratified samples in [near, far] and volume rendering (single level, no grid).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "models/nerf/ray_model.h"
#include "models/nerf/nerf_common.h"

namespace tessera::models::nerf {

// Defaults are sized for CPU training of the 128x128 demo scene in minutes (docs/nerf.md).
struct NerfMlpOptions {
  int position_frequencies = 10;   // NeRF's L = 10 for x
  int direction_frequencies = 4;   // and L = 4 for d
  // The paper's trunk is 8 x 256; 8 x 128 keeps the depth (and the skip) at a quarter of the
  // FLOPs, which a 128 px scene does not miss. The trunk's checkpoint segments are planned
  // by plan_trunk_segments().
  int layers = 8;
  int width = 128;
  int skip_layer = 4;              // layer 4 takes [h, encoded x] as in the paper
  int color_width = 128;           // the paper's 128-wide colour head (W/2 for W = 256)
  int samples_per_ray = 64;        // the paper's coarse N_c = 64 (no fine level)
};

// How the trunk is cut into checkpoint segments: the first layer of each segment, then `layers`.
// The cut minimizes the activation memory peak of a backward with every segment checkpointed,
// under the cost model in docs/nerf.md (8 x 256, skip 4: [0,4), [4,6), [6,8)).
std::vector<int> plan_trunk_segments(const NerfMlpOptions& options, int64_t x_width, int64_t d_width);

class NerfMlp : public Model {
 public:
  NerfMlp(const NerfMlpOptions& options, const ModelContext& context, uint64_t seed);

  std::string name() const override { return "nerf-mlp"; }
  std::vector<ParamGroup> parameter_groups() override;
  RenderResult render(const RayBatch& rays, const StepContext& context) override;
  std::vector<std::string> segment_names() const override;
  void set_checkpointed_segments(const std::vector<std::string>& names) override;
  // mlp0..mlp{n-1} (the trunk's segments) then heads, measured on the samples of `rays` (one forward's worth).
  std::vector<SegmentInfo> measure_segments(const RayBatch& rays, const StepContext& context) override;

 private:
  // What render() computes before the MLP: sample distances, bin lengths and the encodings.
  struct Samples {
    torch::Tensor ts;      // [R, S]
    torch::Tensor deltas;  // [R, S]
    torch::Tensor x_enc;   // [R*S, x width]
    torch::Tensor d_enc;   // [R*S, d width]
  };
  Samples prepare(const RayBatch& rays, const StepContext& context) const;
  int num_trunk_segments() const { return static_cast<int>(segment_begin_.size()) - 1; }
  // Segment k of the trunk: layers [segment_begin_[k], segment_begin_[k + 1]).
  // in: {h, encoded x} -> {h}.
  std::vector<torch::Tensor> trunk_segment(int k, const std::vector<torch::Tensor>& in) const;
  // in: {h, encoded d} -> {sigma_raw [S, 1], rgb [S, 3]}.
  std::vector<torch::Tensor> heads(const std::vector<torch::Tensor>& in) const;
  // [R, S] stratified sample offsets in [0, 1): jittered from (seed, step, ray id) or 0.5.
  torch::Tensor sample_offsets(const RayBatch& rays, const StepContext& context) const;

  NerfMlpOptions options_;
  ModelContext context_;
  std::vector<DenseLayer> trunk_;
  DenseLayer sigma_head_;
  DenseLayer feature_;
  DenseLayer color_hidden_;
  DenseLayer color_out_;
  std::vector<int> segment_begin_;  // first layer of each trunk segment, then `layers`
  std::vector<bool> checkpointed_;  // per segment: trunk segments then heads
};

std::unique_ptr<Model> make_nerf_mlp(const Config& config, const ModelContext& context);

}  // namespace tessera::models::nerf
