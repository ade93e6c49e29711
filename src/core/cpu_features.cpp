// Owns the CPUID / XGETBV probe (see cpu_features.h). Bit positions: Intel SDM vol. 2A, CPUID ("Feature
// Information", "Structured Extended Feature Flags") and vol. 1 §13.3 (XCR0 state components); the level
// definitions: the x86-64 psABI, "Micro-architecture levels".
#include "core/cpu_features.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace ssmserve {
namespace {

#if defined(__x86_64__) || defined(__i386__)

bool bit(uint32_t reg, int b) { return (reg >> b) & 1u; }

/// XCR0, the state components the OS enables (XSAVE-managed). Only valid when CPUID.1:ECX.OSXSAVE is set: the
/// instruction itself faults otherwise. Inline assembly, so this file needs no -mxsave.
uint64_t read_xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return f;
  const uint32_t max_leaf = a;
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4), std::memcpy(vendor + 4, &d, 4), std::memcpy(vendor + 8, &c, 4);
  f.vendor = vendor;
  if (max_leaf < 7) return f;

  __get_cpuid(1, &a, &b, &c, &d);
  const uint32_t ecx1 = c;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const uint32_t ebx7 = b;
  const bool lzcnt = __get_cpuid(0x80000001u, &a, &b, &c, &d) && bit(c, 5);

  // 1. The OS must enable the register state before any of it can be used (XCR0 via XGETBV, itself only
  //    available when the OS has set CR4.OSXSAVE).
  const uint64_t xcr0 = bit(ecx1, 27) ? read_xcr0() : 0;
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE (bit 1) + AVX upper halves (bit 2)
  const bool os_zmm = (xcr0 & 0xE6) == 0xE6;  // + opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7)

  // 2. x86-64-v3: AVX (ECX1 28), FMA (12), F16C (29), MOVBE (22); AVX2 (EBX7 5), BMI1 (3), BMI2 (8); LZCNT.
  f.x86_64_v3 = os_ymm && bit(ecx1, 28) && bit(ecx1, 12) && bit(ecx1, 29) && bit(ecx1, 22) && bit(ebx7, 5) &&
                bit(ebx7, 3) && bit(ebx7, 8) && lzcnt;
  // 3. x86-64-v4: AVX512F (EBX7 16), DQ (17), CD (28), BW (30), VL (31).
  f.x86_64_v4 = f.x86_64_v3 && os_zmm && bit(ebx7, 16) && bit(ebx7, 17) && bit(ebx7, 28) && bit(ebx7, 30) &&
                bit(ebx7, 31);
  return f;
}

#else

CpuFeatures detect() { return {}; }

#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace ssmserve
