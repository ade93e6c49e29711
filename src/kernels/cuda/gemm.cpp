// Owns the cuBLASLt GEMM (see gemm.h).
#include "kernels/cuda/gemm.h"

#include <algorithm>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/skinny_gemm.h"

namespace ssmserve::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    case DType::F32: break;
  }
  return CUDA_R_32F;
}

/// Owns the descriptors of one call (destroyed on every path).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

GemmHandle::GemmHandle() : workspace_(kWorkspaceBytes) { SSM_CUDA_CHECK(cublasLtCreate(&handle_)); }

GemmHandle::~GemmHandle() {
  if (handle_) cublasLtDestroy(handle_);
}

void GemmHandle::run(const GemmArgs& g, cudaStream_t stream, void* y2, int64_t y2_stride, const SkinnyExtras* extras) {
  SSM_CHECK(!y2 || (g.y_dtype == DType::F32 && y2_stride >= g.N), "gemm: y2 needs an F32 y and y2_stride >= N");
  SSM_CHECK(!extras || takes_skinny(g.ab_dtype, g.M), "gemm: skinny extras on a GEMM that is not routed to the skinny kernel");
  if (takes_skinny(g.ab_dtype, g.M)) {
    SSM_CHECK(g.M >= 0 && g.N >= 1 && g.K >= 1 && g.x_stride >= g.K && g.w_stride >= g.K && g.y_stride >= g.N,
              "gemm: bad sizes M={} N={} K={} or strides", g.M, g.N, g.K);
    ++skinny_calls_;
    size_t counter_bytes = 0;
    const size_t ws_bytes = skinny_gemm_workspace(g.M, g.N, g.K, &counter_bytes, extras ? extras->tuning : nullptr);
    if (ws_bytes > skinny_ws_.bytes()) {
      retired_.push_back(std::move(skinny_ws_));
      skinny_ws_ = DeviceBuffer(ws_bytes);
    }
    if (counter_bytes > skinny_counters_.bytes()) {
      retired_.push_back(std::move(skinny_counters_));
      skinny_counters_ = DeviceBuffer(counter_bytes);
      skinny_counters_.fill_bytes(0);
    }
    SSM_CUDA_CHECK(skinny_gemm(g, y2, y2_stride, pdl_, stream, skinny_ws_.data(), skinny_ws_.bytes(),
                               skinny_counters_.as<unsigned>(), extras ? *extras : SkinnyExtras{}));
    return;
  }
  if (!batch_invariant_ && !force_fallback_ && skinny_gemm_f32_serves(g)) {
    ++f32_gemv_calls_;
    SSM_CUDA_CHECK(skinny_gemm_f32(g, pdl_, stream));
  } else {
    run_cublaslt(g, stream);
  }
  if (y2 && g.M > 0)
    SSM_CUDA_CHECK(cast_rows(static_cast<const float*>(g.y), g.y_stride, g.M, g.N, y2, DType::BF16, y2_stride, stream));
}

void GemmHandle::run_cublaslt(const GemmArgs& g, cudaStream_t stream) {
  SSM_CHECK(g.M >= 0 && g.N >= 1 && g.K >= 1, "gemm: bad sizes M={} N={} K={}", g.M, g.N, g.K);
  SSM_CHECK(g.x_stride >= g.K && g.w_stride >= g.K && g.y_stride >= g.N,
            "gemm: strides x={} w={} y={} below K={} / N={}", g.x_stride, g.w_stride, g.y_stride, g.K, g.N);
  SSM_CHECK(g.ab_dtype == DType::BF16 || g.ab_dtype == DType::F32, "gemm: operand dtype {} unsupported",
            dtype_name(g.ab_dtype));
  SSM_CHECK(g.y_dtype == DType::BF16 || g.y_dtype == DType::F32, "gemm: output dtype {} unsupported",
            dtype_name(g.y_dtype));
  if (g.M == 0) return;
  const auto aligned = [](const void* p, int64_t stride, DType t) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (stride * static_cast<int64_t>(dtype_size(t))) % 16 == 0;
  };
  // Batch-invariant mode: cuBLASLt picks its fp32 algorithm (tiles, split-K) by M, so fp32 GEMMs (an fp32 model,
  // the MoE router) take the plain kernel, whose every output is one FMA chain over k whatever M is.
  const bool lt_ok = !force_fallback_ && !(batch_invariant_ && g.ab_dtype == DType::F32) && aligned(g.x, g.x_stride, g.ab_dtype) && aligned(g.w, g.w_stride, g.ab_dtype) &&
                     aligned(g.y, g.y_stride, g.y_dtype);
  if (!lt_ok) {
    ++fallback_calls_;
    SSM_CUDA_CHECK(gemm_fallback(g, stream));
    return;
  }
  // Column-major view: row-major W [N, K] is col-major [K, N] (ld w_stride), x [M, K] is [K, M], y [M, N] is
  // [N, M]. So y^T = W x^T: A = W with op T, B = x with op N.
  Descs d;
  const cudaDataType_t ab = cuda_type(g.ab_dtype), yt = cuda_type(g.y_dtype);
  SSM_CUDA_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  SSM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)));
  SSM_CUDA_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)));
  SSM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.a, ab, static_cast<uint64_t>(g.K), static_cast<uint64_t>(g.N), g.w_stride));
  SSM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.b, ab, static_cast<uint64_t>(g.K), static_cast<uint64_t>(g.M), g.x_stride));
  SSM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.c, yt, static_cast<uint64_t>(g.N), static_cast<uint64_t>(g.M), g.y_stride));
  SSM_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const size_t ws = workspace_.bytes();
  SSM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // cuBLASLt assumes 256-byte aligned operands unless told otherwise: pass the pointers' real alignment.
  const auto align_of = [](const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return static_cast<uint32_t>(a == 0 ? 256 : std::min<uintptr_t>(256, a & (~a + 1)));
  };
  const uint32_t al_a = align_of(g.w), al_b = align_of(g.x), al_c = align_of(g.y);
  SSM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  SSM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  SSM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  SSM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  const Key key{g.M, g.N, g.K, g.x_stride, g.w_stride, g.y_stride, static_cast<int>(g.ab_dtype),
                static_cast<int>(g.y_dtype), al_a | (al_b << 9) | (al_c << 18)};
  auto it = algos_.find(key);
  if (it == algos_.end()) {
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &heur, &found);
    Algo a;
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) a = {true, heur.algo};
    else if (st != CUBLAS_STATUS_NOT_SUPPORTED) SSM_CUDA_CHECK(st);
    it = algos_.emplace(key, a).first;
  }
  if (!it->second.ok) {
    ++fallback_calls_;
    SSM_CUDA_CHECK(gemm_fallback(g, stream));
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  SSM_CUDA_CHECK(cublasLtMatmul(handle_, d.op, &alpha, g.w, d.a, g.x, d.b, &beta, g.y, d.c, g.y, d.c,
                                &it->second.algo, workspace_.data(), ws, stream));
}

}  // namespace ssmserve::cuda
