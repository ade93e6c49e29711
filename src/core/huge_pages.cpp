// Owns huge-page allocation of large host buffers (see huge_pages.h for why and the measurements).
#include "core/huge_pages.h"

#include "core/env_options.h"

#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ssmserve {
namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;  // x86-64 transparent huge page
constexpr std::size_t kLineAlign = 64;

bool advice_enabled() {
  return env_options().huge_pages;
}

std::size_t alignment_for(std::size_t bytes) { return bytes >= kHugePage ? kHugePage : kLineAlign; }

}  // namespace

void* huge_page_alloc(std::size_t bytes) {
  const std::size_t align = alignment_for(bytes);
  void* p = ::operator new(bytes == 0 ? 1 : bytes, std::align_val_t{align});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (align == kHugePage && advice_enabled()) {
    // Only whole huge pages inside the block can be backed by one; advise the aligned prefix.
    const std::size_t advised = bytes / kHugePage * kHugePage;
    (void)madvise(p, advised, MADV_HUGEPAGE);
  }
#endif
  return p;
}

void huge_page_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  ::operator delete(p, std::align_val_t{alignment_for(bytes)});
}

}  // namespace ssmserve
