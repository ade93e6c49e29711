// Owns the allocation of large host buffers (weights, packed GEMM panels, recurrent-state and KV pools) on
// transparent huge pages.
//
// Why: CPU decode streams every weight byte once per token. With 4 KiB pages, a 260 MB stream touches 66k pages
// and, inside a VM (two-dimensional page walks), the TLB misses cost a third of the read bandwidth; on 2 MiB pages
// the same loop reads 33-48% faster on the 2-vCPU machines this project is developed on (measured 6.6 vs 8.8-9.8
// GB/s on a loaded host, docs/benchmarks.md). Linux only grants them to memory that asks (madvise(MADV_HUGEPAGE))
// when /sys/kernel/mm/transparent_hugepage/enabled is "madvise", the common distribution default.
#pragma once
#include <cstddef>
#include <new>
#include <vector>

namespace ssmserve {

/// Allocates `bytes` bytes aligned to 64 bytes; from 2 MiB on, aligned to 2 MiB and advised as huge-page
/// memory (madvise MADV_HUGEPAGE; a refusal is ignored: the memory is then ordinary pages). The memory is not
/// initialized. SSMSERVE_HUGE_PAGES=0 in the environment turns the advice off (A/B measurements).
/// Throws std::bad_alloc when out of memory. Free with huge_page_free(p, bytes).
void* huge_page_alloc(std::size_t bytes);

/// Frees memory from huge_page_alloc(bytes) (the same byte count). Null is ignored.
void huge_page_free(void* p, std::size_t bytes) noexcept;

/// A standard allocator over huge_page_alloc, for std::vector storage of large buffers.
template <typename T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: converting allocators are implicit
  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    return static_cast<T*>(huge_page_alloc(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { huge_page_free(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
};

/// Byte storage on huge pages (zero-filled on construction with a size, like std::vector<std::byte>).
using HugeByteBuffer = std::vector<std::byte, HugePageAllocator<std::byte>>;

}  // namespace ssmserve
