// Memory accounting per device: a process-wide counting CPU allocator, and the CUDA caching
// allocator's statistics, behind one API used by tests, benchmarks and the progress line.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct MemoryStats {
  bool available = false;        // false: not measurable (CPU before install, CUDA not built)
  int64_t current_bytes = 0;     // bytes currently allocated by tensors
  int64_t peak_bytes = 0;        // high-water mark of current_bytes since the last reset_peak
  int64_t reserved_bytes = 0;    // CUDA: held by the caching allocator; CPU: = current_bytes
};

// Replaces the CPU allocator of this process by one that counts the bytes it hands out and
// delegates to the original allocator. Idempotent and thread-safe; never uninstalled (blocks
// it handed out may outlive any scope). Only blocks allocated through it are counted: a tensor
// allocated before installation keeps the original deleter and is freed without touching the
// counts, so they never go negative. Allocations that bypass c10::GetCPUAllocator() (pinned
// memory, from_blob) are not counted.
void install_counting_cpu_allocator();
bool counting_cpu_allocator_installed();

// Keeps memory that the process frees for its own reuse instead of giving it back to the
// operating system at once. glibc's malloc serves every block over 32 MiB with a fresh mmap and
// unmaps it on free, and trims the heap whenever its top is free: a training step that allocates
// and frees the same few hundred MiB of activations each time then spends most of its time in
// page faults (a hash-grid radiance field on a real capture, 2 CPU ranks: 1m16s of system
// time in 40 steps before, 14 s after). So large blocks come from the heap (M_MMAP_MAX 0) and the heap is never
// trimmed (M_TRIM_THRESHOLD): the resident size stays at its peak, as CUDA's caching allocator
// does on the GPU. Call once, first thing in main. Does nothing where the C library is not glibc
// or when the user tunes malloc through MALLOC_MMAP_MAX_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES.
void retain_freed_host_memory();

// CPU: the counting allocator's numbers (available = false until it is installed).
// CUDA: c10::cuda::CUDACachingAllocator device stats (allocated bytes current/peak, reserved).
MemoryStats memory_stats(torch::Device device);

// Sets the peak to the current value (CPU) / resets the caching allocator's peaks (CUDA).
void reset_peak(torch::Device device);

// A rank's memory by kind, in bytes ("parameters", "gradients", "optimizer (Adam)", ...), as
// ModelFamily::memory_parts reports it for the run's ranks.json and report.
using MemoryParts = std::vector<std::pair<std::string, int64_t>>;

// Bytes held by the defined tensors of `tensors` (each counted once per tensor, views included).
int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors);

// "1.50 GiB", "12.0 MiB", "512 B": for logs and plans.
std::string format_bytes(int64_t bytes);

}  // namespace tessera
