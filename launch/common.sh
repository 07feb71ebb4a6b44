# Shared by launch/setup, launch/build, launch/test and launch/demo: paths, the torch pin and
# small helpers. Sourced, never run.

TESSERA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# LibTorch comes from the PyPI torch wheel, pinned to 2.11.0: that wheel is built for CUDA 13.0,
# the CUDA major of /usr/local/cuda here, and it is the torch preinstalled on the GPU machines
# (2.11 + CUDA 13.0), so the same sources build and link against both.
TESSERA_TORCH_VERSION="2.11.0"

# The torch environment lives outside the clone and .venv links to it, so a fresh clone on a
# machine that already has it is set up in seconds instead of downloading gigabytes again.
TESSERA_VENV="${TESSERA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera/venv-torch-${TESSERA_TORCH_VERSION}}"

TESSERA_BUILD_DIR="${TESSERA_BUILD_DIR:-$TESSERA_ROOT/build}"

tessera_say() { printf '\033[1m[tessera]\033[0m %s\n' "$*" >&2; }

tessera_jobs() {
  local cores
  cores=$(nproc 2>/dev/null || echo 2)
  # Each torch translation unit needs ~1.5 GiB; keep a margin on small machines.
  local mem_gib
  mem_gib=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo 2>/dev/null || echo 4)
  local by_mem=$(( mem_gib / 2 > 0 ? mem_gib / 2 : 1 ))
  echo $(( cores < by_mem ? cores : by_mem ))
}

# mpirun flags every local job needs: OpenMPI refuses root unless told, and a laptop or CI box
# may have fewer cores than ranks. On SIGTERM or Ctrl-C mpirun waits odls_base_sigkill_timeout
# seconds (default 1) before it passes SIGTERM to the ranks and as long again before SIGKILL:
# 10 s leaves them time for their stop snapshot (docs/clusters.md, "Signals").
tessera_mpirun_flags() {
  local flags=(--oversubscribe --mca odls_base_sigkill_timeout 10)
  if [ "$(id -u)" = 0 ]; then flags+=(--allow-run-as-root); fi
  echo "${flags[@]}"
}

# The GPU check's CUDA test cases: the gtest filter that selects them (cases named Cuda/Nccl, and
# the suites parameterized by backend, whose NCCL instances end in /nccl), and the test sources
# that have any (launch/gpu-check-prepare bundles those binaries; launch/gpu-check --build builds them).
TESSERA_CUDA_TEST_FILTER='*Cuda*:*CUDA*:*Nccl*:*NCCL*:*/nccl'
tessera_cuda_test_binaries() {  # prints the test binary names, one per line
  local src
  for src in "$TESSERA_ROOT"/tests/test_*.cpp; do
    if grep -qE 'TEST(_F|_P)?\([^)]*(Cuda|CUDA|Nccl|NCCL)|Values\([^)]*"nccl"' "$src"; then
      basename "$src" .cpp
    fi
  done
}

# The sanitizer builds (launch/test --sanitize, launch/fuzz; docs/testing.md): clang, CPU only,
# one folder per sanitizer set. The address,undefined build also holds the libFuzzer targets, so
# launch/fuzz and `launch/test --sanitize address,undefined` share one build.
TESSERA_SANITIZER_SETS="address,undefined thread"
tessera_sanitizer_build_dir() {  # $1: a sanitizer set; prints its build folder, or fails
  case "$1" in
    address,undefined) echo "$TESSERA_ROOT/build-asan" ;;
    thread) echo "$TESSERA_ROOT/build-tsan" ;;
    *) return 1 ;;
  esac
}
tessera_configure_sanitized() {  # $1: a sanitizer set; configures its folder (once)
  local dir
  dir=$(tessera_sanitizer_build_dir "$1")
  if [ ! -f "$dir/build.ninja" ]; then
    local args=(-G Ninja -S "$TESSERA_ROOT" -B "$dir" -DTESSERA_CUDA=OFF "-DTESSERA_SANITIZE=$1")
    if [ "$1" = address,undefined ]; then args+=(-DTESSERA_FUZZ=ON); fi
    if [ -n "${TESSERA_PYTHON:-}" ]; then args+=("-DTESSERA_PYTHON=$TESSERA_PYTHON"); fi
    tessera_say "configuring $dir (clang, -fsanitize=$1, no CUDA)"
    CC=clang CXX=clang++ cmake "${args[@]}" >&2
  fi
}
# The runtime options of every sanitized run: reports stop the program and name the code, and
# the suppressions (third-party libraries only) are tests/sanitizers/*.supp.
tessera_sanitizer_env() {
  local supp="$TESSERA_ROOT/tests/sanitizers"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export TSAN_OPTIONS="suppressions=$supp/tsan.supp:halt_on_error=1:second_deadlock_stack=1"
}
