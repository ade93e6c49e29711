// Owns the one-launch page copy of the device state mirror (DeviceStateMirror::copy_blocks): prefix caching copies a
// block's states in every layer (a hit's cached state into its running block, a boundary state into a cached block);
// one launch for all of them replaces one cudaMemcpyAsync per layer per copy (host time per snapshot, issue 28).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace ssmserve::cuda {

/// Up to kMaxPageCopies (src block, dst block) pairs, passed by value as a kernel parameter (no upload).
inline constexpr int kMaxPageCopies = 64;
struct PageCopyList {
  int n = 0;
  int src[kMaxPageCopies];
  int dst[kMaxPageCopies];
};

/// For every copy i and layer l: copies page_bytes bytes from layer_bases[l] + src[i] * page_bytes to
/// layer_bases[l] + dst[i] * page_bytes, on `stream`. layer_bases: a device array of num_layers device pointers, each
/// 16-byte aligned; page_bytes a multiple of 16; no copy's dst may be another's src or dst (the copies run in
/// parallel). Returns the launch's status.
cudaError_t copy_state_pages(const void* const* layer_bases, int num_layers, const PageCopyList& list, int64_t page_bytes,
                             cudaStream_t stream);

}  // namespace ssmserve::cuda
