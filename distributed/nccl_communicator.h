// Communicator backend for CUDA tensors over NCCL. MPI only bootstraps it (the ncclUniqueId is
// broadcast with MPI_Bcast); a watchdog polls NCCL's async errors and aborts the communicator.
#pragma once

#include <nccl.h>

#include <memory>
#include <string>

#include "distributed/abort_once.h"
#include "distributed/communicator.h"
#include "distributed/process_context.h"

namespace tessera::distributed {

// Collectives are enqueued on the caller's current CUDA stream of the communicator's device, so
// they are ordered with the surrounding torch work; the call returns once enqueued.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ProcessContext& context, int device_index);
  ~NcclCommunicator() override;

  Backend backend() const override { return Backend::Nccl; }
  torch::Device device() const override { return torch::Device(torch::kCUDA, device_index_); }

  void allreduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) override;
  void broadcast(torch::Tensor& tensor, int root) override;
  torch::Tensor allgather(const torch::Tensor& tensor) override;
  torch::Tensor allgatherv(const torch::Tensor& tensor) override;
  torch::Tensor all_to_all_v(const torch::Tensor& input, const std::vector<int64_t>& send_counts,
                             std::vector<int64_t>* recv_counts) override;
  void barrier() override;

  // The NCCL handle, for a caller's own NCCL calls (bench allreduce's baseline); their result goes
  // through check(), as the communicator's own calls do.
  ncclComm_t raw() const { return comm_; }
  // Throws DistributedError when `code` is an NCCL failure, after aborting this communicator once.
  void check(ncclResult_t code, const char* expr, const char* file, int line) {
    if (code != ncclSuccess && code != ncclInProgress) fail(code, expr, file, line);
  }
  // Aborts the communicator unless it has ended (aborted or destroyed); any thread, any number of
  // times. The destructor then leaves it alone.
  void abort();

 private:
  // Records an event after the enqueued work and has the watchdog follow it to completion.
  void watch(const std::string& what);
  void require_live(const char* expr) const;
  [[noreturn]] void fail(ncclResult_t code, const char* expr, const char* file, int line);

  ProcessContext& context_;
  int device_index_;
  ncclComm_t comm_ = nullptr;
  uint64_t hooks_id_ = 0;
  // Ended once: by a failed call, the watchdog's abort hook (its thread) or the destructor.
  std::shared_ptr<AbortOnce> handle_ = std::make_shared<AbortOnce>();
};

// The NCCL library's version, "major.minor.patch".
std::string nccl_library_version();

}  // namespace tessera::distributed
