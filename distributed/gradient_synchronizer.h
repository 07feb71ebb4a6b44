// Bucketed, fused gradient allreduce overlapped with backward (docs/distributed.md), in the manner of
// PyTorch DDP's Reducer: gradients are copied into flat buckets that are reduced as they fill.
#pragma once

#include <torch/autograd.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "distributed/communicator.h"

namespace tessera::distributed {

class ProcessContext;

struct GradientSyncOptions {
  // DDP's defaults: a small first bucket so that communication starts early in backward, then
  // large buckets so that each allreduce is long enough to reach the link's bandwidth.
  int64_t first_bucket_bytes = int64_t{1} << 20;   // 1 MiB
  int64_t bucket_bytes = int64_t{25} << 20;        // 25 MiB
  // false: param.grad() ends as the sum over ranks (the trainer normalizes each loss by the
  // global ray count, docs/distributed.md). true: the mean over ranks.
  bool average = false;
};

// One flat buffer of parameters of one dtype and device.
struct GradientBucket {
  std::vector<int64_t> params;   // parameter indices, in the order of the buffer
  std::vector<int64_t> offsets;  // element offset of each parameter in the buffer
  int64_t numel = 0;
  int64_t bytes = 0;
  torch::ScalarType dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
};

struct GradientSyncCounters {
  int64_t buckets_launched = 0;  // this step; reset by finish()
  int64_t bytes_reduced = 0;     // since construction
  int64_t allreduce_calls = 0;   // since construction
  int64_t steps = 0;             // finish() calls that reduced
  // Buckets of the last finished step that were launched from hooks, i.e. during backward and
  // overlapped with it (the rest were launched by finish()).
  int64_t last_step_overlapped = 0;
};

// Usage per optimizer step (K micro-batches):
//   for k < K-1: { NoSyncScope no_sync(sync); loss_k.backward(); }
//   loss_{K-1}.backward();   // buckets are reduced as their gradients become ready
//   sync.finish();           // param.grad() now holds the sum (or mean) over ranks
//   optimizer.step(); optimizer.zero_grad();
// Every rank must construct it with the same parameter list (same order, shapes and dtypes)
// and call backward/finish the same number of times. Not copyable or movable: the hooks hold
// `this`. Gradients must be dense.
class GradientSynchronizer {
 public:
  // `params` are leaf tensors with requires_grad, in an order identical on every rank. Throws
  // UserError for a parameter that does not require grad, is not a leaf, is listed twice, has a
  // dtype or device the communicator cannot reduce, or when the bucket layouts of the ranks
  // differ (checked once here, collectively).
  GradientSynchronizer(ProcessContext& context, Communicator& communicator,
                       std::vector<torch::Tensor> params, GradientSyncOptions options = {});
  ~GradientSynchronizer();  // removes the hooks; waits for any allreduce still in flight
  GradientSynchronizer(const GradientSynchronizer&) = delete;
  GradientSynchronizer& operator=(const GradientSynchronizer&) = delete;

  // Disabled: hooks do nothing, gradients accumulate locally in param.grad() and finish() is a
  // no-op. Use for every micro-step but the last.
  void set_sync_enabled(bool enabled);
  bool sync_enabled() const { return enabled_; }

  // Waits for launched buckets, launches the rest (a parameter whose hook did not fire this step
  // contributes its current param.grad(), or zeros when undefined; every rank joins every
  // bucket), writes the reduced values into param.grad() (creating it where undefined) and
  // resets for the next step. Collective when sync is enabled.
  void finish();

  const std::vector<GradientBucket>& buckets() const { return buckets_; }
  const GradientSyncCounters& counters() const { return counters_; }
  // Index of the bucket holding parameter `param`.
  int64_t bucket_of(int64_t param) const { return bucket_of_.at(param); }
  // One line per bucket: "bucket k: dtype device bytes params [i, j, ...]".
  std::string layout_string() const;

 private:
  struct Slot {       // where one parameter lives in the buckets
    int64_t bucket = 0;
    int64_t offset = 0;
  };
  struct BucketState {
    torch::Tensor buffer;             // [numel], flat
    int64_t pending = 0;              // parameters not yet ready this step
    std::unique_ptr<Work> work;       // set once launched this step
  };

  void on_grad_accumulated(int64_t index);   // the post hook of parameter `index`
  void copy_into_slot(int64_t index);        // param.grad() (or zeros) -> bucket slot
  void launch_ready_buckets();               // in bucket order, stops at the first not ready
  void launch(int64_t bucket);
  void reset_step();

  Communicator& communicator_;
  std::vector<torch::Tensor> params_;
  GradientSyncOptions options_;
  std::vector<GradientBucket> buckets_;
  std::vector<int64_t> bucket_of_;
  std::vector<Slot> slots_;

  // Per-step state, guarded by mutex_ (CUDA backward runs hooks on the device's autograd thread).
  std::mutex mutex_;
  std::vector<BucketState> state_;
  std::vector<char> ready_;         // per parameter: hook fired this step
  int64_t next_launch_ = 0;         // buckets [0, next_launch_) are launched
  bool enabled_ = true;
  GradientSyncCounters counters_;

  // The AccumulateGrad nodes are held by the parameters only weakly; keeping them alive keeps
  // the hooks registered across steps (as DDP's Reducer does).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

// RAII: disables synchronization for a non-final micro-step and restores the previous state.
class NoSyncScope {
 public:
  explicit NoSyncScope(GradientSynchronizer& sync) : sync_(sync), previous_(sync.sync_enabled()) {
    sync_.set_sync_enabled(false);
  }
  ~NoSyncScope() { sync_.set_sync_enabled(previous_); }
  NoSyncScope(const NoSyncScope&) = delete;
  NoSyncScope& operator=(const NoSyncScope&) = delete;

 private:
  GradientSynchronizer& sync_;
  bool previous_;
};

}  // namespace tessera::distributed
