// Owns the batched page copy of the device state mirror (see device_state_copy.h): every (copy, layer) page in one
// kernel launch instead of one cudaMemcpyAsync per layer per copy (prefix caching's snapshots, issue 28).
#include "runtime/device_state_copy.h"

namespace ssmserve::cuda {
namespace {

/// blockIdx.x: the copy, blockIdx.y: the layer; the block's threads copy the page in 16-byte words.
__global__ void copy_pages_kernel(const uint4* const* __restrict__ layers, PageCopyList list, int64_t page_words) {
  const int c = blockIdx.x;
  const uint4* base = layers[blockIdx.y];
  const uint4* src = base + static_cast<int64_t>(list.src[c]) * page_words;
  uint4* dst = const_cast<uint4*>(base) + static_cast<int64_t>(list.dst[c]) * page_words;
  for (int64_t i = threadIdx.x; i < page_words; i += blockDim.x) dst[i] = src[i];
}

}  // namespace

cudaError_t copy_state_pages(const void* const* layer_bases, int num_layers, const PageCopyList& list, int64_t page_bytes,
                             cudaStream_t stream) {
  if (list.n <= 0 || num_layers <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(list.n), static_cast<unsigned>(num_layers));
  copy_pages_kernel<<<grid, 256, 0, stream>>>(reinterpret_cast<const uint4* const*>(layer_bases), list, page_bytes / 16);
  return cudaGetLastError();
}

}  // namespace ssmserve::cuda
