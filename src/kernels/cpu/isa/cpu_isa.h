// Owns the choice of the instruction-set variant every CPU kernel call runs (run-time dispatch; the variants
// themselves: kernels/cpu/isa/variant.h). A portable build (SSMSERVE_NATIVE=OFF) carries scalar, avx2 (x86-64-v3)
// and avx512 (x86-64-v4) kernels and takes the widest the CPU and the OS support (core/cpu_features.h: CPUID +
// XGETBV); a native build (-march=native) carries native (the default) and scalar. The choice is made once (at a
// CPU model's load, which logs it, or else at the first kernel call) and is the same for every call of the process,
// so results stay deterministic and batch-invariant on one machine. SSMSERVE_CPU_ISA=scalar|avx2|avx512|native forces one (docs/environment.md).
//
// What agrees across variants: the GEMMs (linear, small_gemm) compute every output element with the same fp32
// operations in the same order in every variant, so they are bit-identical; the other kernels are compiled from
// one source per variant and differ within rounding (the compiler fuses a * b + c into FMAs and splits vector
// reductions by the register width it has). tests/unit/test_cpu_isa.cpp checks both.
#pragma once
#include <atomic>
#include <span>
#include <string>

namespace ssmserve::cpu {

/// An instruction-set variant of the CPU kernels.
enum class CpuIsa : int {
  Scalar,  ///< the hand-written kernels' portable loops; the rest as the build's flags compile it (x86-64: SSE2)
  Avx2,    ///< x86-64-v3 (AVX2, FMA, F16C, BMI2): portable builds
  Avx512,  ///< x86-64-v4 (AVX-512 F, BW, CD, DQ, VL; no AMX): portable builds
  Native,  ///< the build machine's instruction set (-march=native): SSMSERVE_NATIVE=ON builds
};

/// "scalar", "avx2", "avx512" or "native" (SSMSERVE_CPU_ISA's spellings).
const char* cpu_isa_name(CpuIsa isa);

/// The variants compiled into this build, in dispatch-table order (portable: scalar, avx2, avx512; native:
/// native, scalar).
std::span<const CpuIsa> compiled_cpu_isas();

/// True when `isa` is compiled into this build and the running CPU and OS can execute it (native: always).
bool cpu_isa_runnable(CpuIsa isa);

/// The variant every CPU kernel call runs. The first call chooses it: SSMSERVE_CPU_ISA when set (and not "auto"),
/// else the widest runnable one (native in a native build). Thread-safe.
/// Errors: Error when SSMSERVE_CPU_ISA is not one of auto / scalar / avx2 / avx512 / native, names a variant this
/// build lacks, or one this CPU / OS cannot run (the next call tries again).
CpuIsa cpu_isa();

/// One line for the log: the active variant and why, e.g. "avx512 (auto: x86-64-v4 CPU and OS; compiled: scalar,
/// avx2, avx512)". Errors as cpu_isa().
std::string cpu_isa_summary();

/// Makes every later CPU kernel call run `isa` (tests and benchmarks that compare variants in one process). Must
/// not be called while kernels run. Errors: Error when !cpu_isa_runnable(isa).
void set_cpu_isa(CpuIsa isa);

namespace detail {
extern std::atomic<int> g_cpu_isa_slot;  ///< index into compiled_cpu_isas() of the active variant; -1 until chosen
int choose_cpu_isa_slot();               ///< cpu_isa()'s first-call choice; returns the slot
}  // namespace detail

/// The active variant's index into compiled_cpu_isas(): what SSM_CPU_DISPATCH's tables are indexed by. Errors as
/// cpu_isa() on the first call.
inline int cpu_isa_slot() {
  const int s = detail::g_cpu_isa_slot.load(std::memory_order_relaxed);
  return s >= 0 ? s : detail::choose_cpu_isa_slot();
}

}  // namespace ssmserve::cpu
