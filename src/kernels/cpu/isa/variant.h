// Owns the opening of a CPU kernel translation unit's instruction-set variant and the dispatch of its public
// functions (run-time ISA dispatch, as llama.cpp's GGML_CPU_ALL_VARIANTS; kernels/cpu/isa/cpu_isa.h chooses).
//
// Every src/kernels/cpu/*.cpp is compiled once per variant of the build (variant_list.h; CMakeLists.txt's
// ssm_cpu_<variant> object libraries define SSM_CPU_VARIANT_<NAME>), each time into its own namespace
// ssmserve::cpu::<SSM_CPU_VARIANT> (isa_scalar, isa_avx2, isa_avx512, isa_native). The vector variants of a
// portable build get their instruction set from the `#pragma GCC target` below, not from -m flags: everything
// included before this header (the standard library, fmt, our inline helpers) is then compiled for the baseline in
// every object, so the linker, keeping one of the identical weak copies of an inline function or template, can
// never hand baseline code an AVX-512 body. Only what follows (the kernels, in the variant namespace; OpenMP
// regions and lambdas inherit the target) uses the wider instructions. Hence: include this header LAST.
//
// A kernel file then reads:
//   #include ...                                  (everything the file needs)
//   #include "kernels/cpu/isa/variant.h"           (last)
//   namespace ssmserve::cpu::SSM_CPU_VARIANT { ... the kernels; public ones with their header's signatures ... }
//   SSM_CPU_DISPATCH(void, rms_norm, (const float* x, ...), (x, ...))   (one line per public function)
//
// Hand-written vector code selects itself with SSM_CPU_AVX512 / SSM_CPU_AVX2 (1 or 0), never with __AVX512F__
// directly: g++ leaves those macros as the command line set them after the pragma, and the scalar variant of a
// native build has the native flags but must take the portable loops. No variant enables AMX (the machines this
// project runs on advertise it and fault on it).
#pragma once
#include "kernels/cpu/isa/cpu_isa.h"
#include "kernels/cpu/isa/variant_list.h"

#if defined(SSM_CPU_VARIANT_AVX512)
#pragma GCC target("avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt,avx512f,avx512cd,avx512bw,avx512dq,avx512vl")
#define SSM_CPU_VARIANT isa_avx512
#elif defined(SSM_CPU_VARIANT_AVX2)
#pragma GCC target("avx,avx2,fma,f16c,bmi,bmi2,lzcnt,movbe,popcnt")
#define SSM_CPU_VARIANT isa_avx2
#elif defined(SSM_CPU_VARIANT_SCALAR)
#define SSM_CPU_VARIANT isa_scalar
#elif defined(SSM_CPU_VARIANT_NATIVE)
#define SSM_CPU_VARIANT isa_native
#else
#error "kernels/cpu/*.cpp are compiled through the ssm_cpu_<variant> targets (SSM_CPU_VARIANT_<NAME> undefined)"
#endif

// (g++ does not define __AVX512F__ & co. after a `#pragma GCC target`, as gcc does for C: these follow the variant.)
/// 1 where the hand-written AVX-512 kernels are compiled (the avx512 variant; native on an AVX-512 machine).
#if defined(SSM_CPU_VARIANT_AVX512) || (defined(SSM_CPU_VARIANT_NATIVE) && defined(__AVX512F__))
#define SSM_CPU_AVX512 1
#else
#define SSM_CPU_AVX512 0
#endif
/// 1 where the hand-written AVX2 + FMA kernels are compiled (the avx2 variant; native on an AVX2-only machine).
#if defined(SSM_CPU_VARIANT_AVX2) || \
    (defined(SSM_CPU_VARIANT_NATIVE) && !SSM_CPU_AVX512 && defined(__AVX2__) && defined(__FMA__))
#define SSM_CPU_AVX2 1
#else
#define SSM_CPU_AVX2 0
#endif

#define SSM_CPU_DECLARE_IN_VARIANT(isa, ns, ret, name, params) \
  namespace ns {                                               \
  ret name params;                                             \
  }
#define SSM_CPU_ADDRESS_IN_VARIANT(isa, ns, ret, name, params) &ns::name,

/// SSM_CPU_DISPATCH(ret, name, (parameters), (arguments)): defines ssmserve::cpu::name, the public function its
/// header declares, as a call of the active variant's ssmserve::cpu::<variant>::name through a table of the
/// compiled variants (cpu_isa_slot(): chosen once, at the first kernel call). Written after the variant namespace
/// is closed; expands to nothing except in the build's first variant (SSM_CPU_PRIMARY), which defines it once.
/// The parameters are the header's without default arguments.
#if defined(SSM_CPU_PRIMARY)
#define SSM_CPU_DISPATCH(ret, name, params, args)                                                                 \
  namespace ssmserve::cpu {                                                                                       \
  SSM_CPU_VARIANT_LIST(SSM_CPU_DECLARE_IN_VARIANT, ret, name, params)                                             \
  ret name params {                                                                                               \
    static ret(*const kVariants[]) params = {SSM_CPU_VARIANT_LIST(SSM_CPU_ADDRESS_IN_VARIANT, ret, name, params)}; \
    return kVariants[cpu_isa_slot()] args;                                                                        \
  }                                                                                                               \
  }
#else
#define SSM_CPU_DISPATCH(ret, name, params, args)
#endif
