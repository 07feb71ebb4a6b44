// Every collective of the Communicator on deterministic data that differs per rank, for every
// dtype, uneven sizes and zero-length slices; each check reports its count of wrong elements.
// Runs under mpiexec -n 1..4 with the MPI backend, and with NCCL where a GPU is visible.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <memory>

#include "distributed/communicator.h"
#include "distributed/errors.h"
#ifdef TESSERA_WITH_NCCL
#include "distributed/nccl_communicator.h"
#endif
#include "tests/cuda_skip.h"
#include "tests/mpi_test_env.h"

namespace tessera::distributed {
namespace {

const std::vector<torch::ScalarType> kDtypes = {torch::kFloat32, torch::kFloat64,
                                                torch::kBFloat16, torch::kFloat16,
                                                torch::kInt32,   torch::kInt64,
                                                torch::kUInt8};
// Element counts: empty, one, odd, and several chunks of a typical bucket.
const std::vector<int64_t> kSizes = {0, 1, 7, 1000, 65537};

// One communicator per backend for the whole run (NCCL setup is costly), released before MPI is
// finalized.
Communicator& communicator(const std::string& backend) {
  static std::map<std::string, std::unique_ptr<Communicator>> comms;
  if (comms.empty()) test::before_finalize().push_back([] { comms.clear(); });
  auto& slot = comms[backend];
  if (!slot) {
    ProcessContext& context = *test::g_context;
    const torch::Device device = backend == "nccl"
                                     ? torch::Device(torch::kCUDA, context.cuda_device_index())
                                     : torch::Device(torch::kCPU);
    slot = make_communicator(context, backend, device);
  }
  return *slot;
}

// Small integers, exact in every dtype (bf16 holds integers up to 256 exactly) and in any
// summation order, so that results can be compared exactly.
torch::Tensor rank_data(int rank, int64_t n, torch::ScalarType dtype, torch::Device device) {
  return ((torch::arange(n, torch::kInt64) * 7 + rank * 3) % 11).to(dtype).to(device);
}

int64_t count_wrong(const torch::Tensor& got, const torch::Tensor& expected) {
  if (got.sizes() != expected.sizes()) return std::max(got.numel(), expected.numel());
  return (got.cpu() != expected.cpu()).sum().item<int64_t>();
}

// Logs the number of wrong elements of one check and fails when it is not zero.
void report(const std::string& what, const torch::Tensor& got, const torch::Tensor& expected) {
  const int64_t wrong = count_wrong(got, expected);
  if (wrong != 0)
    std::fprintf(stderr, "[rank %d] %s: %lld wrong of %lld elements\n", test::g_context->rank(),
                 what.c_str(), static_cast<long long>(wrong),
                 static_cast<long long>(expected.numel()));
  EXPECT_EQ(wrong, 0) << what << ": shapes " << got.sizes() << " vs " << expected.sizes();
}

std::string tag(const char* op, torch::ScalarType dtype, int64_t n) {
  return std::string(op) + "/" + c10::toString(dtype) + "/n=" + std::to_string(n);
}

class CommunicatorTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() != "nccl") return;
    TESSERA_SKIP_UNLESS_CUDA(nccl_available() && torch::cuda::is_available(),
                             "the NCCL backend needs an NCCL build and a CUDA device");
    if (!test::g_context->one_cuda_device_per_rank())
      GTEST_SKIP() << "fewer CUDA devices than ranks on this node";
  }
  Communicator& comm() { return communicator(GetParam()); }
  torch::Device device() { return comm().device(); }
  int rank() { return comm().rank(); }
  int size() { return comm().size(); }
};

TEST_P(CommunicatorTest, AllreduceEveryOpDtypeAndSize) {
  for (const auto dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      torch::Tensor sum = torch::zeros({n}, torch::kInt64);
      torch::Tensor max = rank_data(0, n, torch::kInt64, torch::kCPU);
      torch::Tensor min = max.clone();
      for (int r = 0; r < size(); ++r) {
        const torch::Tensor x = rank_data(r, n, torch::kInt64, torch::kCPU);
        sum += x;
        max = torch::maximum(max, x);
        min = torch::minimum(min, x);
      }
      const torch::Tensor sum_d = sum.to(dtype);
      const torch::Tensor avg = c10::isIntegralType(dtype, false) ? sum_d.div(size(), "trunc")
                                                                   : sum_d.div(size());
      const std::map<ReduceOp, torch::Tensor> expected = {
          {ReduceOp::Sum, sum_d}, {ReduceOp::Avg, avg},
          {ReduceOp::Max, max.to(dtype)}, {ReduceOp::Min, min.to(dtype)}};
      for (const auto& [op, want] : expected) {
        torch::Tensor t = rank_data(rank(), n, dtype, device());
        comm().allreduce(t, op);
        report(tag((std::string("allreduce.") + to_string(op)).c_str(), dtype, n), t, want);
      }
    }
  }
}

TEST_P(CommunicatorTest, AllreduceAsyncAndNonContiguous) {
  const int64_t n = 4099;
  torch::Tensor expected = torch::zeros({n}, torch::kInt64);
  for (int r = 0; r < size(); ++r) expected += rank_data(r, n, torch::kInt64, torch::kCPU);
  torch::Tensor t = rank_data(rank(), n, torch::kFloat32, device());
  auto work = comm().allreduce_async(t, ReduceOp::Sum);
  work->wait();
  report("allreduce_async.sum", t, expected.to(torch::kFloat32));

  // A transposed view is reduced in place: the caller's view holds the result.
  torch::Tensor base = rank_data(rank(), 6 * 5, torch::kFloat64, device()).reshape({6, 5});
  torch::Tensor view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  comm().allreduce(view, ReduceOp::Max);
  torch::Tensor want = rank_data(0, 30, torch::kInt64, torch::kCPU);
  for (int r = 1; r < size(); ++r)
    want = torch::maximum(want, rank_data(r, 30, torch::kInt64, torch::kCPU));
  report("allreduce.max/non-contiguous", base, want.to(torch::kFloat64).reshape({6, 5}));
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  for (const auto dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      for (int root = 0; root < size(); ++root) {
        torch::Tensor t = rank_data(rank(), n, dtype, device());
        comm().broadcast(t, root);
        report(tag("broadcast", dtype, n) + "/root=" + std::to_string(root), t,
               rank_data(root, n, dtype, torch::kCPU));
      }
    }
  }
  torch::Tensor t = torch::zeros({2}, torch::TensorOptions().device(device()));
  EXPECT_THROW(comm().broadcast(t, size()), UserError);
}

TEST_P(CommunicatorTest, AllgatherStacksEveryRank) {
  for (const auto dtype : kDtypes) {
    for (const int64_t n : kSizes) {
      const torch::Tensor got = comm().allgather(rank_data(rank(), n, dtype, device()));
      std::vector<torch::Tensor> rows;
      for (int r = 0; r < size(); ++r) rows.push_back(rank_data(r, n, dtype, torch::kCPU));
      report(tag("allgather", dtype, n), got, torch::stack(rows));
    }
  }
}

// Rows that rank r contributes to allgatherv: uneven, and zero on some ranks.
int64_t gatherv_rows(int rank, int variant) { return (rank * 5 + variant) % 4; }

TEST_P(CommunicatorTest, AllgathervUnevenAndEmptySlices) {
  constexpr int64_t kCols = 3;
  for (const auto dtype : kDtypes) {
    for (int variant = 0; variant < 4; ++variant) {
      const auto mine = rank_data(rank(), gatherv_rows(rank(), variant) * kCols, dtype, device())
                            .reshape({-1, kCols});
      const torch::Tensor got = comm().allgatherv(mine);
      std::vector<torch::Tensor> parts;
      for (int r = 0; r < size(); ++r)
        parts.push_back(rank_data(r, gatherv_rows(r, variant) * kCols, dtype, torch::kCPU)
                            .reshape({-1, kCols}));
      report(tag("allgatherv", dtype, got.size(0)) + "/variant=" + std::to_string(variant), got,
             torch::cat(parts));
    }
    // Every rank empty.
    const torch::Tensor none = comm().allgatherv(
        torch::empty({0, kCols}, torch::TensorOptions().dtype(dtype).device(device())));
    EXPECT_EQ(none.size(0), 0);
    EXPECT_EQ(none.size(1), kCols);
  }
}

// Rows sent from `src` to `dst`: uneven, and zero for some pairs.
int64_t a2a_rows(int src, int dst) { return (src + 2 * dst) % 3; }

// Row idx from src to dst: [code, 255 - code], distinct per (src, dst, idx) and exact in uint8.
torch::Tensor a2a_block(int src, int dst, torch::ScalarType dtype, torch::Device device) {
  const int64_t n = a2a_rows(src, dst);
  const torch::Tensor code = src * 64 + dst * 16 + torch::arange(n, torch::kInt64) % 16;
  return torch::stack({code, 255 - code}, 1).to(dtype).to(device);
}

TEST_P(CommunicatorTest, AllToAllVUnevenAndEmpty) {
  for (const auto dtype : kDtypes) {
    std::vector<torch::Tensor> outgoing, incoming;
    std::vector<int64_t> send_counts, expected_counts;
    for (int d = 0; d < size(); ++d) {
      outgoing.push_back(a2a_block(rank(), d, dtype, device()));
      send_counts.push_back(a2a_rows(rank(), d));
    }
    for (int s = 0; s < size(); ++s) {
      incoming.push_back(a2a_block(s, rank(), dtype, torch::kCPU));
      expected_counts.push_back(a2a_rows(s, rank()));
    }
    std::vector<int64_t> recv_counts;
    const torch::Tensor got = comm().all_to_all_v(torch::cat(outgoing), send_counts, &recv_counts);
    report(tag("all_to_all_v", dtype, got.size(0)), got, torch::cat(incoming));
    EXPECT_EQ(recv_counts, expected_counts);
  }
  // Nothing sent anywhere.
  const torch::Tensor none = comm().all_to_all_v(
      torch::empty({0, 2}, torch::TensorOptions().device(device())),
      std::vector<int64_t>(size(), 0));
  EXPECT_EQ(none.size(0), 0);
}

// traffic() counts what this rank hands to collectives: all_to_all_v rows bound for other ranks
// (not those it keeps), and allreduce payloads, both in bytes.
TEST_P(CommunicatorTest, TrafficCountsBytesSentToOtherRanks) {
  const Traffic before = comm().traffic();
  std::vector<torch::Tensor> outgoing;
  std::vector<int64_t> send_counts;
  int64_t to_others = 0;
  for (int d = 0; d < size(); ++d) {
    outgoing.push_back(a2a_block(rank(), d, torch::kFloat32, device()));  // rows of 2 floats
    send_counts.push_back(a2a_rows(rank(), d));
    if (d != rank()) to_others += a2a_rows(rank(), d) * 2 * 4;
  }
  comm().all_to_all_v(torch::cat(outgoing), send_counts);
  torch::Tensor t = torch::ones({5, 3}, torch::TensorOptions().dtype(torch::kFloat64).device(device()));
  comm().allreduce(t, ReduceOp::Sum);
  comm().allreduce_async(t, ReduceOp::Max)->wait();
  const Traffic after = comm().traffic();
  EXPECT_EQ(after.all_to_all_bytes - before.all_to_all_bytes, to_others);
  EXPECT_EQ(after.allreduce_bytes - before.allreduce_bytes, 2 * 5 * 3 * 8);
}

TEST_P(CommunicatorTest, BadArgumentsAreUserErrors) {
  torch::Tensor flags = torch::zeros({4}, torch::TensorOptions().dtype(torch::kBool).device(device()));
  EXPECT_THROW(comm().allreduce(flags, ReduceOp::Sum), UserError);
  torch::Tensor rows = torch::zeros({3, 2}, torch::TensorOptions().device(device()));
  EXPECT_THROW(comm().all_to_all_v(rows, std::vector<int64_t>(size(), 0)), UserError);
  if (size() > 1) {  // one count for several ranks
    EXPECT_THROW(comm().all_to_all_v(rows, {3}), UserError);
  }
  comm().barrier();
}

TEST_P(CommunicatorTest, LargeAllreduceAcrossChunks) {
  const int64_t n = (int64_t{1} << 21) + 3;
  torch::Tensor t = torch::full({n}, static_cast<float>(rank() + 1),
                                torch::TensorOptions().device(device()));
  comm().allreduce(t, ReduceOp::Sum);
  report("allreduce.sum/large", t, torch::full({n}, size() * (size() + 1) / 2.0f));
}

INSTANTIATE_TEST_SUITE_P(Backends, CommunicatorTest, testing::Values("mpi", "nccl"),
                         [](const auto& info) { return info.param; });

// An aborted NCCL communicator (an NCCL error, or the watchdog) refuses further calls with a
// DistributedError, and its destructor neither aborts it again nor destroys the freed handle.
TEST(NcclCommunicatorCuda, AbortIsOnceAndRefusesLaterCalls) {
  TESSERA_SKIP_UNLESS_CUDA(nccl_available() && torch::cuda::is_available(),
                           "the NCCL backend needs an NCCL build and a CUDA device");
  if (!test::g_context->one_cuda_device_per_rank())
    GTEST_SKIP() << "fewer CUDA devices than ranks on this node";
#ifdef TESSERA_WITH_NCCL
  ProcessContext& context = *test::g_context;
  const torch::Device cuda(torch::kCUDA, context.cuda_device_index());
  std::unique_ptr<Communicator> comm = make_communicator(context, "nccl", cuda);
  torch::Tensor t = torch::ones({8}, torch::TensorOptions().device(cuda));
  comm->allreduce(t, ReduceOp::Sum);
  EXPECT_TRUE(torch::equal(t.cpu(), torch::full({8}, static_cast<float>(comm->size()))));
  auto* nccl = dynamic_cast<NcclCommunicator*>(comm.get());
  ASSERT_NE(nccl, nullptr);
  torch::cuda::synchronize(cuda.index());
  nccl->abort();
  nccl->abort();
  EXPECT_THROW(comm->allreduce(t, ReduceOp::Sum), DistributedError);
  EXPECT_THROW(comm->broadcast(t, 0), DistributedError);
  comm.reset();  // must not touch the aborted handle
  // A fresh communicator still works afterwards.
  Communicator& fresh = communicator("nccl");
  torch::Tensor u = torch::ones({4}, torch::TensorOptions().device(fresh.device()));
  fresh.allreduce(u, ReduceOp::Sum);
  EXPECT_TRUE(torch::equal(u.cpu(), torch::full({4}, static_cast<float>(fresh.size()))));
#endif
}

}  // namespace
}  // namespace tessera::distributed
