// Memory accounting: the counting CPU allocator (installed with c10::SetCPUAllocator, delegating to
// the original) and a reader of the CUDA caching allocator's statistics.
#include "framework/memory.h"

#include <c10/core/CPUAllocator.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <unordered_map>

#ifdef TESSERA_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace tessera {
namespace {

// Installed with the highest priority so that nobody replaces it afterwards: the blocks it handed
// out must always be freed through it.
constexpr uint8_t kCountingAllocatorPriority = std::numeric_limits<uint8_t>::max();
// Shards of the block table; spreads lock contention of intra-op threads that allocate at once.
constexpr size_t kTableShards = 64;

// Counts bytes and delegates to the original CPU allocator.
//
// Why a table instead of a per-block context: c10::Allocator::raw_allocate() (non-virtual; used
// e.g. by oneDNN's engine allocator) requires DataPtr::get() == get_context(), and
// raw_deallocate() later calls raw_deleter()(data) with the data pointer alone. So every DataPtr
// we return has context == data and our deleter, and the original block's (context, deleter) and
// size are looked up by data pointer. A pointer that is not in the table was allocated by the
// original allocator before installation and reached us through raw_deallocate(): it goes to the
// original raw deleter, uncounted. DataPtrs allocated before installation carry the original
// deleter and never reach us at all. Either way the counts only see what we added.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* original) : original_(original) {}

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = original_->allocate(n);
    void* data = inner.get();
    if (data == nullptr) return inner;  // n == 0: nothing to count, original deleter is fine
    const c10::Device device = inner.device();
    Block block{n, inner.get_deleter(), nullptr};
    block.context = inner.release_context();
    {
      Shard& shard = shard_of(data);
      std::lock_guard<std::mutex> lock(shard.mutex);
      shard.blocks.emplace(data, block);
    }
    add(static_cast<int64_t>(n));
    return c10::DataPtr(data, data, &CountingCpuAllocator::free_block, device);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CountingCpuAllocator::free_block; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t current() const { return current_.load(std::memory_order_relaxed); }
  int64_t peak() const { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() { peak_.store(current(), std::memory_order_relaxed); }

  static CountingCpuAllocator* instance;

 private:
  struct Block {
    size_t bytes;
    c10::DeleterFnPtr deleter;  // the original allocator's deleter of this block
    void* context;              // and its context
  };
  struct Shard {
    std::mutex mutex;
    std::unordered_map<void*, Block> blocks;
  };

  Shard& shard_of(void* data) {
    // Blocks are at least 64-byte aligned: drop the low bits before hashing.
    size_t h = std::hash<uintptr_t>()(reinterpret_cast<uintptr_t>(data) >> 6);
    return shards_[(h ^ (h >> 7)) % kTableShards];
  }

  void add(int64_t n) {
    int64_t now = current_.fetch_add(n, std::memory_order_relaxed) + n;
    int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }

  static void free_block(void* data) {
    CountingCpuAllocator* self = instance;
    Block block{0, nullptr, nullptr};
    bool ours = false;
    {
      Shard& shard = self->shard_of(data);
      std::lock_guard<std::mutex> lock(shard.mutex);
      auto it = shard.blocks.find(data);
      if (it != shard.blocks.end()) {
        block = it->second;
        shard.blocks.erase(it);
        ours = true;
      }
    }
    if (ours) {
      self->current_.fetch_sub(static_cast<int64_t>(block.bytes), std::memory_order_relaxed);
      if (block.deleter) block.deleter(block.context);
      return;
    }
    // raw_allocate()d by the original before installation, raw_deallocate()d now.
    if (c10::DeleterFnPtr original_raw = self->original_->raw_deleter()) original_raw(data);
  }

  c10::Allocator* original_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::array<Shard, kTableShards> shards_;
};

CountingCpuAllocator* CountingCpuAllocator::instance = nullptr;
std::once_flag g_install_once;

#ifdef TESSERA_WITH_CUDA
// The caching allocator's index of a CUDA device, after CUDA's lazy initialization: the allocator
// sizes its per-device state there (on the first CUDA tensor), and reading or resetting its
// statistics before that indexes an empty table.
c10::DeviceIndex cuda_allocator_index(torch::Device device) {
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  if (index < 0 || index >= c10::cuda::device_count())
    throw std::invalid_argument("memory statistics: no CUDA device " + std::to_string(index) +
                                " (this process sees " + std::to_string(c10::cuda::device_count()) +
                                ")");
  return index;
}
#endif

}  // namespace

void retain_freed_host_memory() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_",
                           "GLIBC_TUNABLES"})
    if (std::getenv(name) != nullptr) return;
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

void install_counting_cpu_allocator() {
  std::call_once(g_install_once, [] {
    c10::Allocator* original = c10::GetCPUAllocator();
    // Leaked on purpose: blocks it handed out may be freed during static destruction.
    auto* counting = new CountingCpuAllocator(original);
    CountingCpuAllocator::instance = counting;
    c10::SetCPUAllocator(counting, kCountingAllocatorPriority);
    if (c10::GetCPUAllocator() != counting)
      throw std::runtime_error("install_counting_cpu_allocator: c10 kept another CPU allocator");
  });
}

bool counting_cpu_allocator_installed() { return CountingCpuAllocator::instance != nullptr; }

MemoryStats memory_stats(torch::Device device) {
  MemoryStats stats;
  if (device.is_cpu()) {
    if (CountingCpuAllocator* counting = CountingCpuAllocator::instance) {
      stats.available = true;
      stats.current_bytes = counting->current();
      stats.peak_bytes = counting->peak();
      stats.reserved_bytes = stats.current_bytes;
    }
    return stats;
  }
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda() && torch::cuda::is_available()) {
    const auto all = c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_allocator_index(device));
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    stats.available = true;
    stats.current_bytes = all.allocated_bytes[aggregate].current;
    stats.peak_bytes = all.allocated_bytes[aggregate].peak;
    stats.reserved_bytes = all.reserved_bytes[aggregate].current;
  }
#endif
  return stats;
}

void reset_peak(torch::Device device) {
  if (device.is_cpu()) {
    if (CountingCpuAllocator* counting = CountingCpuAllocator::instance) counting->reset_peak();
    return;
  }
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda() && torch::cuda::is_available())
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_allocator_index(device));
#endif
}

std::string format_bytes(int64_t bytes) {
  const char* sign = bytes < 0 ? "-" : "";
  const double b = static_cast<double>(bytes < 0 ? -bytes : bytes);
  char text[64];
  if (b >= 1024.0 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%s%.2f GiB", sign, b / (1024.0 * 1024 * 1024));
  else if (b >= 1024.0 * 1024)
    std::snprintf(text, sizeof text, "%s%.1f MiB", sign, b / (1024.0 * 1024));
  else if (b >= 1024.0)
    std::snprintf(text, sizeof text, "%s%.1f KiB", sign, b / 1024.0);
  else
    std::snprintf(text, sizeof text, "%s%.0f B", sign, b);
  return text;
}

int64_t tensor_bytes(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors)
    if (t.defined()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace tessera
