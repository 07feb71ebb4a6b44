// MpiCommunicator: every collective on CPU tensors with MPI, each watched by the watchdog.
// Large tensors are reduced in chunks so that element counts fit MPI's int.
#include "distributed/mpi_communicator.h"

#include <exception>
#include <limits>

#include "distributed/collective_args.h"
#include "distributed/errors.h"
#include "distributed/mpi_types.h"
#include "distributed/watchdog.h"

namespace tessera::distributed {

namespace {

// MPI counts are int; chunks of 2^30 elements stay well inside that.
constexpr int64_t kMaxChunkElements = int64_t{1} << 30;

int to_int_count(int64_t count, const char* what) {
  if (count > std::numeric_limits<int>::max())
    throw UserError(std::string(what) + ": " + std::to_string(count) +
                    " rows exceed MPI's int count; split the tensor");
  return static_cast<int>(count);
}

std::string describe(const char* what, const torch::Tensor& t) {
  return std::string(what) + " of " + std::to_string(t.numel() * t.element_size()) + " bytes";
}

// A committed MPI datatype of one row of `t` (freed on scope exit).
class RowType {
 public:
  RowType(const torch::Tensor& t, int64_t row_elems) {
    MPI_CHECK(MPI_Type_contiguous(to_int_count(row_elems, "row"), mpi_datatype(t.scalar_type()),
                                  &type_));
    MPI_CHECK(MPI_Type_commit(&type_));
  }
  ~RowType() { MPI_Type_free(&type_); }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

class MpiWork final : public Work {
 public:
  MpiWork(Watchdog& dog, uint64_t id, MPI_Request request, torch::Tensor tensor,
          torch::Tensor target, ReduceOp op, int size)
      : dog_(dog), id_(id), request_(request), tensor_(std::move(tensor)),
        target_(std::move(target)), op_(op), size_(size) {}
  ~MpiWork() override {
    if (request_ != MPI_REQUEST_NULL) wait();
  }
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE));
    dog_.finish(id_);
    detail::finish_avg(tensor_, op_, size_);
    if (!target_.is_same(tensor_)) target_.copy_(tensor_);
  }

 private:
  Watchdog& dog_;
  uint64_t id_;
  MPI_Request request_;
  torch::Tensor tensor_;  // contiguous buffer MPI works on
  torch::Tensor target_;  // the caller's tensor
  ReduceOp op_;
  int size_;
};

}  // namespace

std::vector<int64_t> allgather_counts(MPI_Comm comm, int64_t count) {
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<int64_t> counts(size);
  MPI_CHECK(MPI_Allgather(&count, 1, MPI_INT64_T, counts.data(), 1, MPI_INT64_T, comm));
  return counts;
}

MpiCommunicator::MpiCommunicator(ProcessContext& context)
    : Communicator(context.rank(), context.size()), context_(context) {
  MPI_CHECK(MPI_Comm_dup(context.world(), &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  create_mpi_types();
}

namespace {
int rank_in(MPI_Comm comm) {
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}
int size_of(MPI_Comm comm) {
  int size = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}
}  // namespace

MpiCommunicator::MpiCommunicator(ProcessContext& context, MPI_Comm comm)
    : Communicator(rank_in(comm), size_of(comm)), context_(context) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  create_mpi_types();
}

MpiCommunicator::~MpiCommunicator() {
  // Freeing a communicator may synchronize with peers; skip it while an exception unwinds (the
  // job is about to be aborted) or after MPI is gone.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || std::uncaught_exceptions() > 0) return;
  release_mpi_types();
  MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(torch::Tensor& tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce");
  traffic_.allreduce_bytes += static_cast<int64_t>(tensor.nbytes());
  if (tensor.numel() == 0) return;
  Watchdog::Scope watch(context_.watchdog(), describe("allreduce", tensor));
  torch::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const MPI_Datatype type = mpi_datatype(buffer.scalar_type());
  const MPI_Op mop = mpi_op(buffer.scalar_type(), op);
  char* data = static_cast<char*>(buffer.data_ptr());
  const int64_t element = buffer.element_size();
  for (int64_t offset = 0; offset < buffer.numel(); offset += kMaxChunkElements) {
    const int count = static_cast<int>(std::min(kMaxChunkElements, buffer.numel() - offset));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + offset * element, count, type, mop, comm_));
  }
  detail::finish_avg(buffer, op, size());
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

std::unique_ptr<Work> MpiCommunicator::allreduce_async(torch::Tensor tensor, ReduceOp op) {
  check_tensor(tensor, "allreduce_async");
  traffic_.allreduce_bytes += static_cast<int64_t>(tensor.nbytes());
  torch::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const uint64_t id = context_.watchdog().start(describe("allreduce_async", tensor));
  MPI_Request request = MPI_REQUEST_NULL;
  if (buffer.numel() > 0) {
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buffer.data_ptr(),
                             to_int_count(buffer.numel(), "allreduce_async"),
                             mpi_datatype(buffer.scalar_type()), mpi_op(buffer.scalar_type(), op),
                             comm_, &request));
  } else {
    context_.watchdog().finish(id);
  }
  return std::make_unique<MpiWork>(context_.watchdog(), id, request, buffer, tensor, op, size());
}

void MpiCommunicator::broadcast(torch::Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast");
  if (root < 0 || root >= size())
    throw UserError("broadcast: root " + std::to_string(root) + " is not a rank of " +
                    std::to_string(size()));
  if (tensor.numel() == 0) return;
  Watchdog::Scope watch(context_.watchdog(), describe("broadcast", tensor));
  torch::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const MPI_Datatype type = mpi_datatype(buffer.scalar_type());
  char* data = static_cast<char*>(buffer.data_ptr());
  const int64_t element = buffer.element_size();
  for (int64_t offset = 0; offset < buffer.numel(); offset += kMaxChunkElements) {
    const int count = static_cast<int>(std::min(kMaxChunkElements, buffer.numel() - offset));
    MPI_CHECK(MPI_Bcast(data + offset * element, count, type, root, comm_));
  }
  if (!buffer.is_same(tensor)) tensor.copy_(buffer);
}

torch::Tensor MpiCommunicator::allgather(const torch::Tensor& tensor) {
  check_tensor(tensor, "allgather");
  const torch::Tensor input = tensor.contiguous();
  std::vector<int64_t> shape{size()};
  shape.insert(shape.end(), input.sizes().begin(), input.sizes().end());
  torch::Tensor output = torch::empty(shape, input.options());
  if (input.numel() == 0) return output;
  Watchdog::Scope watch(context_.watchdog(), describe("allgather", input));
  const int count = to_int_count(input.numel(), "allgather");
  const MPI_Datatype type = mpi_datatype(input.scalar_type());
  MPI_CHECK(MPI_Allgather(input.data_ptr(), count, type, output.data_ptr(), count, type, comm_));
  return output;
}

torch::Tensor MpiCommunicator::allgatherv(const torch::Tensor& tensor) {
  check_tensor(tensor, "allgatherv");
  detail::require_rows(tensor, "allgatherv");
  const torch::Tensor input = tensor.contiguous();
  Watchdog::Scope watch(context_.watchdog(), describe("allgatherv", input));
  const int64_t row_elems = detail::row_elements(input);
  const std::vector<int64_t> rows = allgather_counts(comm_, input.size(0));
  const std::vector<int64_t> widths = allgather_counts(comm_, row_elems);
  detail::require_same_row_width(widths, row_elems);
  std::vector<int> counts(size()), displs(size());
  int64_t total = 0;
  for (int r = 0; r < size(); ++r) {
    counts[r] = to_int_count(rows[r], "allgatherv");
    displs[r] = to_int_count(total, "allgatherv");
    total += rows[r];
  }
  torch::Tensor output = torch::empty(detail::shape_with_rows(input, total), input.options());
  if (total == 0 || row_elems == 0) return output;
  RowType row(input, row_elems);
  MPI_CHECK(MPI_Allgatherv(input.data_ptr(), counts[rank()], row.get(), output.data_ptr(),
                           counts.data(), displs.data(), row.get(), comm_));
  return output;
}

torch::Tensor MpiCommunicator::all_to_all_v(const torch::Tensor& input_tensor,
                                            const std::vector<int64_t>& send_counts,
                                            std::vector<int64_t>* recv_counts) {
  check_tensor(input_tensor, "all_to_all_v");
  detail::require_send_counts(input_tensor, send_counts, size());
  count_all_to_all(input_tensor, send_counts);
  const torch::Tensor input = input_tensor.contiguous();
  Watchdog::Scope watch(context_.watchdog(), describe("all_to_all_v", input));
  std::vector<int64_t> received(size());
  MPI_CHECK(MPI_Alltoall(send_counts.data(), 1, MPI_INT64_T, received.data(), 1, MPI_INT64_T,
                         comm_));
  std::vector<int> scounts(size()), sdispls(size()), rcounts(size()), rdispls(size());
  int64_t soff = 0, roff = 0;
  for (int r = 0; r < size(); ++r) {
    scounts[r] = to_int_count(send_counts[r], "all_to_all_v");
    sdispls[r] = to_int_count(soff, "all_to_all_v");
    rcounts[r] = to_int_count(received[r], "all_to_all_v");
    rdispls[r] = to_int_count(roff, "all_to_all_v");
    soff += send_counts[r];
    roff += received[r];
  }
  if (recv_counts != nullptr) *recv_counts = received;
  const int64_t row_elems = detail::row_elements(input);
  torch::Tensor output = torch::empty(detail::shape_with_rows(input, roff), input.options());
  if (row_elems == 0) return output;
  RowType row(input, row_elems);
  MPI_CHECK(MPI_Alltoallv(input.data_ptr(), scounts.data(), sdispls.data(), row.get(),
                          output.data_ptr(), rcounts.data(), rdispls.data(), row.get(), comm_));
  return output;
}

void MpiCommunicator::barrier() {
  Watchdog::Scope watch(context_.watchdog(), "barrier");
  MPI_CHECK(MPI_Barrier(comm_));
}

}  // namespace tessera::distributed
