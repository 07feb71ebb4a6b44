// Communicator backend for CPU tensors over MPI (also the backend of CI).
// bfloat16 and float16 reductions use MPI user-defined operations on 2-byte types.
#pragma once

#include "distributed/communicator.h"
#include "distributed/process_context.h"

namespace tessera::distributed {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(ProcessContext& context);
  // Over a duplicate of `comm` (e.g. MPI_COMM_SELF for a single-rank reference inside a
  // multi-rank job); rank and size are those of `comm`.
  MpiCommunicator(ProcessContext& context, MPI_Comm comm);
  ~MpiCommunicator() override;

  Backend backend() const override { return Backend::Mpi; }
  torch::Device device() const override { return torch::kCPU; }

  void allreduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) override;
  void broadcast(torch::Tensor& tensor, int root) override;
  torch::Tensor allgather(const torch::Tensor& tensor) override;
  torch::Tensor allgatherv(const torch::Tensor& tensor) override;
  torch::Tensor all_to_all_v(const torch::Tensor& input, const std::vector<int64_t>& send_counts,
                             std::vector<int64_t>* recv_counts) override;
  void barrier() override;

 private:
  ProcessContext& context_;
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Row counts exchanged over the control plane: every rank's `count`, rank order.
std::vector<int64_t> allgather_counts(MPI_Comm comm, int64_t count);

}  // namespace tessera::distributed
