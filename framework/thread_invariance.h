// Bits that do not depend on a rank's thread count (docs/training_loop.md, "Bitwise at any world
// size"). torch's CPU BLAS, oneMKL, splits the inner sums of some GEMMs (a weight gradient: few
// outputs, many rows) over its threads, so a GEMM's bits follow the thread count. Its strict
// conditional-numerical-reproducibility mode (MKL_CBWR=AUTO,STRICT) is meant to prevent that but
// does not for every shape (a weight gradient of 5 x 37 over 4093 rows differs at 4 threads), so
// the bitwise path runs its GEMMs on one thread (SingleThreadedBlas); the mode still makes a GEMM's
// bits independent of its operands' alignment in memory, which differs from rank to rank.
#pragma once

#include <cstdlib>

namespace tessera {

// oneMKL's code path for this CPU, with results that do not depend on alignment.
inline constexpr const char* kMklReproducibleMode = "AUTO,STRICT";

// Sets MKL_CBWR to kMklReproducibleMode unless the environment names a mode already (a user's
// choice is kept: e.g. AVX2,STRICT on a cluster of mixed CPUs). Call first thing in main(): oneMKL
// reads it once, at the process's first GEMM.
inline void request_reproducible_blas() { setenv("MKL_CBWR", kMklReproducibleMode, 0); }

enum class BlasMode { Reproducible, NotReproducible, Unknown };
// Whether torch's BLAS runs in a oneMKL reproducible (CNR) mode: Unknown where it is not oneMKL
// or does not say.
BlasMode blas_mode();

// While alive, torch's oneMKL GEMMs called from this thread run on one thread, so that their bits
// do not depend on distributed.threads; torch's own kernels keep their threads. A no-op where
// torch's BLAS is not oneMKL (available() says which).
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
  static bool available();

 private:
  int previous_ = -1;  // oneMKL's thread-local setting before (0: its global one); -1: none
};

}  // namespace tessera
