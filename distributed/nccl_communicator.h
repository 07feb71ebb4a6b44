// Communicator backend for CUDA tensors over NCCL. MPI only bootstraps it (the ncclUniqueId is
// broadcast with MPI_Bcast); a watchdog polls NCCL's async errors and aborts the communicator.
#pragma once

#include <nccl.h>

#include <string>

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

  ncclComm_t raw() const { return comm_; }

 private:
  // Records an event after the enqueued work and has the watchdog follow it to completion.
  void watch(const std::string& what);

  ProcessContext& context_;
  int device_index_;
  ncclComm_t comm_ = nullptr;
  uint64_t hooks_id_ = 0;
};

// The NCCL library's version, "major.minor.patch".
std::string nccl_library_version();

}  // namespace tessera::distributed
