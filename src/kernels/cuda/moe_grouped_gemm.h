// Owns the grouped expert GEMMs of the GPU sparse MoE (moe.h): after the router and the device-side sort by expert,
// the (token, slot) pairs sit in expert order, so each expert's rows are a contiguous slice [offsets[e],
// offsets[e + 1]) of the sorted row space. One launch per projection covers all experts: a CTA takes a 128-row tile
// of one expert's slice (found from the device offsets, so nothing goes to the host and the launch can be captured
// in a CUDA graph) and one column tile, and runs a 4-stage cp.async pipeline into mma.sync m16n8k16 (bf16 operands,
// fp32 accumulation; mma_bf16.cuh), or on Hopper a TMA ring into wgmma (moe_grouped_gemm_wg.cu). Every output
// element is one fixed-order k loop, whatever the number of rows per expert, so a token's result does not depend on
// the rest of the batch. The scheme is the one of vLLM's fused_moe
// Triton kernel (sorted token ids, expert-aligned row blocks), written for our layout.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ssmserve::cuda::detail {

/// Which kernel a grouped GEMM runs on. kAuto: kWgmma when KernelTuning::moe_grouped_wg is not 0 and
/// moe_grouped_wg_supported says it can (and the mma.sync kernel where the call itself does not suit it), else
/// kMmaSync. kMmaSync: the mma.sync kernel (moe_grouped_gemm.cu, any CUDA device). kWgmma: the Hopper kernel
/// (moe_grouped_gemm_wg.cu; tile widths by KernelTuning::moe_grouped_wg), or cudaErrorNotSupported where it cannot run.
/// The two differ in rounding only (another fp32 summation order); each is batch-invariant: every output element is
/// one fixed-order k loop over its own row and the weights, whatever the other rows.
enum class MoeGemmPath { kAuto, kMmaSync, kWgmma };

/// True when the current device can run the Hopper grouped GEMMs (compute capability 9.0, the driver's tensor-map
/// encoder present).
bool moe_grouped_wg_supported();

/// The Hopper kernel's default weight tile: 256 wide from this depth K, 128 below (KernelTuning::moe_grouped_wg 1).
inline constexpr int64_t kWideTileMinK = 1024;

/// Rows of a grouped-GEMM tile: a launch needs ceil(P / kMoeTileRows) + E row tiles (each expert's last tile is
/// partial).
inline constexpr int kMoeTileRows = 128;

/// xg[r, :] = bf16(x[sorted[r] / top_k, :]) for r in [0, P = T * top_k): the up projection's A operand in expert
/// order. x: [T, hidden] fp32 (row stride xs, multiple of 4); sorted: [P] pair ids; pair_row: [P] its inverse
/// (pair -> row); xg: [P, hidden] bf16 contiguous. Under KernelTuning::prefill_row_kernels one block per token reads
/// x[t] once and writes its top_k rows xg[pair_row[t * top_k + j]] (the old form, one block per row r, reads each x
/// row top_k times in expert order); the same bits.
cudaError_t moe_gather_rows(const float* x, int64_t xs, const int32_t* sorted, const int32_t* pair_row, int64_t T,
                            int top_k, int64_t hidden, __nv_bfloat16* xg, cudaStream_t stream);

/// Gate and up projections fused with the activation, for all experts in one launch:
/// act[r, n] = bf16(silu(xg[r] . w1[e, n]) * (xg[r] . w3[e, n])) for the rows r of expert e.
/// xg: [P, hidden] bf16; offsets: [E + 1] device (expert e owns rows [offsets[e], offsets[e + 1])); w1, w3:
/// [E, I, hidden] bf16; act: [P, I] bf16. hidden and I multiples of 8.
cudaError_t moe_grouped_up(const __nv_bfloat16* xg, const int32_t* offsets, int64_t P, int E,
                           const __nv_bfloat16* w1, const __nv_bfloat16* w3, int64_t I, int64_t hidden,
                           __nv_bfloat16* act, cudaStream_t stream, MoeGemmPath path = MoeGemmPath::kAuto);

/// Down projection for all experts in one launch: y[r, :] = act[r] . w2[e]^T for the rows r of expert e.
/// act: [P, I] bf16; offsets as above; w2: [E, hidden, I] bf16; y: [P, hidden] fp32.
cudaError_t moe_grouped_down(const __nv_bfloat16* act, const int32_t* offsets, int64_t P, int E,
                             const __nv_bfloat16* w2, int64_t hidden, int64_t I, float* y, cudaStream_t stream,
                             MoeGemmPath path = MoeGemmPath::kAuto);

/// The Hopper kernels behind kWgmma (moe_grouped_gemm_wg.cu), same arguments and contracts as moe_grouped_up /
/// moe_grouped_down (N, K the output width and depth); cudaErrorNotSupported where they cannot run (not sm_90, no
/// tensor-map encoder, operands not 16-byte aligned).
cudaError_t moe_grouped_up_wg(const __nv_bfloat16* xg, const int32_t* offsets, int64_t P, int E,
                              const __nv_bfloat16* w1, const __nv_bfloat16* w3, int64_t I, int64_t hidden,
                              __nv_bfloat16* act, cudaStream_t stream);
cudaError_t moe_grouped_down_wg(const __nv_bfloat16* A, const int32_t* offsets, int64_t P, int E,
                                const __nv_bfloat16* w, int64_t N, int64_t K, float* y, cudaStream_t stream);

}  // namespace ssmserve::cuda::detail
