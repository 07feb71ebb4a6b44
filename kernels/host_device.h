// TESSERA_HD marks inline math shared by the CPU and the CUDA implementation of an op:
// __host__ __device__ under nvcc, nothing in plain C++.
#pragma once

#ifdef __CUDACC__
#define TESSERA_HD __host__ __device__
#else
#define TESSERA_HD
#endif

namespace tessera::kernels {

// float arithmetic rounded once per operation, never fused: on the device __fadd_rn and friends
// (nvcc contracts a * b + c into one fused multiply-add otherwise, which rounds once instead of
// twice and would move a sample across a cell boundary relative to the CPU); plain arithmetic on
// the host, whose default x86-64 target has no FMA. Shared math that must agree bit for bit
// between the two (cells, rows, sample positions) is written with these.
TESSERA_HD inline float hd_add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TESSERA_HD inline float hd_sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TESSERA_HD inline float hd_mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_HD inline float hd_div_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace tessera::kernels
