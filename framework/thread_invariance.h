// Bits that do not depend on a rank's thread count (docs/training_loop.md, "Bitwise at any world
// size"). torch's CPU ops split their work over the intra-op threads, and some of them then compute
// different bits:
// - oneMKL splits the inner sum of some GEMMs (a weight gradient: few outputs, many rows) over its
//   threads. Its strict conditional numerical reproducibility mode (MKL_CBWR=AUTO,STRICT) is meant
//   to prevent that but does not for every shape (a weight gradient of 5 x 37 over 4093 rows
//   differs at 4 threads);
// - an elementwise op on more than 32768 values is cut into one range per thread, and each range's
//   last values take the scalar code, whose transcendentals (sigmoid, softplus, silu, exp) can
//   differ from the vectorized code's in the last bit;
// - full reductions add per-thread partial sums.
// So the bitwise path runs torch's ops on one thread (TorchOnOneThread) while Tessera's own loops,
// written to give the same bits for any split (kernels/cpu/parallel.h), keep every thread.
#pragma once

#include <c10/core/Device.h>

#include <cstdlib>
#include <optional>

namespace tessera {

// oneMKL's code path for this CPU, with results that do not depend on where a GEMM's operands lie
// in memory (which differs from rank to rank); strict adds nothing on one thread but costs nothing.
inline constexpr const char* kMklReproducibleMode = "AUTO,STRICT";

// Sets MKL_CBWR to kMklReproducibleMode unless the environment names a mode already (a user's
// choice is kept: e.g. AVX2,STRICT on a cluster of mixed CPUs). Call first thing in main(): oneMKL
// reads it once, at the process's first GEMM.
inline void request_reproducible_blas() { setenv("MKL_CBWR", kMklReproducibleMode, 0); }

enum class BlasMode { Reproducible, NotReproducible, Unknown };
// Whether torch's BLAS runs in a oneMKL reproducible (CNR) mode: Unknown where it is not oneMKL
// or does not say.
BlasMode blas_mode();

// While alive: torch's intra-op threads (its elementwise ops, reductions and oneMKL's GEMMs) are
// one, on this thread and any it starts, and Tessera's own loops (tessera::parallel_for) run on the
// threads torch had. Nests. For the bitwise path's work on the CPU: its units, its evals.
class TorchOnOneThread {
 public:
  TorchOnOneThread();
  ~TorchOnOneThread();
  TorchOnOneThread(const TorchOnOneThread&) = delete;
  TorchOnOneThread& operator=(const TorchOnOneThread&) = delete;

 private:
  int torch_threads_;     // torch's count before
  int own_loop_threads_;  // Tessera's loops' before (0: torch's)
};

// A TorchOnOneThread for the bitwise path's CPU work (`bitwise` is run.deterministic); empty
// elsewhere (the float path, or a GPU, whose kernels do not split by CPU threads).
inline std::optional<TorchOnOneThread> torch_on_one_thread_if(bool bitwise,
                                                              const c10::Device& device) {
  if (!bitwise || !device.is_cpu()) return std::nullopt;
  return std::optional<TorchOnOneThread>(std::in_place);
}

}  // namespace tessera
