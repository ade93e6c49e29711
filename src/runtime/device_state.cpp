// Owns the device mirror of the state pool (see device_state.h).
#include "runtime/device_state.h"

#include <algorithm>

#include "core/error.h"
#include "device/cuda_check.h"
#include "runtime/device_state_copy.h"

namespace ssmserve::cuda {
namespace {

constexpr int64_t kAlign = 64;  // bytes, as the host pages
int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

}  // namespace

int64_t DeviceStateMirror::compact_page_bytes(const StateShape& shape, const StateDtypes& dtypes) {
  return round_up(shape.conv_elems * static_cast<int64_t>(dtype_size(dtypes.conv)), kAlign) +
         round_up(shape.ssm_elems * static_cast<int64_t>(dtype_size(dtypes.ssm)), kAlign);
}

void DeviceStateMirror::sync_layout(const StateCache& cache) {
  const StateShape& shape = cache.shape();
  if (cache_ == &cache && num_blocks_ == cache.num_blocks() && page_bytes_ == cache.page_bytes() &&
      shape_.conv_elems == shape.conv_elems && shape_.ssm_elems == shape.ssm_elems &&
      static_cast<int>(buffers_.size()) == cache.num_layers())
    return;
  buffers_.clear();
  conv_.clear();
  ssm_.clear();
  cache_ = nullptr;
  if (cache.num_layers() == 0) return;
  const StateDtypes dtypes{cache.conv_state(0).dtype, cache.ssm_state(0).dtype};
  const bool compact = cache.is_shard();
  const int64_t page = compact ? compact_page_bytes(shape, dtypes) : cache.page_bytes();
  for (int l = 0; l < cache.num_layers(); ++l) {
    DeviceBuffer b(static_cast<size_t>(page) * cache.num_blocks());
    b.fill_bytes(0);
    const StateView hc = cache.conv_state(l), hs = cache.ssm_state(l);
    // Whole cache: the SSM state sits at the same byte offset as on the host. Shard: right after the conv shard.
    const int64_t ssm_offset = compact ? round_up(shape.conv_elems * static_cast<int64_t>(dtype_size(hc.dtype)), kAlign)
                                       : static_cast<const std::byte*>(hs.data) - static_cast<const std::byte*>(hc.data);
    conv_.push_back({b.data(), hc.dtype, page / static_cast<int64_t>(dtype_size(hc.dtype))});
    ssm_.push_back({static_cast<std::byte*>(b.data()) + ssm_offset, hs.dtype, page / static_cast<int64_t>(dtype_size(hs.dtype))});
    buffers_.push_back(std::move(b));
  }
  std::vector<const void*> bases;
  for (const DeviceBuffer& b : buffers_) bases.push_back(b.data());
  layer_bases_ = DeviceBuffer(bases.size() * sizeof(void*));
  layer_bases_.upload(bases.data(), bases.size() * sizeof(void*));
  cache_ = &cache;
  num_blocks_ = cache.num_blocks();
  page_bytes_ = cache.page_bytes();
  device_page_bytes_ = page;
  shape_ = shape;
}

void DeviceStateMirror::copy_blocks(std::span<const BlockCopy> copies, cudaStream_t stream) const {
  // One launch per group of copies (every layer at once); a copy touching a block an earlier copy of the group
  // writes, or writing one it reads, starts a new group, so the copies keep their order.
  PageCopyList list;
  std::vector<int> written, read;
  auto flush = [&] {
    SSM_CUDA_CHECK(copy_state_pages(static_cast<const void* const*>(layer_bases_.data()), static_cast<int>(buffers_.size()),
                                    list, device_page_bytes_, stream));
    list.n = 0;
    written.clear();
    read.clear();
  };
  auto has = [](const std::vector<int>& v, int b) { return std::find(v.begin(), v.end(), b) != v.end(); };
  for (const BlockCopy& c : copies) {
    SSM_CHECK(c.src > 0 && c.src < num_blocks_ && c.dst > 0 && c.dst < num_blocks_,
              "device states: copying block {} to {}: outside [1, {})", c.src, c.dst, num_blocks_);
    if (c.src == c.dst) continue;
    if (list.n == kMaxPageCopies || has(written, c.src) || has(written, c.dst) || has(read, c.dst)) flush();
    list.src[list.n] = c.src, list.dst[list.n] = c.dst, ++list.n;
    written.push_back(c.dst);
    read.push_back(c.src);
  }
  if (list.n > 0) flush();
}

void DeviceStateMirror::allocate_host_tier(int num_slots) {
  SSM_CHECK(cache_ != nullptr, "device states: the host tier needs the layout first (sync_layout)");
  free_host_tier();
  if (num_slots <= 0) return;
  const size_t bytes = static_cast<size_t>(num_slots) * buffers_.size() * static_cast<size_t>(device_page_bytes_);
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    fail("--swap-space: cannot allocate {:.2f} GiB of pinned host memory for {} cached blocks", bytes / 1073741824.0, num_slots);
  }
  host_ = static_cast<std::byte*>(p);
  host_slots_ = num_slots;
  SSM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  SSM_CUDA_CHECK(cudaEventCreateWithFlags(&before_, cudaEventDisableTiming));
  SSM_CUDA_CHECK(cudaEventCreateWithFlags(&after_, cudaEventDisableTiming));
}

void DeviceStateMirror::free_host_tier() {
  if (side_) cudaStreamSynchronize(side_);
  if (host_) cudaFreeHost(host_);
  if (before_) cudaEventDestroy(before_);
  if (after_) cudaEventDestroy(after_);
  if (side_) cudaStreamDestroy(side_);
  host_ = nullptr, side_ = nullptr, before_ = nullptr, after_ = nullptr;
  host_slots_ = 0;
}

DeviceStateMirror::~DeviceStateMirror() { free_host_tier(); }

void DeviceStateMirror::swap_out(std::span<const BlockCopy> copies, cudaStream_t stream) const {
  const size_t page = static_cast<size_t>(device_page_bytes_), L = buffers_.size();
  for (const BlockCopy& c : copies) {
    SSM_CHECK(c.src > 0 && c.src < num_blocks_ && c.dst >= 0 && c.dst < host_slots_,
              "device states: swapping block {} out to host slot {}: outside [1, {}) / [0, {})", c.src, c.dst, num_blocks_, host_slots_);
    for (size_t l = 0; l < L; ++l)
      SSM_CUDA_CHECK(cudaMemcpyAsync(host_ + (static_cast<size_t>(c.dst) * L + l) * page,
                                     static_cast<const std::byte*>(buffers_[l].data()) + static_cast<size_t>(c.src) * page, page,
                                     cudaMemcpyDeviceToHost, stream));
  }
}

void DeviceStateMirror::swap_in(std::span<const BlockCopy> copies, cudaStream_t stream) const {
  if (copies.empty()) return;
  const size_t page = static_cast<size_t>(device_page_bytes_), L = buffers_.size();
  SSM_CUDA_CHECK(cudaEventRecord(before_, stream));
  SSM_CUDA_CHECK(cudaStreamWaitEvent(side_, before_, 0));
  for (const BlockCopy& c : copies) {
    SSM_CHECK(c.src >= 0 && c.src < host_slots_ && c.dst > 0 && c.dst < num_blocks_,
              "device states: swapping host slot {} in to block {}: outside [0, {}) / [1, {})", c.src, c.dst, host_slots_, num_blocks_);
    for (size_t l = 0; l < L; ++l)
      SSM_CUDA_CHECK(cudaMemcpyAsync(static_cast<std::byte*>(buffers_[l].data()) + static_cast<size_t>(c.dst) * page,
                                     host_ + (static_cast<size_t>(c.src) * L + l) * page, page, cudaMemcpyHostToDevice, side_));
  }
  SSM_CUDA_CHECK(cudaEventRecord(after_, side_));
  SSM_CUDA_CHECK(cudaStreamWaitEvent(stream, after_, 0));
}

}  // namespace ssmserve::cuda
