// The data plane: collectives on torch tensors behind one interface (docs/distributed.md).
// MpiCommunicator serves CPU tensors (and CI); NcclCommunicator serves CUDA tensors.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::distributed {

class ProcessContext;

enum class ReduceOp { Sum, Avg, Max, Min };
enum class Backend { Mpi, Nccl };

const char* to_string(ReduceOp op);
const char* to_string(Backend backend);

// A collective launched without waiting. wait() blocks until the result is in the tensor the
// collective was given (for NCCL: until it is ordered on the caller's current stream).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

// Every collective must be called by all ranks, in the same order, with tensors of the same dtype
// (and, where stated, the same shape). Supported dtypes: float32, float64, bfloat16, float16, int32,
// int64, uint8. Tensors of the wrong device or dtype throw UserError; a failed or timed-out
// collective aborts the whole job (exit code 3) and never hangs.
// Payload bytes this rank has handed to collectives since the communicator was made, by kind.
// Benchmarks read it before and after a step to report the bytes a step moves between ranks.
struct Traffic {
  int64_t all_to_all_bytes = 0;  // all_to_all_v rows sent to other ranks (not those kept here)
  int64_t allreduce_bytes = 0;   // tensors given to allreduce and allreduce_async
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  const Traffic& traffic() const { return traffic_; }

  virtual Backend backend() const = 0;
  virtual torch::Device device() const = 0;
  int rank() const { return rank_; }
  int size() const { return size_; }

  // In place; `tensor` has the same shape on every rank. Avg of an integer tensor truncates.
  virtual void allreduce(torch::Tensor& tensor, ReduceOp op) = 0;  // [any]
  // Starts an in-place allreduce; the tensor must stay alive and untouched until wait().
  virtual std::unique_ptr<Work> allreduce_async(torch::Tensor tensor, ReduceOp op) = 0;  // [any]
  // In place: every rank ends with root's values.
  virtual void broadcast(torch::Tensor& tensor, int root) = 0;  // [any]
  // Returns [size, *tensor.shape]: row r is rank r's tensor.
  virtual torch::Tensor allgather(const torch::Tensor& tensor) = 0;  // [*] -> [size, *]
  // Each rank gives [n_r, *rest] (n_r may differ and be 0; rest is the same on every rank).
  // Returns [sum n_r, *rest], rank 0's rows first.
  virtual torch::Tensor allgatherv(const torch::Tensor& tensor) = 0;  // [n_r, *] -> [N, *]
  // `input` is [sum(send_counts), *rest]; its first send_counts[d] rows go to rank d, the next
  // to rank d+1, and so on. Returns [sum(recv), *rest], the rows from rank 0 first. When
  // `recv_counts` is given it receives the per-source row counts.
  virtual torch::Tensor all_to_all_v(const torch::Tensor& input,                // [S, *]
                                     const std::vector<int64_t>& send_counts,   // [size]
                                     std::vector<int64_t>* recv_counts = nullptr) = 0;
  virtual void barrier() = 0;

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}
  // Shared argument checks; `what` names the collective in messages.
  void check_tensor(const torch::Tensor& tensor, const char* what) const;
  // Counts the bytes of an all_to_all_v's rows bound for other ranks into traffic().
  void count_all_to_all(const torch::Tensor& input, const std::vector<int64_t>& send_counts);

  Traffic traffic_;

 private:
  int rank_;
  int size_;
};

// "auto" picks NCCL for a CUDA device and MPI for the CPU; "mpi" or "nccl" forces one. Throws
// UserError for an unknown name or for NCCL on a build or device that cannot run it.
std::unique_ptr<Communicator> make_communicator(ProcessContext& context, const std::string& backend,
                                                torch::Device device);

// True when this build can create an NcclCommunicator (NCCL was found at configure time).
bool nccl_available();
// NCCL's version as "major.minor.patch", or "none".
std::string nccl_version();

}  // namespace tessera::distributed
