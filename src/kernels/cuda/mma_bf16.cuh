// Owns the warp-level bf16 tensor-core primitives of the FlashAttention-style kernels (lightning attention's bf16
// path, the paged attention prefill): mma.sync m16n8k16 (bf16 x bf16 -> fp32), ldmatrix (plain and transposed)
// fragment loads from shared memory, and cp.async 16-byte copies with zero fill. Fragment layouts (PTX ISA,
// "Matrix fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A 16 x 16 (row major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16 x 8:              b0 = (2t..2t+1, g), b1 = (2t+8..2t+9, g)
//   C 16 x 8 (fp32):       c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// so two adjacent C tiles of a 16 x 16 product, rounded to bf16 pairs, are an A fragment (the P V trick).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ssmserve::cuda::detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// d += a b (m16n8k16, bf16 operands, fp32 accumulation).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Four 8 x 8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8; r[i] = matrix i's fragment.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
/// As ldsm_x4, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

/// A fragment of the 16 x 16 tile at (m0, k0) of a row-major bf16 matrix in shared memory (row stride ld).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const __nv_bfloat16* s, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31;
  ldsm_x4(a, s + (m0 + (l & 15)) * ld + k0 + (l >> 4) * 8);
}
/// A fragment of A = S^T at (m0, k0), S stored [k][m] row-major (stride ld).
__device__ __forceinline__ void load_a_t(uint32_t (&a)[4], const __nv_bfloat16* s, int ld, int m0, int k0) {
  const int l = threadIdx.x & 31, i = l >> 3, r = l & 7;
  ldsm_x4_t(a, s + (k0 + r + (i >> 1) * 8) * ld + m0 + (i & 1) * 8);
}
/// B fragments of two n8 tiles (n0 and n0 + 8) at k0 of B = S^T, S stored [n][k] row-major (e.g. keys for Q K^T):
/// b[0], b[1] for tile n0; b[2], b[3] for tile n0 + 8.
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const __nv_bfloat16* s, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, i = l >> 3, r = l & 7;
  ldsm_x4(b, s + (n0 + r + (i >> 1) * 8) * ld + k0 + (i & 1) * 8);
}
/// B fragments of two n8 tiles (n0, n0 + 8) at k0 of B stored [k][n] row-major (e.g. values for P V).
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const __nv_bfloat16* s, int ld, int k0, int n0) {
  const int l = threadIdx.x & 31, i = l >> 3, r = l & 7;
  ldsm_x4_t(b, s + (k0 + r + (i & 1) * 8) * ld + n0 + (i >> 1) * 8);
}

/// Two floats as a bf16 pair (lo in the low half).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

/// 16-byte global -> shared copy; bytes past src_bytes (0 or 16) are zero-filled.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit_group() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait_group() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

}  // namespace ssmserve::cuda::detail
