// Owns the CPU kernels' variant choice (see cpu_isa.h): the compiled list (variant_list.h), what the CPU runs
// (core/cpu_features.h) and SSMSERVE_CPU_ISA (core/env_options.h).
#include "kernels/cpu/isa/cpu_isa.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <string_view>

#include "core/cpu_features.h"
#include "core/env_options.h"
#include "core/error.h"
#include "kernels/cpu/isa/variant_list.h"

namespace ssmserve::cpu {
namespace detail {
std::atomic<int> g_cpu_isa_slot{-1};
}  // namespace detail

namespace {

#define SSM_CPU_ISA_ENTRY(isa, ns, unused) CpuIsa::isa,
constexpr CpuIsa kCompiled[] = {SSM_CPU_VARIANT_LIST(SSM_CPU_ISA_ENTRY, 0)};
#undef SSM_CPU_ISA_ENTRY

constexpr CpuIsa kAll[] = {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Native};

int slot_of(CpuIsa isa) {
  const auto* it = std::find(std::begin(kCompiled), std::end(kCompiled), isa);
  return it == std::end(kCompiled) ? -1 : static_cast<int>(it - std::begin(kCompiled));
}

bool cpu_runs(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx2: return cpu_features().x86_64_v3;
    case CpuIsa::Avx512: return cpu_features().x86_64_v4;
    default: return true;  // scalar: baseline; native: the binary was built for this machine
  }
}

std::string compiled_names() {
  std::string s;
  for (CpuIsa isa : kCompiled) s += (s.empty() ? "" : ", ") + std::string(cpu_isa_name(isa));
  return s;
}

/// The widest runnable compiled variant: native, else avx512, avx2, scalar.
CpuIsa widest_runnable() {
  for (CpuIsa isa : {CpuIsa::Native, CpuIsa::Avx512, CpuIsa::Avx2})
    if (cpu_isa_runnable(isa)) return isa;
  return CpuIsa::Scalar;
}

/// SSMSERVE_CPU_ISA's variant, or the widest runnable one when it is unset or "auto". Throws Error (cpu_isa.h).
CpuIsa requested() {
  const std::string& v = env_options().cpu_isa;
  if (v.empty() || v == "auto") return widest_runnable();
  const auto* it = std::find_if(std::begin(kAll), std::end(kAll), [&](CpuIsa i) { return v == cpu_isa_name(i); });
  SSM_CHECK(it != std::end(kAll), "SSMSERVE_CPU_ISA={}: not one of auto, scalar, avx2, avx512, native", v);
  SSM_CHECK(slot_of(*it) >= 0, "SSMSERVE_CPU_ISA={}: not compiled into this build, which has {} (SSMSERVE_NATIVE=ON "
            "builds native and scalar, OFF scalar, avx2 and avx512)", v, compiled_names());
  SSM_CHECK(cpu_runs(*it), "SSMSERVE_CPU_ISA={}: this CPU or its OS does not support {} (CPUID / XGETBV)", v,
            *it == CpuIsa::Avx512 ? "x86-64-v4 (AVX-512 F/BW/CD/DQ/VL with the zmm state enabled)"
                                  : "x86-64-v3 (AVX2, FMA, F16C, BMI2 with the ymm state enabled)");
  return *it;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Native: return "native";
  }
  return "?";
}

std::span<const CpuIsa> compiled_cpu_isas() { return kCompiled; }

bool cpu_isa_runnable(CpuIsa isa) { return slot_of(isa) >= 0 && cpu_runs(isa); }

namespace detail {

int choose_cpu_isa_slot() {
  static std::mutex m;
  std::lock_guard<std::mutex> lock(m);
  int s = g_cpu_isa_slot.load();
  if (s < 0) {
    s = slot_of(requested());
    g_cpu_isa_slot.store(s);
  }
  return s;
}

}  // namespace detail

CpuIsa cpu_isa() { return kCompiled[cpu_isa_slot()]; }

std::string cpu_isa_summary() {
  const CpuIsa isa = cpu_isa();
  const std::string& env = env_options().cpu_isa;
  const CpuFeatures& f = cpu_features();
  const char* level = f.x86_64_v4 ? "x86-64-v4" : f.x86_64_v3 ? "x86-64-v3" : "baseline x86-64";
  const std::string why = env.empty() || env == "auto" ? fmt::format("auto: {} CPU and OS", level)
                                                       : fmt::format("SSMSERVE_CPU_ISA={}; {} CPU and OS", env, level);
  return fmt::format("{} ({}; compiled: {})", cpu_isa_name(isa), why, compiled_names());
}

void set_cpu_isa(CpuIsa isa) {
  SSM_CHECK(cpu_isa_runnable(isa), "set_cpu_isa({}): {}", cpu_isa_name(isa),
            slot_of(isa) < 0 ? "not compiled into this build (" + compiled_names() + ")" : "this CPU or OS cannot run it");
  detail::g_cpu_isa_slot.store(slot_of(isa));
}

}  // namespace ssmserve::cpu
