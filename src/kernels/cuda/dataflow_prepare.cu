// Owns the dataflow decode kernel's weight preparation (see dataflow_decode.h): x_proj transposed once per layer, so
// that a block's channels are contiguous rows its producer can stream with one bulk copy.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dataflow_decode.h"

namespace ssmserve::cuda {
namespace {
using namespace detail;

/// out [cols, rows] = inᵀ (in [rows, cols] bf16), 32 x 32 tiles through shared memory (padded against bank conflicts).
__global__ void transpose_kernel(const __nv_bfloat16* __restrict__ in, int64_t rows, int64_t cols,
                                 __nv_bfloat16* __restrict__ out) {
  __shared__ __nv_bfloat16 tile[32][33];
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * 32, c0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

cudaError_t mamba1_dataflow_transpose_x_proj(const void* x_proj, int64_t XD, int64_t I, void* x_proj_t,
                                             cudaStream_t stream) {
  if (!x_proj || !x_proj_t || XD < 1 || I < 1) return cudaErrorInvalidValue;
  const dim3 grid(ceil_div(I, 32), ceil_div(XD, 32)), block(32, 8);
  transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const __nv_bfloat16*>(x_proj), XD, I,
                                               static_cast<__nv_bfloat16*>(x_proj_t));
  return launch_status();
}

}  // namespace ssmserve::cuda
