// How Tessera's CPU code is compiled, in one place: whether this is a ThreadSanitizer build, and
// the attribute that compiles a hot function twice.
#pragma once

// TESSERA_THREAD_SANITIZER: defined in a ThreadSanitizer build (launch/test --sanitize thread).
#if defined(__SANITIZE_THREAD__)
#define TESSERA_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TESSERA_THREAD_SANITIZER 1
#endif
#endif

// TESSERA_AVX2_CLONES: on x86-64 with GCC or Clang, the function is compiled for AVX2 and for the
// baseline ISA and the loader picks one by the CPU (an ifunc). Elsewhere it is compiled once, for
// the target, and once in a ThreadSanitizer build: the ifunc's resolver runs while the loader
// relocates, before TSan's runtime is up, and TSan's instrumentation of it crashes there.
// target_clones takes plain functions, not templates.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(TESSERA_THREAD_SANITIZER)
#define TESSERA_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TESSERA_AVX2_CLONES
#endif
