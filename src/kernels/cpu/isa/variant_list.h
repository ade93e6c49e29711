// Owns the list of the CPU kernels' instruction-set variants compiled into this build, in dispatch-table order
// (the first one defines the dispatching public functions; CMakeLists.txt's SSM_CPU_VARIANTS must match):
//   SSMSERVE_NATIVE=ON  (SSM_CPU_NATIVE_BUILD): native (-march=native, the default), scalar;
//   SSMSERVE_NATIVE=OFF:                        scalar (baseline x86-64), avx2 (x86-64-v3), avx512 (x86-64-v4).
// Included by kernels/cpu/isa/variant.h and cpu_isa.cpp only (both compiled with the build's definitions).
#pragma once

/// SSM_CPU_VARIANT_LIST(X, args...) expands X(CpuIsa enumerator, namespace, args...) once per compiled variant.
#if defined(SSM_CPU_NATIVE_BUILD)
#define SSM_CPU_VARIANT_LIST(X, ...) X(Native, isa_native, __VA_ARGS__) X(Scalar, isa_scalar, __VA_ARGS__)
#else
#define SSM_CPU_VARIANT_LIST(X, ...) \
  X(Scalar, isa_scalar, __VA_ARGS__) X(Avx2, isa_avx2, __VA_ARGS__) X(Avx512, isa_avx512, __VA_ARGS__)
#endif
