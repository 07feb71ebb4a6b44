// Memory accounting per device: a process-wide counting CPU allocator, and the CUDA caching
// allocator's statistics, behind one API used by tests, benchmarks and the progress line.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

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

// CPU: the counting allocator's numbers (available = false until it is installed).
// CUDA: c10::cuda::CUDACachingAllocator device stats (allocated bytes current/peak, reserved).
MemoryStats memory_stats(torch::Device device);

// Sets the peak to the current value (CPU) / resets the caching allocator's peaks (CUDA).
void reset_peak(torch::Device device);

// "1.50 GiB", "12.0 MiB", "512 B": for logs and plans.
std::string format_bytes(int64_t bytes);

}  // namespace tessera
