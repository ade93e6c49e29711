// Tests the huge-page allocator of large host buffers (core/huge_pages.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "core/huge_pages.h"

namespace ssmserve {
namespace {

TEST(HugePages, LargeBlocksAreTwoMiBAligned) {
  for (std::size_t bytes : {std::size_t{2} << 20, (std::size_t{5} << 20) + 123}) {
    void* p = huge_page_alloc(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (std::size_t{2} << 20), 0u) << bytes;
    std::memset(p, 0x5a, bytes);  // every byte is writable
    huge_page_free(p, bytes);
  }
}

TEST(HugePages, SmallBlocksAreCacheLineAligned) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, (std::size_t{2} << 20) - 1}) {
    void* p = huge_page_alloc(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << bytes;
    huge_page_free(p, bytes);
  }
  huge_page_free(nullptr, 0);  // ignored
}

TEST(HugePages, ByteBufferIsZeroFilledAndCopies) {
  HugeByteBuffer a(static_cast<std::size_t>(3) << 20);
  for (std::byte b : a) ASSERT_EQ(b, std::byte{0});
  a[12345] = std::byte{7};
  HugeByteBuffer b = a;
  EXPECT_EQ(b[12345], std::byte{7});
  b.resize(10);
  EXPECT_EQ(b.size(), 10u);
}

}  // namespace
}  // namespace ssmserve
