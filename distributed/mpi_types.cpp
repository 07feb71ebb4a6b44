// torch dtype -> MPI datatype, ReduceOp -> MPI_Op, and the user-defined bfloat16/float16
// datatypes and reductions (each pairwise combine rounds to the 2-byte type, as NCCL's do).
#include "distributed/mpi_types.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <mutex>

#include "distributed/errors.h"

namespace tessera::distributed {

namespace {

struct HalfTypes {
  int users = 0;
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype f16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, bf16_max = MPI_OP_NULL, bf16_min = MPI_OP_NULL;
  MPI_Op f16_sum = MPI_OP_NULL, f16_max = MPI_OP_NULL, f16_min = MPI_OP_NULL;
};
HalfTypes g_types;
std::mutex g_types_mutex;

template <typename T, typename Combine>
void combine(void* in, void* inout, int* len, Combine f) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}

template <typename T>
void sum_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine<T>(in, inout, len, [](float x, float y) { return x + y; });
}
template <typename T>
void max_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine<T>(in, inout, len, [](float x, float y) { return std::max(x, y); });
}
template <typename T>
void min_fn(void* in, void* inout, int* len, MPI_Datatype*) {
  combine<T>(in, inout, len, [](float x, float y) { return std::min(x, y); });
}

}  // namespace

void create_mpi_types() {
  std::lock_guard<std::mutex> lock(g_types_mutex);
  if (g_types.users++ > 0) return;
  MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &g_types.bf16));
  MPI_CHECK(MPI_Type_commit(&g_types.bf16));
  MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &g_types.f16));
  MPI_CHECK(MPI_Type_commit(&g_types.f16));
  MPI_CHECK(MPI_Op_create(&sum_fn<c10::BFloat16>, 1, &g_types.bf16_sum));
  MPI_CHECK(MPI_Op_create(&max_fn<c10::BFloat16>, 1, &g_types.bf16_max));
  MPI_CHECK(MPI_Op_create(&min_fn<c10::BFloat16>, 1, &g_types.bf16_min));
  MPI_CHECK(MPI_Op_create(&sum_fn<c10::Half>, 1, &g_types.f16_sum));
  MPI_CHECK(MPI_Op_create(&max_fn<c10::Half>, 1, &g_types.f16_max));
  MPI_CHECK(MPI_Op_create(&min_fn<c10::Half>, 1, &g_types.f16_min));
}

void release_mpi_types() {
  std::lock_guard<std::mutex> lock(g_types_mutex);
  if (--g_types.users > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* op : {&g_types.bf16_sum, &g_types.bf16_max, &g_types.bf16_min, &g_types.f16_sum,
                     &g_types.f16_max, &g_types.f16_min})
    MPI_Op_free(op);
  MPI_Type_free(&g_types.bf16);
  MPI_Type_free(&g_types.f16);
}

MPI_Datatype mpi_datatype(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32: return MPI_FLOAT;
    case torch::kFloat64: return MPI_DOUBLE;
    case torch::kInt32: return MPI_INT32_T;
    case torch::kInt64: return MPI_INT64_T;
    case torch::kUInt8: return MPI_UINT8_T;
    case torch::kBFloat16: return g_types.bf16;
    case torch::kFloat16: return g_types.f16;
    default:
      throw UserError(std::string("collectives do not support dtype ") + c10::toString(dtype) +
                      " (use float32, float64, bfloat16, float16, int32, int64 or uint8)");
  }
}

MPI_Op mpi_op(torch::ScalarType dtype, ReduceOp op) {
  if (dtype == torch::kBFloat16 || dtype == torch::kFloat16) {
    const bool bf = dtype == torch::kBFloat16;
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return bf ? g_types.bf16_sum : g_types.f16_sum;
      case ReduceOp::Max: return bf ? g_types.bf16_max : g_types.f16_max;
      case ReduceOp::Min: return bf ? g_types.bf16_min : g_types.f16_min;
    }
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

}  // namespace tessera::distributed
