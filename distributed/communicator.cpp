// Backend-independent parts of the Communicator: names, argument checks and the factory that
// picks MPI or NCCL from the device and the `distributed.backend` setting.
#include "distributed/communicator.h"

#include <numeric>

#include "distributed/collective_args.h"
#include "distributed/errors.h"
#include "distributed/mpi_communicator.h"
#include "distributed/process_context.h"

#ifdef TESSERA_WITH_NCCL
#include "distributed/nccl_communicator.h"
#endif

namespace tessera::distributed {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

const char* to_string(Backend backend) { return backend == Backend::Mpi ? "mpi" : "nccl"; }

void Communicator::check_tensor(const torch::Tensor& tensor, const char* what) const {
  if (!tensor.defined()) throw UserError(std::string(what) + ": tensor is undefined");
  if (tensor.device().type() != device().type())
    throw UserError(std::string(what) + ": the " + to_string(backend()) +
                    " communicator takes " + device().str() + " tensors, got one on " +
                    tensor.device().str());
  switch (tensor.scalar_type()) {
    case torch::kFloat32: case torch::kFloat64: case torch::kBFloat16: case torch::kFloat16:
    case torch::kInt32: case torch::kInt64: case torch::kUInt8:
      return;
    default:
      throw UserError(std::string(what) + ": dtype " + c10::toString(tensor.scalar_type()) +
                      " is not supported (float32, float64, bfloat16, float16, int32, int64, uint8)");
  }
}

namespace detail {

int64_t row_elements(const torch::Tensor& t) {
  int64_t n = 1;
  for (int64_t d = 1; d < t.dim(); ++d) n *= t.size(d);
  return n;
}

std::vector<int64_t> shape_with_rows(const torch::Tensor& t, int64_t rows) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  shape[0] = rows;
  return shape;
}

void finish_avg(torch::Tensor& t, ReduceOp op, int size) {
  if (op != ReduceOp::Avg) return;
  if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    t.div_(size, "trunc");
  else
    t.div_(size);
}

void require_rows(const torch::Tensor& t, const char* what) {
  if (t.dim() == 0) throw UserError(std::string(what) + ": needs a tensor with a first dimension");
}

void require_same_row_width(const std::vector<int64_t>& widths, int64_t mine) {
  for (size_t r = 0; r < widths.size(); ++r)
    if (widths[r] != mine)
      throw UserError("allgatherv: rank " + std::to_string(r) + " has rows of " +
                      std::to_string(widths[r]) + " elements, this rank " + std::to_string(mine));
}

void require_send_counts(const torch::Tensor& input, const std::vector<int64_t>& send_counts,
                         int size) {
  require_rows(input, "all_to_all_v");
  if (static_cast<int>(send_counts.size()) != size)
    throw UserError("all_to_all_v: " + std::to_string(send_counts.size()) +
                    " send counts for " + std::to_string(size) + " ranks");
  const int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0});
  if (sent != input.size(0))
    throw UserError("all_to_all_v: send counts add up to " + std::to_string(sent) +
                    " rows but the input has " + std::to_string(input.size(0)));
}

}  // namespace detail

void Communicator::count_all_to_all(const torch::Tensor& input,
                                    const std::vector<int64_t>& send_counts) {
  const int64_t rows = std::accumulate(send_counts.begin(), send_counts.end(), int64_t{0}) -
                       send_counts.at(static_cast<size_t>(rank()));
  traffic_.all_to_all_bytes +=
      rows * detail::row_elements(input) * static_cast<int64_t>(input.element_size());
}

bool nccl_available() {
#ifdef TESSERA_WITH_NCCL
  return true;
#else
  return false;
#endif
}

std::string nccl_version() {
#ifdef TESSERA_WITH_NCCL
  return nccl_library_version();
#else
  return "none";
#endif
}

std::unique_ptr<Communicator> make_communicator(ProcessContext& context, const std::string& backend,
                                                torch::Device device) {
  if (backend != "auto" && backend != "mpi" && backend != "nccl")
    throw UserError("unknown distributed backend '" + backend + "' (known: auto, mpi, nccl)");
  const bool want_nccl = backend == "nccl" || (backend == "auto" && device.is_cuda());
  if (!want_nccl) {
    if (device.is_cuda())
      throw UserError("the mpi backend serves CPU tensors only; use distributed.backend = "
                      "\"auto\" or \"nccl\" for " + device.str());
    return std::make_unique<MpiCommunicator>(context);
  }
#ifdef TESSERA_WITH_NCCL
  if (!device.is_cuda())
    throw UserError("the nccl backend needs a CUDA device, got " + device.str() +
                    "; use distributed.backend = \"auto\" or \"mpi\"");
  return std::make_unique<NcclCommunicator>(context, device.index());
#else
  throw UserError("distributed.backend = \"nccl\" but this build has no NCCL; rebuild with the "
                  "CUDA toolkit present, or use \"mpi\"");
#endif
}

}  // namespace tessera::distributed
