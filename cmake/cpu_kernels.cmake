# The CPU kernels (src/kernels/cpu/*.cpp) compiled once per instruction-set variant into ssm_model, each variant in a
# namespace of its own; the process runs one, chosen at its first kernel call (src/kernels/cpu/isa/cpu_isa.h):
#   SSMSERVE_NATIVE=ON:  native (-march=native: the default, what the build was before run-time dispatch) and scalar
#                        (the hand-written kernels' portable loops, same flags: the reference tests compare against);
#   SSMSERVE_NATIVE=OFF: scalar (baseline x86-64), avx2 (x86-64-v3) and avx512 (x86-64-v4), the widest one the CPU
#                        and the OS support taken at run time, so a portable binary runs at native speed.
# The vector variants get their instruction set from a `#pragma GCC target` after each file's includes
# (src/kernels/cpu/isa/variant.h says why not from -m flags). The list's order is the dispatch tables' and must match
# src/kernels/cpu/isa/variant_list.h; the first variant defines the dispatching public functions.
if(NOT SSMSERVE_NATIVE AND NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  message(FATAL_ERROR "SSMSERVE_NATIVE=OFF builds the CPU kernels' avx2 / avx512 variants with `#pragma GCC target`, "
                      "which needs GCC (found ${CMAKE_CXX_COMPILER_ID})")
endif()
if(SSMSERVE_NATIVE)
  set(SSM_CPU_VARIANTS native scalar)
  target_compile_definitions(ssm_model PRIVATE SSM_CPU_NATIVE_BUILD=1)
else()
  set(SSM_CPU_VARIANTS scalar avx2 avx512)
endif()
file(GLOB SSM_CPU_KERNEL_SRCS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/kernels/cpu/*.cpp)
list(GET SSM_CPU_VARIANTS 0 ssm_cpu_primary)
foreach(variant IN LISTS SSM_CPU_VARIANTS)
  string(TOUPPER ${variant} VARIANT)
  add_library(ssm_cpu_${variant} OBJECT ${SSM_CPU_KERNEL_SRCS})
  target_link_libraries(ssm_cpu_${variant} PRIVATE ssm_core OpenMP::OpenMP_CXX)  # their include dirs and flags
  target_include_directories(ssm_cpu_${variant} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/include
                             ${CBLAS_INCLUDE_DIR})
  target_compile_definitions(ssm_cpu_${variant} PRIVATE SSM_CPU_VARIANT_${VARIANT}=1
                             $<$<BOOL:${SSMSERVE_NATIVE}>:SSM_CPU_NATIVE_BUILD=1>
                             $<$<STREQUAL:${variant},${ssm_cpu_primary}>:SSM_CPU_PRIMARY=1>)
  if(variant STREQUAL "avx2")
    # The kernels' clamps (exp_ps: x < lo ? lo : ...) are comparisons that may trap: GCC if-converts them inside a
    # vectorized loop only with AVX-512's masks, so with AVX2 the selective scan stayed scalar (4.7x slower). FP
    # exceptions are never unmasked here, and the flag changes no value (no reassociation, no contraction).
    target_compile_options(ssm_cpu_${variant} PRIVATE -fno-trapping-math)
  endif()
  if(variant STREQUAL "avx512" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    # GCC 12 reports the AVX-512 intrinsics' own _mm512_undefined_* placeholders as uninitialized once inlined under
    # a target pragma (GCC PR 105593); the scalar and avx2 variants compile the shared code with these warnings on.
    target_compile_options(ssm_cpu_${variant} PRIVATE -Wno-uninitialized -Wno-maybe-uninitialized)
  endif()
  target_sources(ssm_model PRIVATE $<TARGET_OBJECTS:ssm_cpu_${variant}>)
endforeach()
