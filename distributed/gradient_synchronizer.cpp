// GradientSynchronizer: bucket assignment, post-accumulation hooks that launch bucket allreduces
// in order during backward, and finish() that completes, copies back and resets.
#include "distributed/gradient_synchronizer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <unordered_set>

#include "distributed/agreement.h"
#include "distributed/errors.h"
#include "distributed/process_context.h"

namespace tessera::distributed {
namespace {

bool reducible_float(torch::ScalarType t) {
  return t == torch::kFloat32 || t == torch::kFloat64 || t == torch::kBFloat16 ||
         t == torch::kFloat16;
}

std::string param_name(int64_t index) { return "parameter " + std::to_string(index); }

// The assignment rule (identical on every rank, as it depends only on the parameter list and the
// options): walk the parameters in REVERSE order (backward produces the last layers' gradients
// first). Each (dtype, device type) key has one open bucket; a parameter joins the open bucket of
// its key unless that would take the bucket past its limit, in which case the open bucket is
// closed first. A key's first bucket has the limit first_bucket_bytes, the later ones
// bucket_bytes, so a bucket exceeds its limit only when it holds a single larger parameter.
// Buckets are numbered by the position (in the reverse walk) of their first parameter: bucket 0
// holds the last parameter, and buckets are launched in that order.
std::vector<GradientBucket> assign_buckets(const std::vector<torch::Tensor>& params,
                                           const GradientSyncOptions& options) {
  struct Open {
    GradientBucket bucket;
    int64_t first_pos = 0;
    int64_t closed = 0;  // buckets already closed for this key
  };
  std::map<std::string, Open> open;  // ordered: deterministic
  std::vector<std::pair<int64_t, GradientBucket>> closed;
  const int64_t n = static_cast<int64_t>(params.size());
  for (int64_t pos = 0; pos < n; ++pos) {
    const int64_t index = n - 1 - pos;
    const torch::Tensor& p = params[index];
    const std::string key = std::string(c10::toString(p.scalar_type())) + "/" +
                            c10::DeviceTypeName(p.device().type());
    Open& o = open[key];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    const int64_t limit = o.closed == 0 ? options.first_bucket_bytes : options.bucket_bytes;
    if (!o.bucket.params.empty() && o.bucket.bytes + bytes > limit) {
      closed.emplace_back(o.first_pos, std::move(o.bucket));
      o.bucket = GradientBucket{};
      ++o.closed;
    }
    if (o.bucket.params.empty()) {
      o.first_pos = pos;
      o.bucket.dtype = p.scalar_type();
      o.bucket.device = p.device();
    }
    o.bucket.params.push_back(index);
    o.bucket.offsets.push_back(o.bucket.numel);
    o.bucket.numel += p.numel();
    o.bucket.bytes += bytes;
  }
  for (auto& [key, o] : open)
    if (!o.bucket.params.empty()) closed.emplace_back(o.first_pos, std::move(o.bucket));
  std::sort(closed.begin(), closed.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<GradientBucket> buckets;
  for (auto& [pos, bucket] : closed) buckets.push_back(std::move(bucket));
  return buckets;
}

}  // namespace

GradientSynchronizer::GradientSynchronizer(ProcessContext& context, Communicator& communicator,
                                           std::vector<torch::Tensor> params,
                                           GradientSyncOptions options)
    : communicator_(communicator), params_(std::move(params)), options_(options) {
  if (options_.first_bucket_bytes <= 0 || options_.bucket_bytes <= 0)
    throw UserError("gradient synchronization: bucket sizes must be positive (first_bucket_bytes " +
                    std::to_string(options_.first_bucket_bytes) + ", bucket_bytes " +
                    std::to_string(options_.bucket_bytes) + ")");
  const torch::Device comm_device = communicator_.device();
  std::unordered_set<const void*> seen;
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    const torch::Tensor& p = params_[i];
    if (!p.defined()) throw UserError("gradient synchronization: " + param_name(i) + " is undefined");
    if (!p.requires_grad())
      throw UserError("gradient synchronization: " + param_name(i) +
                      " does not require grad; pass only trainable parameters");
    if (!p.is_leaf())
      throw UserError("gradient synchronization: " + param_name(i) +
                      " is not a leaf tensor (it has a grad_fn); pass the model's parameters");
    if (!seen.insert(p.unsafeGetTensorImpl()).second)
      throw UserError("gradient synchronization: " + param_name(i) + " is listed twice");
    if (!reducible_float(p.scalar_type()))
      throw UserError("gradient synchronization: " + param_name(i) + " has dtype " +
                      c10::toString(p.scalar_type()) +
                      "; gradients of float32, float64, bfloat16 or float16 can be reduced");
    const bool same_device = p.device().type() == comm_device.type() &&
                             (!p.device().has_index() || !comm_device.has_index() ||
                              p.device().index() == comm_device.index());
    if (!same_device)
      throw UserError("gradient synchronization: " + param_name(i) + " is on " +
                      p.device().str() + " but the " + to_string(communicator_.backend()) +
                      " communicator reduces " + comm_device.str() + " tensors");
  }

  buckets_ = assign_buckets(params_, options_);
  bucket_of_.assign(params_.size(), -1);
  slots_.assign(params_.size(), Slot{});
  for (int64_t b = 0; b < static_cast<int64_t>(buckets_.size()); ++b) {
    for (size_t k = 0; k < buckets_[b].params.size(); ++k) {
      bucket_of_[buckets_[b].params[k]] = b;
      slots_[buckets_[b].params[k]] = Slot{b, buckets_[b].offsets[k]};
    }
  }

  // Collective: ranks whose parameter lists differ (count, order, shape, dtype) or whose options
  // differ would reduce mismatched buffers, so they stop here with a clear error instead.
  std::ostringstream text;
  text << "params " << params_.size() << "\n";
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i)
    text << i << " " << c10::toString(params_[i].scalar_type()) << " " << params_[i].sizes() << "\n";
  text << layout_string();
  check_same_on_all_ranks(context, fingerprint(text.str()),
                          "the gradient bucket layout (parameter count, order, shapes and dtypes, "
                          "and bucket sizes)");

  state_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b)
    state_[b].buffer = torch::zeros(
        {buckets_[b].numel}, torch::TensorOptions().dtype(buckets_[b].dtype).device(buckets_[b].device));
  ready_.assign(params_.size(), 0);
  reset_step();

  // Hook mechanism: a post hook on each parameter's AccumulateGrad node, as PyTorch's C++ DDP
  // Reducer does. It runs after the incoming gradient has been added to param.grad(), so it sees
  // the ACCUMULATED gradient (all earlier no-sync micro-steps included), and it fires once per
  // backward even when the parameter is used several times in the graph (the engine sums the
  // uses before the node runs). Tensor::register_hook on the leaf would instead see the incoming
  // gradient before accumulation, and the per-tensor post-accumulate-grad slot of LibTorch holds
  // only Python hooks.
  accumulators_.reserve(params_.size());
  hook_keys_.reserve(params_.size());
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params_[i]);
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list& /*inputs*/) {
          on_grad_accumulated(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(acc));
  }
}

GradientSynchronizer::~GradientSynchronizer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
  try {
    for (auto& s : state_)
      if (s.work) s.work->wait();
  } catch (...) {
    // A failed collective has already been reported; a destructor must not throw.
  }
}

void GradientSynchronizer::set_sync_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  enabled_ = enabled;
}

void GradientSynchronizer::reset_step() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    state_[b].pending = static_cast<int64_t>(buckets_[b].params.size());
    state_[b].work.reset();
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  counters_.buckets_launched = 0;
}

void GradientSynchronizer::copy_into_slot(int64_t index) {
  const torch::Tensor& p = params_[index];
  const Slot& slot = slots_[index];
  torch::Tensor view = state_[slot.bucket].buffer.narrow(0, slot.offset, p.numel());
  const torch::Tensor& grad = p.grad();
  if (!grad.defined()) {
    view.zero_();
    return;
  }
  if (grad.layout() != torch::kStrided)
    throw UserError("gradient synchronization: " + param_name(index) +
                    " has a sparse gradient; only dense gradients can be bucketed");
  view.view(grad.sizes()).copy_(grad);
}

void GradientSynchronizer::on_grad_accumulated(int64_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled_) return;
  if (ready_[index])
    throw UserError("gradient synchronization: the gradient of " + param_name(index) +
                    " became ready twice in one synchronized step; run every backward but the "
                    "last of a step inside a NoSyncScope, and call finish() after the last");
  ready_[index] = 1;
  torch::NoGradGuard no_grad;
  copy_into_slot(index);
  if (--state_[slots_[index].bucket].pending == 0) launch_ready_buckets();
}

void GradientSynchronizer::launch_ready_buckets() {
  // Collectives must be issued in the same order on every rank, so bucket k starts only after
  // buckets < k; a later bucket that fills early waits for the earlier ones.
  while (next_launch_ < static_cast<int64_t>(buckets_.size()) && state_[next_launch_].pending == 0)
    launch(next_launch_++);
}

void GradientSynchronizer::launch(int64_t bucket) {
  BucketState& s = state_[bucket];
  s.work = communicator_.allreduce_async(s.buffer, options_.average ? ReduceOp::Avg : ReduceOp::Sum);
  ++counters_.buckets_launched;
  ++counters_.allreduce_calls;
  counters_.bytes_reduced += buckets_[bucket].bytes;
}

void GradientSynchronizer::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled_) return;
  torch::NoGradGuard no_grad;
  counters_.last_step_overlapped = counters_.buckets_launched;
  // Parameters whose hook did not fire (unused this step, or backward ran without hooks):
  // contribute what param.grad() holds, zeros when undefined. Every rank joins every bucket.
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    if (ready_[i]) continue;
    ready_[i] = 1;
    copy_into_slot(i);
    --state_[slots_[i].bucket].pending;
  }
  launch_ready_buckets();
  for (auto& s : state_) s.work->wait();
  for (int64_t i = 0; i < static_cast<int64_t>(params_.size()); ++i) {
    torch::Tensor& p = params_[i];
    const Slot& slot = slots_[i];
    const torch::Tensor reduced =
        state_[slot.bucket].buffer.narrow(0, slot.offset, p.numel()).view(p.sizes());
    if (p.grad().defined())
      p.mutable_grad().copy_(reduced);
    else
      p.mutable_grad() = reduced.clone();
  }
  ++counters_.steps;
  reset_step();
}

std::string GradientSynchronizer::layout_string() const {
  std::ostringstream out;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const GradientBucket& bucket = buckets_[b];
    out << "bucket " << b << ": " << c10::toString(bucket.dtype) << " "
        << c10::DeviceTypeName(bucket.device.type(), /*lower_case=*/true) << " " << bucket.bytes
        << " bytes, params [";
    for (size_t k = 0; k < bucket.params.size(); ++k) out << (k ? ", " : "") << bucket.params[k];
    out << "]\n";
  }
  return out.str();
}

}  // namespace tessera::distributed
