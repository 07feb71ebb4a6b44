// CPU fixed_point_add / normalize / to_float: element-wise loops split across threads (each
// element's digits are its own, so the thread count cannot change a bit), and the dispatch
// between the CPU and CUDA implementations.
#include "kernels/fixed_point.h"

#include <ATen/ops/empty.h>

#include <atomic>
#include <limits>

#include "kernels/cpu/parallel.h"
#include "kernels/device_dispatch.h"
#include "kernels/fixed_point_math.h"

namespace tessera::kernels {

namespace {

constexpr int64_t kGrain = 1 << 14;

void check_acc(const at::Tensor& acc, const char* op) {
  TORCH_CHECK(acc.scalar_type() == at::kLong && acc.dim() == 2 &&
                  acc.size(1) == kFixedPointLimbs && acc.is_contiguous(),
              op, ": the accumulator must be a contiguous int64 [n, 4] tensor");
}

}  // namespace

void cpu::fixed_point_add(at::Tensor& acc, const at::Tensor& values, at::Tensor& bad) {
  check_acc(acc, "fixed_point_add");
  TORCH_CHECK(values.scalar_type() == at::kFloat, "fixed_point_add: values must be float32");
  TORCH_CHECK(values.numel() == acc.size(0), "fixed_point_add: ", values.numel(),
              " values for an accumulator of ", acc.size(0));
  TORCH_CHECK(bad.scalar_type() == at::kLong && bad.numel() == 1 && bad.is_cpu(),
              "fixed_point_add: bad must be an int64 [1] tensor on the CPU");
  const at::Tensor v = values.contiguous();
  const float* in = v.data_ptr<float>();
  int64_t* limbs = acc.data_ptr<int64_t>();
  std::atomic<int64_t> rejected{0};
  tessera::parallel_for(0, v.numel(), kGrain, [&](int64_t begin, int64_t end) {
    int64_t local = 0;
    for (int64_t i = begin; i < end; ++i)
      if (in[i] != 0.0f && !fixed_point::add(in[i], limbs + i * kFixedPointLimbs)) ++local;
    if (local) rejected.fetch_add(local, std::memory_order_relaxed);
  });
  bad.data_ptr<int64_t>()[0] += rejected.load();
}

void cpu::fixed_point_normalize(at::Tensor& acc) {
  check_acc(acc, "fixed_point_normalize");
  int64_t* limbs = acc.data_ptr<int64_t>();
  tessera::parallel_for(0, acc.size(0), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) fixed_point::normalize(limbs + i * kFixedPointLimbs);
  });
}

at::Tensor cpu::fixed_point_to_float(const at::Tensor& acc, at::ScalarType dtype) {
  check_acc(acc, "fixed_point_to_float");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble,
              "fixed_point_to_float: dtype must be float32 or float64");
  at::Tensor out = at::empty({acc.size(0)}, acc.options().dtype(dtype));
  const int64_t* limbs = acc.data_ptr<int64_t>();
  tessera::parallel_for(0, acc.size(0), kGrain, [&](int64_t begin, int64_t end) {
    if (dtype == at::kFloat) {
      float* o = out.data_ptr<float>();
      for (int64_t i = begin; i < end; ++i)
        o[i] = static_cast<float>(fixed_point::to_double(limbs + i * kFixedPointLimbs));
    } else {
      double* o = out.data_ptr<double>();
      for (int64_t i = begin; i < end; ++i)
        o[i] = fixed_point::to_double(limbs + i * kFixedPointLimbs);
    }
  });
  return out;
}

void fixed_point_add(at::Tensor& acc, const at::Tensor& values, at::Tensor& bad) {
  on_device("fixed_point_add", acc, [&] { cpu::fixed_point_add(acc, values, bad); },
            [&] { cuda::fixed_point_add(acc, values, bad); });
}

void fixed_point_normalize(at::Tensor& acc) {
  on_device("fixed_point_normalize", acc, [&] { cpu::fixed_point_normalize(acc); },
            [&] { cuda::fixed_point_normalize(acc); });
}

at::Tensor fixed_point_to_float(const at::Tensor& acc, at::ScalarType dtype,
                                const at::Tensor& bad) {
  at::Tensor out = on_device("fixed_point_to_float", acc,
                             [&] { return cpu::fixed_point_to_float(acc, dtype); },
                             [&] { return cuda::fixed_point_to_float(acc, dtype); });
  if (bad.defined()) out.masked_fill_(bad.reshape({1}).gt(0), std::numeric_limits<double>::quiet_NaN());
  return out;
}

}  // namespace tessera::kernels
