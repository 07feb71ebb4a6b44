// GradientSynchronizer against a reference computed without synchronization: every rank replays
// every rank's deterministic data locally and sums. Runs under mpiexec -n 1, 2 and 3 (MPI backend;
// NCCL on CUDA parameters where every rank has a GPU).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "distributed/agreement.h"
#include "distributed/communicator.h"
#include "distributed/errors.h"
#include "distributed/gradient_synchronizer.h"
#include "tests/cuda_skip.h"
#include "tests/mpi_test_env.h"

namespace tessera::distributed {
namespace {

Communicator& comm() { return test::cpu_world(); }
int rank() { return comm().rank(); }
int size() { return comm().size(); }

// Logs the number of elements outside |got - want| <= atol + rtol |want| and fails unless zero.
// With rtol = atol = 0 the comparison is exact.
void report(const std::string& what, const torch::Tensor& got, const torch::Tensor& want,
            double rtol = 0.0, double atol = 0.0) {
  int64_t wrong = 0;
  if (!got.defined() || got.sizes() != want.sizes()) {
    wrong = std::max<int64_t>(want.numel(), 1);
  } else {
    const torch::Tensor g = got.to(torch::kFloat64), w = want.to(torch::kFloat64);
    wrong = ((g - w).abs() > atol + rtol * w.abs()).sum().item<int64_t>();
  }
  if (wrong != 0)
    std::fprintf(stderr, "[rank %d] %s: %lld wrong of %lld elements\n", rank(), what.c_str(),
                 static_cast<long long>(wrong), static_cast<long long>(want.numel()));
  EXPECT_EQ(wrong, 0) << what;
}

// Small integers in [-3, 3]: every gradient of the model below is an integer small enough to be
// exact in float32, so sums over ranks and micro-batches are exact in any order.
torch::Tensor ints(int64_t salt, at::IntArrayRef shape, torch::ScalarType dtype) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return ((torch::arange(n, torch::kInt64) * 5 + salt * 3) % 7 - 3).to(dtype).reshape(shape);
}

// Parameter indices of the model; the order is the constructor's (identical on every rank).
enum Param : int64_t { kW1, kB1, kW2, kB2, kU, kW3, kE, kParamCount };

// A small model with float64 and float32 parameters of different sizes:
// y = W3 (W2 relu(W1 x + b1) + b2), loss = sum(c * y) + sum(E * e) + sum(U * u).
std::vector<torch::Tensor> make_params() {
  std::vector<torch::Tensor> p(kParamCount);
  p[kW1] = ints(101, {6, 5}, torch::kFloat64);
  p[kB1] = ints(102, {6}, torch::kFloat64);
  p[kW2] = ints(103, {4, 6}, torch::kFloat32);
  p[kB2] = ints(104, {4}, torch::kFloat32);
  p[kU] = ints(105, {10}, torch::kFloat64);
  p[kW3] = ints(106, {3, 4}, torch::kFloat64);
  p[kE] = ints(107, {300}, torch::kFloat64);
  for (auto& t : p) t.requires_grad_(true);
  return p;
}

struct Batch {
  torch::Tensor x;  // [5, B]
  torch::Tensor c;  // [3, B]
  torch::Tensor e;  // [300]
  torch::Tensor u;  // [10], undefined when U is unused
};

constexpr int64_t kRaysPerBatch = 4;

// Deterministic data of (rank, micro-step, step): what that rank sees, reproducible anywhere.
Batch batch(int r, int micro, int step, bool use_u) {
  const int64_t salt = r * 31 + micro * 7 + step * 101;
  Batch b;
  b.x = ints(salt + 1, {5, kRaysPerBatch}, torch::kFloat64);
  b.c = ints(salt + 2, {3, kRaysPerBatch}, torch::kFloat64);
  b.e = ints(salt + 3, {300}, torch::kFloat64);
  if (use_u) b.u = ints(salt + 4, {10}, torch::kFloat64);
  return b;
}

torch::Tensor loss(const std::vector<torch::Tensor>& p, const Batch& b) {
  const torch::Tensor h = torch::relu(p[kW1].mm(b.x) + p[kB1].unsqueeze(1));          // [6, B]
  const torch::Tensor g = (p[kW2].mm(h.to(torch::kFloat32)) + p[kB2].unsqueeze(1))    // [4, B]
                              .to(torch::kFloat64);
  torch::Tensor l = (b.c * p[kW3].mm(g)).sum() + (p[kE] * b.e).sum();
  if (b.u.defined()) l = l + (p[kU] * b.u).sum();
  return l;
}

// The reference: the sum of the unsynchronized gradients of every batch in `batches`, computed
// locally on fresh parameters. A parameter no batch reaches gets zeros.
std::vector<torch::Tensor> reference_grads(const std::vector<Batch>& batches) {
  std::vector<torch::Tensor> p = make_params();
  for (const Batch& b : batches) loss(p, b).backward();
  std::vector<torch::Tensor> grads;
  for (auto& t : p) grads.push_back(t.grad().defined() ? t.grad().clone() : torch::zeros_like(t));
  return grads;
}

void clear_grads(std::vector<torch::Tensor>& p) {
  for (auto& t : p) t.mutable_grad() = torch::Tensor();
}

void report_grads(const std::string& what, const std::vector<torch::Tensor>& p,
                  const std::vector<torch::Tensor>& want, double rtol = 0.0, double atol = 0.0) {
  for (size_t i = 0; i < p.size(); ++i)
    report(what + "/param " + std::to_string(i), p[i].grad(), want[i], rtol, atol);
}

// Small buckets so that the model spreads over several.
GradientSyncOptions small_buckets() {
  GradientSyncOptions o;
  o.first_bucket_bytes = 128;
  o.bucket_bytes = 256;
  return o;
}

TEST(GradientSync, GradEqualsSumOverRanks) {
  for (const bool small : {false, true}) {
    std::vector<torch::Tensor> p = make_params();
    GradientSynchronizer sync(*test::g_context, comm(), p,
                              small ? small_buckets() : GradientSyncOptions{});
    loss(p, batch(rank(), 0, 0, true)).backward();
    sync.finish();
    std::vector<Batch> all;
    for (int r = 0; r < size(); ++r) all.push_back(batch(r, 0, 0, true));
    report_grads(small ? "sum/small buckets" : "sum/default buckets", p, reference_grads(all));
    EXPECT_EQ(sync.counters().allreduce_calls, static_cast<int64_t>(sync.buckets().size()));
    EXPECT_EQ(sync.counters().steps, 1);
    if (!small) {
      EXPECT_EQ(sync.buckets().size(), 2u);  // one float64 and one float32 bucket
    }
  }
}

TEST(GradientSync, AverageOption) {
  std::vector<torch::Tensor> p = make_params();
  GradientSyncOptions o = small_buckets();
  o.average = true;
  GradientSynchronizer sync(*test::g_context, comm(), p, o);
  loss(p, batch(rank(), 0, 0, true)).backward();
  sync.finish();
  std::vector<Batch> all;
  for (int r = 0; r < size(); ++r) all.push_back(batch(r, 0, 0, true));
  std::vector<torch::Tensor> want = reference_grads(all);
  for (auto& w : want) w = w / size();
  report_grads("average", p, want, /*rtol=*/1e-6, /*atol=*/1e-6);  // sum then divide, rounded
}

// Expected layouts worked out by hand from the assignment rule.
TEST(GradientSync, BucketLayoutReverseOrderAndLimits) {
  // float64 params of 80, 24, 160, 8, 40 and 320 bytes; first bucket 64 B, then 200 B.
  std::vector<torch::Tensor> p;
  for (const int64_t n : {10, 3, 20, 1, 5, 40})
    p.push_back(torch::zeros({n}, torch::kFloat64).requires_grad_(true));
  GradientSyncOptions o;
  o.first_bucket_bytes = 64;
  o.bucket_bytes = 200;
  GradientSynchronizer sync(*test::g_context, comm(), p, o);
  const std::vector<std::vector<int64_t>> expected = {{5}, {4, 3}, {2, 1}, {0}};
  ASSERT_EQ(sync.buckets().size(), expected.size()) << sync.layout_string();
  for (size_t b = 0; b < expected.size(); ++b) {
    EXPECT_EQ(sync.buckets()[b].params, expected[b]) << "bucket " << b << "\n" << sync.layout_string();
    const int64_t limit = b == 0 ? o.first_bucket_bytes : o.bucket_bytes;
    if (sync.buckets()[b].params.size() > 1) {
      EXPECT_LE(sync.buckets()[b].bytes, limit);
    }
    for (const int64_t i : sync.buckets()[b].params) EXPECT_EQ(sync.bucket_of(i), int64_t(b));
  }
  EXPECT_EQ(sync.buckets()[1].offsets, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(sync.buckets()[1].bytes, 48);

  // Mixed dtypes: each (dtype, device) has its own buckets and its own small first bucket.
  std::vector<torch::Tensor> q = {torch::zeros({4}, torch::kFloat64).requires_grad_(true),
                                  torch::zeros({4}, torch::kFloat32).requires_grad_(true),
                                  torch::zeros({4}, torch::kFloat64).requires_grad_(true),
                                  torch::zeros({4}, torch::kFloat32).requires_grad_(true)};
  o.first_bucket_bytes = 40;
  o.bucket_bytes = 1000;
  GradientSynchronizer mixed(*test::g_context, comm(), q, o);
  ASSERT_EQ(mixed.buckets().size(), 3u) << mixed.layout_string();
  EXPECT_EQ(mixed.buckets()[0].params, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(mixed.buckets()[0].dtype, torch::kFloat32);
  EXPECT_EQ(mixed.buckets()[1].params, (std::vector<int64_t>{2}));
  EXPECT_EQ(mixed.buckets()[2].params, (std::vector<int64_t>{0}));
  EXPECT_EQ(mixed.buckets()[2].dtype, torch::kFloat64);

  // The model: several buckets, each in reverse parameter order, bucket 0 holds the last one.
  std::vector<torch::Tensor> m = make_params();
  GradientSynchronizer model(*test::g_context, comm(), m, small_buckets());
  EXPECT_GE(model.buckets().size(), 3u) << model.layout_string();
  EXPECT_EQ(model.buckets()[0].params.front(), kParamCount - 1);
  std::vector<int> seen(kParamCount, 0);
  for (const auto& bucket : model.buckets()) {
    for (size_t k = 0; k < bucket.params.size(); ++k) {
      ++seen[bucket.params[k]];
      if (k > 0) {
        EXPECT_LT(bucket.params[k], bucket.params[k - 1]);
      }
      EXPECT_EQ(m[bucket.params[k]].scalar_type(), bucket.dtype);
    }
  }
  for (int i = 0; i < kParamCount; ++i) EXPECT_EQ(seen[i], 1) << "param " << i;

  // The layout is the same on every rank.
  const uint64_t fp = fingerprint(model.layout_string());
  int64_t as_int = 0;
  std::memcpy(&as_int, &fp, sizeof(fp));
  const torch::Tensor all = comm().allgather(torch::tensor({as_int}, torch::kInt64));
  report("layout fingerprint on every rank", all, torch::full({size(), 1}, as_int, torch::kInt64));
}

TEST(GradientSync, FirstBucketLaunchedDuringBackward) {
  std::vector<torch::Tensor> p = make_params();
  GradientSynchronizer sync(*test::g_context, comm(), p, small_buckets());
  ASSERT_GE(sync.buckets().size(), 2u);
  ASSERT_NE(sync.bucket_of(kW1), 0);
  // W1's gradient is the last to arrive (it needs the whole chain). This hook runs inside
  // backward, before W1's gradient is accumulated: the earlier buckets must already be in flight.
  int64_t launched_before_w1 = -1;
  p[kW1].register_hook([&](const torch::Tensor&) {
    launched_before_w1 = sync.counters().buckets_launched;
  });
  loss(p, batch(rank(), 0, 0, true)).backward();
  EXPECT_GE(launched_before_w1, 1) << "no bucket was launched before backward reached W1";
  // Every parameter was used, so every bucket was launched from a hook before finish().
  EXPECT_EQ(sync.counters().buckets_launched, static_cast<int64_t>(sync.buckets().size()));
  sync.finish();
  EXPECT_EQ(sync.counters().last_step_overlapped, static_cast<int64_t>(sync.buckets().size()));
  EXPECT_EQ(sync.counters().buckets_launched, 0);  // reset for the next step
  std::vector<Batch> all;
  for (int r = 0; r < size(); ++r) all.push_back(batch(r, 0, 0, true));
  report_grads("overlap", p, reference_grads(all));
}

TEST(GradientSync, MicroBatchesSyncOnlyOnTheLast) {
  constexpr int kMicro = 3;
  std::vector<torch::Tensor> p = make_params();
  GradientSynchronizer sync(*test::g_context, comm(), p, small_buckets());
  // U is used only in the first micro-batch: its locally accumulated gradient must still be
  // reduced although its hook does not fire on the final micro-step.
  for (int k = 0; k < kMicro - 1; ++k) {
    NoSyncScope no_sync(sync);
    EXPECT_FALSE(sync.sync_enabled());
    loss(p, batch(rank(), k, 0, k == 0)).backward();
    EXPECT_EQ(sync.counters().buckets_launched, 0) << "micro-step " << k;
    EXPECT_EQ(sync.counters().allreduce_calls, 0) << "micro-step " << k;
  }
  EXPECT_TRUE(sync.sync_enabled());
  loss(p, batch(rank(), kMicro - 1, 0, false)).backward();
  sync.finish();
  EXPECT_EQ(sync.counters().allreduce_calls, static_cast<int64_t>(sync.buckets().size()));

  std::vector<Batch> all;
  for (int r = 0; r < size(); ++r)
    for (int k = 0; k < kMicro; ++k) all.push_back(batch(r, k, 0, k == 0));
  report_grads("micro-batches", p, reference_grads(all));

  // docs/distributed.md, invariant 2: the same as one batch K * N times the size (rays concatenated).
  Batch big;
  std::vector<torch::Tensor> xs, cs;
  big.e = torch::zeros({300}, torch::kFloat64);
  big.u = torch::zeros({10}, torch::kFloat64);
  for (const Batch& b : all) {
    xs.push_back(b.x);
    cs.push_back(b.c);
    big.e += b.e;
    if (b.u.defined()) big.u += b.u;
  }
  big.x = torch::cat(xs, 1);
  big.c = torch::cat(cs, 1);
  std::vector<torch::Tensor> one = make_params();
  loss(one, big).backward();
  std::vector<torch::Tensor> want;
  for (auto& t : one) want.push_back(t.grad());
  report_grads("micro-batches vs one big batch", p, want, /*rtol=*/1e-6, /*atol=*/1e-6);
}

TEST(GradientSync, UnusedParameterGetsOtherRanksSumOrZeros) {
  std::vector<torch::Tensor> p = make_params();
  GradientSynchronizer sync(*test::g_context, comm(), p, small_buckets());
  // U is used on even ranks only: odd ranks have no gradient for it and never fire its hook.
  const bool use_u = rank() % 2 == 0;
  loss(p, batch(rank(), 0, 0, use_u)).backward();
  EXPECT_EQ(p[kU].grad().defined(), use_u);
  sync.finish();
  std::vector<Batch> all;
  for (int r = 0; r < size(); ++r) all.push_back(batch(r, 0, 0, r % 2 == 0));
  report_grads("unused on odd ranks", p, reference_grads(all));

  // Unused everywhere: every rank ends with defined zeros.
  clear_grads(p);
  loss(p, batch(rank(), 0, 1, false)).backward();
  sync.finish();
  ASSERT_TRUE(p[kU].grad().defined());
  report("unused on every rank", p[kU].grad(), torch::zeros({10}, torch::kFloat64));
}

TEST(GradientSync, ConsecutiveStepsReset) {
  std::vector<torch::Tensor> p = make_params();
  GradientSynchronizer sync(*test::g_context, comm(), p, small_buckets());
  const int64_t n_buckets = static_cast<int64_t>(sync.buckets().size());
  int64_t bytes_per_step = 0;
  for (const auto& b : sync.buckets()) bytes_per_step += b.bytes;
  for (int step = 0; step < 3; ++step) {
    clear_grads(p);
    const bool use_u = (rank() + step) % 2 == 0;
    loss(p, batch(rank(), 0, step, use_u)).backward();
    sync.finish();
    std::vector<Batch> all;
    for (int r = 0; r < size(); ++r) all.push_back(batch(r, 0, step, (r + step) % 2 == 0));
    report_grads("step " + std::to_string(step), p, reference_grads(all));
    EXPECT_EQ(sync.counters().steps, step + 1);
    EXPECT_EQ(sync.counters().allreduce_calls, (step + 1) * n_buckets);
    EXPECT_EQ(sync.counters().bytes_reduced, (step + 1) * bytes_per_step);
  }
  // finish() while disabled does nothing (no collective).
  {
    NoSyncScope no_sync(sync);
    sync.finish();
  }
  EXPECT_EQ(sync.counters().steps, 3);
}

TEST(GradientSync, UserErrors) {
  std::vector<torch::Tensor> frozen = {torch::zeros({3}).requires_grad_(true), torch::zeros({2})};
  EXPECT_THROW(GradientSynchronizer(*test::g_context, comm(), frozen), UserError);
  torch::Tensor leaf = torch::zeros({3}).requires_grad_(true);
  EXPECT_THROW(GradientSynchronizer(*test::g_context, comm(), {leaf * 2}), UserError);
  EXPECT_THROW(GradientSynchronizer(*test::g_context, comm(), {leaf, leaf}), UserError);
  // Layouts that differ across ranks (rank 0 has one parameter more): every rank throws.
  if (size() > 1) {
    std::vector<torch::Tensor> p = make_params();
    if (rank() == 0) p.push_back(torch::zeros({5}, torch::kFloat64).requires_grad_(true));
    EXPECT_THROW(GradientSynchronizer(*test::g_context, comm(), p), UserError);
    std::vector<torch::Tensor> q = make_params();
    GradientSyncOptions o;
    o.first_bucket_bytes = 64 * (rank() + 1);
    EXPECT_THROW(GradientSynchronizer(*test::g_context, comm(), q, o), UserError);
  }
}

// The same synchronizer over NCCL with the parameters on the GPU: sums over ranks and micro-batches
// equal the CPU reference exactly (integer gradients), in small and default buckets.
TEST(GradientSyncCuda, NcclSumsOverRanksAndMicroBatches) {
  TESSERA_SKIP_UNLESS_CUDA(torch::cuda::is_available() && nccl_available(),
                           "needs a CUDA device and an NCCL build");
  if (!test::g_context->one_cuda_device_per_rank())
    GTEST_SKIP() << "fewer CUDA devices than ranks on this node";
  const torch::Device cuda(torch::kCUDA, test::g_context->cuda_device_index());
  auto nccl = make_communicator(*test::g_context, "nccl", cuda);
  auto to_cuda = [&](const Batch& b) {
    Batch d;
    d.x = b.x.to(cuda), d.c = b.c.to(cuda), d.e = b.e.to(cuda);
    if (b.u.defined()) d.u = b.u.to(cuda);
    return d;
  };
  for (const bool small : {false, true}) {
    std::vector<torch::Tensor> p = make_params();
    for (auto& t : p) t = t.detach().to(cuda).requires_grad_(true);
    GradientSynchronizer sync(*test::g_context, *nccl, p,
                              small ? small_buckets() : GradientSyncOptions{});
    constexpr int kMicro = 3;
    for (int m = 0; m < kMicro - 1; ++m) {
      NoSyncScope no_sync(sync);
      loss(p, to_cuda(batch(rank(), m, 0, true))).backward();
    }
    loss(p, to_cuda(batch(rank(), kMicro - 1, 0, true))).backward();
    sync.finish();
    std::vector<Batch> all;
    for (int r = 0; r < size(); ++r)
      for (int m = 0; m < kMicro; ++m) all.push_back(batch(r, m, 0, true));
    const std::vector<torch::Tensor> want = reference_grads(all);
    for (size_t i = 0; i < p.size(); ++i) {
      ASSERT_TRUE(p[i].grad().is_cuda()) << i;
      report(std::string(small ? "nccl/small/param " : "nccl/default/param ") + std::to_string(i),
             p[i].grad().cpu(), want[i]);
    }
    EXPECT_EQ(sync.counters().allreduce_calls, static_cast<int64_t>(sync.buckets().size()));
  }
}

}  // namespace
}  // namespace tessera::distributed
