// Owns the Weight type: a 2-D (or 1-D) parameter tensor the math reads, either a view into a memory-mapped
// checkpoint or storage owned by the model (dummy weights, converted dtypes). Reading one from a checkpoint tensor:
// model/weight.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/huge_pages.h"

namespace ssmserve {

/// A parameter matrix `[rows, cols]` (outermost first, row-major) in F32 or BF16. F16 checkpoint tensors are
/// converted to F32 at load. `data` points into a mapped file or into `owned`.
struct Weight {
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  std::shared_ptr<HugeByteBuffer> owned;  ///< set when the model owns the bytes (on huge pages)
  /// The same matrix repacked for the CPU GEMM's broadcast kernel (cpu::pack_for_linear, layout private to
  /// kernels/cpu/linear.cpp), or null: then cpu::linear reads `data` row-major.
  std::shared_ptr<const HugeByteBuffer> cpu_panels;
  /// cpu::linear rounds every input element to bf16 (round to nearest even) before the product, as the GPU's bf16
  /// GEMMs read their activations: a CPU reference for bf16-weight GPU runs (ModelConfig::round_gemm_inputs_bf16).
  /// Off by default (the CPU keeps fp32 activations).
  bool round_input_bf16 = false;

  /// Owned weight of the given dtype, zero-filled.
  static Weight allocate(DType dtype, int64_t rows, int64_t cols);

  const float* f32() const { return static_cast<const float*>(data); }
  const uint16_t* bf16() const { return static_cast<const uint16_t*>(data); }
  /// Element (r, c) as float.
  float at(int64_t r, int64_t c) const {
    const int64_t i = r * cols + c;
    return dtype == DType::F32 ? f32()[i] : bf16_to_f32(bf16()[i]);
  }
  /// Row r converted to float into dst[0..cols).
  void row_to_f32(int64_t r, float* dst) const { to_f32(dtype, static_cast<const std::byte*>(data) + r * cols * dtype_size(dtype), dst, cols); }
};

}  // namespace ssmserve
