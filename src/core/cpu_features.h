// Owns the detection of the host CPU's vector instruction sets, as the CPU kernels' run-time dispatch
// (kernels/cpu/isa/cpu_isa.h) needs them: what the processor implements (CPUID) and what the operating system
// saves and restores on a context switch (XGETBV of XCR0). A CPUID flag alone is never trusted: an instruction set
// whose register state the OS does not enable faults (#UD) like one the CPU lacks. AMX is not detected at all:
// the machines this project runs on advertise it and fault on it, and no kernel emits it.
#pragma once
#include <string>

namespace ssmserve {

/// The x86-64 feature levels the CPU kernels are compiled for (the psABI's microarchitecture levels).
struct CpuFeatures {
  /// x86-64-v3: AVX, AVX2, FMA, F16C, BMI1, BMI2, LZCNT, MOVBE, with the ymm state enabled by the OS (XCR0 bits
  /// 1 and 2).
  bool x86_64_v3 = false;
  /// x86-64-v4: x86-64-v3 plus AVX512F, AVX512BW, AVX512CD, AVX512DQ, AVX512VL, with the opmask and zmm states
  /// enabled by the OS (XCR0 bits 5, 6, 7).
  bool x86_64_v4 = false;
  std::string vendor;  ///< CPUID leaf 0's vendor string ("GenuineIntel", "AuthenticAMD"); empty off x86-64
};

/// The running CPU's features, detected on the first call (CPUID + XGETBV; all false off x86-64). Thread-safe.
const CpuFeatures& cpu_features();

}  // namespace ssmserve
