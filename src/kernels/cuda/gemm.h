// Owns the dense matrix product of the CUDA backend through cuBLASLt: y[M, N] = x[M, K] W[N, K]^T with fp32
// accumulation (the GPU counterpart of kernels/cpu/linear.h). Operands bf16 x bf16 (tensor cores) or fp32 x fp32
// (exact fp32, no TF32: tests and small models); output fp32 or bf16. Row-major, row strides in elements.
// Operands whose rows are not 16-byte aligned (cuBLASLt finds no algorithm for them) go through a plain tiled
// kernel (gemm_fallback.cu) instead.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"

namespace ssmserve::cuda {

struct SkinnyExtras;  // skinny_gemm.h

/// One GEMM's operands (device pointers, row-major).
struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;  ///< [M, K], row stride x_stride >= K
  int64_t x_stride = 0;
  const void* w = nullptr;  ///< [N, K], row stride w_stride >= K (a Linear weight as stored)
  int64_t w_stride = 0;
  DType ab_dtype = DType::BF16;  ///< dtype of x and w: BF16 or F32
  void* y = nullptr;             ///< [M, N], row stride y_stride >= N; must not alias x or w
  int64_t y_stride = 0;
  DType y_dtype = DType::F32;    ///< F32 or BF16
};

/// The plain tiled GEMM (any strides; slow): what GemmHandle::run falls back to. Returns the launch status
/// (cudaErrorInvalidValue for bad sizes).
cudaError_t gemm_fallback(const GemmArgs& a, cudaStream_t stream);

/// Largest M skinny_gemm_f32 serves.
constexpr int64_t kSkinnyF32MaxM = 8;

/// Whether skinny_gemm_f32 serves these operands: x, w and y fp32, 1 <= M <= kSkinnyF32MaxM, K a multiple of 4, x and
/// w rows 16-byte aligned (pointers and strides).
bool skinny_gemm_f32_serves(const GemmArgs& a);

/// Enqueues y [M, N] fp32 = x [M, K] W [N, K]^T, fp32 operands, for few rows (a decode step's MoE router): one warp
/// per output column, each lane an FMA chain over its float4 chunks of K, then a warp sum; the order depends on K only,
/// so each row's result is the same for every M (not the bits of cuBLASLt or gemm_fallback). PDL when `pdl`
/// (pdl.cuh): W is read before the wait (KernelTuning::f32_gemv_preload), so no kernel of the step may write it (a
/// weight). Returns cudaErrorInvalidValue when !skinny_gemm_f32_serves(a), else the launch status.
cudaError_t skinny_gemm_f32(const GemmArgs& a, bool pdl, cudaStream_t stream);

/// A cuBLASLt handle with its workspace (32 MiB). Create one per device; not thread-safe.
class GemmHandle {
 public:
  GemmHandle();
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;

  /// Enqueues y = x W^T on `stream`. Throws Error on bad sizes / dtypes or when cuBLASLt has no algorithm or fails.
  /// y2: optional bf16 copy of y ([M, N], row stride y2_stride; y must be F32 when it is given). BF16 GEMMs with
  /// M <= skinny_max_m (every M in batch-invariant mode) go through skinny_gemm (skinny_gemm.h: one fixed
  /// reduction order per (N, K), so the result of a row does not depend on the batch); the rest through cuBLASLt.
  /// extras (skinny_gemm.h: fused conv epilogue, tuning) are only for calls routed to the skinny kernel
  /// (takes_skinny); Error otherwise.
  /// F32 GEMMs of at most kSkinnyF32MaxM rows that skinny_gemm_f32 serves go to it, outside batch-invariant mode
  /// (there every F32 GEMM stays on gemm_fallback).
  void run(const GemmArgs& a, cudaStream_t stream, void* y2 = nullptr, int64_t y2_stride = 0,
           const SkinnyExtras* extras = nullptr);
  /// True when run() sends a GEMM of this operand dtype and M rows to the skinny kernel.
  bool takes_skinny(DType ab_dtype, int64_t M) const {
    return ab_dtype == DType::BF16 && !force_fallback_ && (batch_invariant_ || M <= skinny_max_m_);
  }
  /// Routing knobs (see run): decode GEMMs up to this M on the skinny kernel (default 16; 0 = never).
  void set_skinny_max_m(int64_t m) { skinny_max_m_ = m; }
  /// Every BF16 GEMM on the skinny kernel and every F32 GEMM on gemm_fallback (vLLM's VLLM_BATCH_INVARIANT):
  /// batch-invariant for any batch mix.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  /// Launch the skinny kernel with Programmatic Dependent Launch (pdl.cuh; default on).
  void set_pdl(bool on) { pdl_ = on; }
  bool pdl() const { return pdl_; }
  /// Calls served by the skinny kernel so far.
  int64_t skinny_calls() const { return skinny_calls_; }
  /// Sends every call through gemm_fallback (tests).
  void set_force_fallback(bool on) { force_fallback_ = on; }
  /// Calls served by gemm_fallback so far.
  int64_t fallback_calls() const { return fallback_calls_; }
  /// Calls served by skinny_gemm_f32 so far.
  int64_t f32_gemv_calls() const { return f32_gemv_calls_; }

 private:
  /// (M, N, K, x_stride, w_stride, y_stride, ab, y, pointer alignment) -> the heuristic's algorithm, or none
  /// (use the fallback).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, uint32_t>;
  struct Algo {
    bool ok = false;
    cublasLtMatmulAlgo_t algo{};
  };
  void run_cublaslt(const GemmArgs& a, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<Key, Algo> algos_;
  bool force_fallback_ = false;
  int64_t fallback_calls_ = 0, f32_gemv_calls_ = 0;
  int64_t skinny_max_m_ = 16, skinny_calls_ = 0;
  // skinny_gemm's cross-block workspace and arrival counters (zeroed once); grow-only, and replaced buffers are
  // kept alive because captured CUDA graphs may still point at them.
  DeviceBuffer skinny_ws_, skinny_counters_;
  std::vector<DeviceBuffer> retired_;
  bool batch_invariant_ = false, pdl_ = true;
};

}  // namespace ssmserve::cuda
