// NcclCommunicator: collectives on CUDA tensors with NCCL, enqueued on the current stream and
// followed by the watchdog; variable-size collectives agree on counts over MPI first.
#include "distributed/nccl_communicator.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <exception>
#include <numeric>

#include "distributed/collective_args.h"
#include "distributed/errors.h"
#include "distributed/mpi_communicator.h"
#include "distributed/watchdog.h"

namespace tessera {
namespace detail {
void throw_nccl_error(int code, const char* expr, const char* file, int line) {
  throw DistributedError("rank " + std::to_string(error_rank()) + ": " + expr + " failed at " +
                         file + ":" + std::to_string(line) + ": NCCL error " +
                         std::to_string(code) + " (" +
                         ncclGetErrorString(static_cast<ncclResult_t>(code)) + ")");
}
}  // namespace detail
}  // namespace tessera

// A call on this communicator: refused once it was aborted, and on failure it is aborted (once)
// before the error leaves, so that no peer waits on it forever and nothing uses it again.
#define NCCL_COMM_CHECK(expr)                                                                   \
  do {                                                                                          \
    require_live(#expr);                                                                        \
    const ncclResult_t tessera_rc_ = (expr);                                                    \
    if (tessera_rc_ != ncclSuccess && tessera_rc_ != ncclInProgress)                            \
      fail(tessera_rc_, #expr, __FILE__, __LINE__);                                             \
  } while (0)

namespace tessera::distributed {

namespace {

ncclDataType_t nccl_dtype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return ncclFloat32;
    case torch::kFloat64: return ncclFloat64;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kFloat16: return ncclFloat16;
    case torch::kInt32: return ncclInt32;
    case torch::kInt64: return ncclInt64;
    case torch::kUInt8: return ncclUint8;
    default: throw UserError(std::string("NCCL: unsupported dtype ") + c10::toString(dtype));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return ncclSum;  // Avg divides afterwards, exactly as the MPI backend
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

std::string describe(const char* what, const torch::Tensor& t) {
  return std::string("nccl ") + what + " of " + std::to_string(t.numel() * t.element_size()) +
         " bytes";
}

// NCCL enqueues on the stream; the result is ready once the caller's stream reaches it.
class NcclWork final : public Work {
 public:
  NcclWork(torch::Tensor buffer, torch::Tensor target, ReduceOp op, int size)
      : buffer_(std::move(buffer)), target_(std::move(target)), op_(op), size_(size) {}
  void wait() override {
    if (done_) return;
    done_ = true;
    detail::finish_avg(buffer_, op_, size_);
    if (!target_.is_same(buffer_)) target_.copy_(buffer_);
  }

 private:
  torch::Tensor buffer_, target_;
  ReduceOp op_;
  int size_;
  bool done_ = false;
};

}  // namespace

std::string nccl_library_version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return "unknown";
  // From NCCL 2.9 the code is major*10000 + minor*100 + patch.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

NcclCommunicator::NcclCommunicator(ProcessContext& context, int device_index)
    : Communicator(context.rank(), context.size()), context_(context),
      device_index_(device_index < 0 ? context.cuda_device_index() : device_index) {
  if (device_index_ < 0)
    throw UserError("the nccl backend needs a CUDA device, and none is visible to rank " +
                    std::to_string(rank()));
  c10::cuda::CUDAGuard guard(device_index_);
  ncclUniqueId id;
  if (rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  {
    Watchdog::Scope watch(context_.watchdog(), "NCCL bootstrap (ncclUniqueId broadcast)");
    MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, context_.world()));
  }
  {
    Watchdog::Scope watch(context_.watchdog(), "ncclCommInitRank");
    NCCL_CHECK(ncclCommInitRank(&comm_, size(), id, rank()));
  }
  ncclComm_t comm = comm_;
  std::shared_ptr<AbortOnce> handle = handle_;
  hooks_id_ = context_.watchdog().add_hooks(
      [comm, handle]() -> std::string {
        ncclResult_t async = ncclSuccess;
        bool polled = false;
        handle->if_live([&] { polled = ncclCommGetAsyncError(comm, &async) == ncclSuccess; });
        if (!polled || async == ncclSuccess || async == ncclInProgress) return {};
        return std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(async);
      },
      [comm, handle]() { handle->abort([comm] { ncclCommAbort(comm); }); });
}

NcclCommunicator::~NcclCommunicator() {
  // After MPI_Finalize (a communicator held in a static) the process context and its watchdog
  // are gone and the CUDA runtime may be too: leave the handle to the process's exit.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // From here on the watchdog's hooks neither poll nor abort this communicator.
  context_.watchdog().remove_hooks(hooks_id_);
  if (comm_ == nullptr) return;
  if (std::uncaught_exceptions() > 0) {
    // Unwinding towards a job abort: peers may never finish their part, so do not wait.
    abort();
    return;
  }
  c10::cuda::CUDAGuard guard(device_index_);
  Watchdog::Scope watch(context_.watchdog(), "NCCL communicator teardown");
  handle_->destroy([this] {
    cudaDeviceSynchronize();
    ncclCommDestroy(comm_);
  });
}

void NcclCommunicator::abort() {
  if (comm_ == nullptr) return;
  handle_->abort([comm = comm_] { ncclCommAbort(comm); });
}

void NcclCommunicator::require_live(const char* expr) const {
  if (!handle_->live())
    throw DistributedError("rank " + std::to_string(rank()) + ": " + expr +
                           " on an NCCL communicator that was aborted (after an NCCL error or by "
                           "the watchdog); the job cannot go on");
}

void NcclCommunicator::fail(ncclResult_t code, const char* expr, const char* file, int line) {
  abort();
  tessera::detail::throw_nccl_error(static_cast<int>(code), expr, file, line);
}

void NcclCommunicator::watch(const std::string& what) {
  cudaEvent_t event = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(event, at::cuda::getCurrentCUDAStream(device_index_).stream()));
  std::shared_ptr<void> holder(static_cast<void*>(event), [](void* e) {
    cudaEventDestroy(static_cast<cudaEvent_t>(e));
  });
  context_.watchdog().start(what, [holder]() {
    return cudaEventQuery(static_cast<cudaEvent_t>(holder.get())) != cudaErrorNotReady;
  });
}

void NcclCommunicator::allreduce(torch::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce");
  traffic_.allreduce_bytes += static_cast<int64_t>(tensor.nbytes());
  if (tensor.numel() == 0) return;
  c10::cuda::CUDAGuard guard(device_index_);
  torch::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  NCCL_COMM_CHECK(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(),
                           nccl_dtype(buffer.scalar_type()), nccl_op(op), comm_,
                           at::cuda::getCurrentCUDAStream(device_index_).stream()));
  watch(describe("allreduce", buffer));
  detail::finish_avg(buffer, op, size());
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

std::unique_ptr<Work> NcclCommunicator::allreduce_async(torch::Tensor tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce_async");
  traffic_.allreduce_bytes += static_cast<int64_t>(tensor.nbytes());
  c10::cuda::CUDAGuard guard(device_index_);
  torch::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  if (buffer.numel() > 0) {
    NCCL_COMM_CHECK(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(),
                             nccl_dtype(buffer.scalar_type()), nccl_op(op), comm_,
                             at::cuda::getCurrentCUDAStream(device_index_).stream()));
    watch(describe("allreduce_async", buffer));
  }
  return std::make_unique<NcclWork>(buffer, tensor, op, size());
}

void NcclCommunicator::broadcast(torch::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  if (root < 0 || root >= size())
    throw UserError("broadcast: root " + std::to_string(root) + " is not a rank of " +
                    std::to_string(size()));
  if (tensor.numel() == 0) return;
  c10::cuda::CUDAGuard guard(device_index_);
  torch::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  NCCL_COMM_CHECK(ncclBroadcast(buffer.data_ptr(), buffer.data_ptr(), buffer.numel(),
                           nccl_dtype(buffer.scalar_type()), root, comm_,
                           at::cuda::getCurrentCUDAStream(device_index_).stream()));
  watch(describe("broadcast", buffer));
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

torch::Tensor NcclCommunicator::allgather(const torch::Tensor& tensor) {
  check_tensor(tensor, "allgather");
  c10::cuda::CUDAGuard guard(device_index_);
  const torch::Tensor input = tensor.contiguous();
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  torch::Tensor output = torch::empty(shape, input.options());
  if (input.numel() == 0) return output;
  NCCL_COMM_CHECK(ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(),
                           nccl_dtype(input.scalar_type()), comm_,
                           at::cuda::getCurrentCUDAStream(device_index_).stream()));
  watch(describe("allgather", input));
  return output;
}

torch::Tensor NcclCommunicator::allgatherv(const torch::Tensor& tensor) {
  check_tensor(tensor, "allgatherv");
  detail::require_rows(tensor, "allgatherv");
  c10::cuda::CUDAGuard guard(device_index_);
  const torch::Tensor input = tensor.contiguous();
  const int64_t row_elems = detail::row_elements(input);
  std::vector<int64_t> rows, widths;
  {
    Watchdog::Scope watch_counts(context_.watchdog(), "allgatherv counts");
    rows = allgather_counts(context_.world(), input.size(0));
    widths = allgather_counts(context_.world(), row_elems);
  }
  detail::require_same_row_width(widths, row_elems);
  const int64_t total = std::accumulate(rows.begin(), rows.end(), int64_t{0});
  torch::Tensor output = torch::empty(detail::shape_with_rows(input, total), input.options());
  if (total == 0 || row_elems == 0) return output;
  const auto stream = at::cuda::getCurrentCUDAStream(device_index_).stream();
  const ncclDataType_t dtype = nccl_dtype(input.scalar_type());
  char* out = static_cast<char*>(output.data_ptr());
  const int64_t row_bytes = row_elems * input.element_size();
  NCCL_COMM_CHECK(ncclGroupStart());
  int64_t offset = 0;
  for (int r = 0; r < size(); ++r) {
    if (rows[r] > 0) {
      const void* send = r == rank() ? input.data_ptr() : nullptr;
      NCCL_COMM_CHECK(ncclBroadcast(send, out + offset * row_bytes, rows[r] * row_elems, dtype, r,
                               comm_, stream));
    }
    offset += rows[r];
  }
  NCCL_COMM_CHECK(ncclGroupEnd());
  watch(describe("allgatherv", output));
  return output;
}

torch::Tensor NcclCommunicator::all_to_all_v(const torch::Tensor& input_tensor,
                                             const std::vector<int64_t>& send_counts,
                                             std::vector<int64_t>* recv_counts) {
  check_tensor(input_tensor, "all_to_all_v");
  detail::require_send_counts(input_tensor, send_counts, size());
  count_all_to_all(input_tensor, send_counts);
  c10::cuda::CUDAGuard guard(device_index_);
  const torch::Tensor input = input_tensor.contiguous();
  std::vector<int64_t> received(size());
  {
    Watchdog::Scope watch_counts(context_.watchdog(), "all_to_all_v counts");
    MPI_CHECK(MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T,
                           context_.world()));
  }
  if (recv_counts != nullptr) *recv_counts = received;
  const int64_t total = std::accumulate(received.begin(), received.end(), int64_t{0});
  const int64_t row_elems = detail::row_elements(input);
  torch::Tensor output = torch::empty(detail::shape_with_rows(input, total), input.options());
  if (row_elems == 0) return output;
  const auto stream = at::cuda::getCurrentCUDAStream(device_index_).stream();
  const ncclDataType_t dtype = nccl_dtype(input.scalar_type());
  const int64_t row_bytes = row_elems * input.element_size();
  const char* in = static_cast<const char*>(input.data_ptr());
  char* out = static_cast<char*>(output.data_ptr());
  NCCL_COMM_CHECK(ncclGroupStart());
  int64_t soff = 0, roff = 0;
  for (int r = 0; r < size(); ++r) {
    if (send_counts[r] > 0)
      NCCL_COMM_CHECK(ncclSend(in + soff * row_bytes, send_counts[r] * row_elems, dtype, r, comm_,
                          stream));
    if (received[r] > 0)
      NCCL_COMM_CHECK(ncclRecv(out + roff * row_bytes, received[r] * row_elems, dtype, r, comm_,
                          stream));
    soff += send_counts[r];
    roff += received[r];
  }
  NCCL_COMM_CHECK(ncclGroupEnd());
  watch(describe("all_to_all_v", output));
  return output;
}

void NcclCommunicator::barrier() {
  // A one-element allreduce, then a wait for it: every rank's stream has reached this point.
  c10::cuda::CUDAGuard guard(device_index_);
  torch::Tensor token = torch::zeros({1}, torch::TensorOptions().device(device()));
  allreduce(token, ReduceOp::Sum);
  CUDA_CHECK(cudaStreamSynchronize(at::cuda::getCurrentCUDAStream(device_index_).stream()));
}

}  // namespace tessera::distributed
