// TESSERA_HD marks inline math shared by the CPU and the CUDA implementation of an op:
// __host__ __device__ under nvcc, nothing in plain C++.
#pragma once

#ifdef __CUDACC__
#define TESSERA_HD __host__ __device__
#else
#define TESSERA_HD
#endif
