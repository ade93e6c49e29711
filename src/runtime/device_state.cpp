// Owns the device mirror of the state pool (see device_state.h).
#include "runtime/device_state.h"

namespace ssmserve::cuda {

void DeviceStateMirror::sync_layout(const StateCache& cache) {
  if (cache_ == &cache && num_blocks_ == cache.num_blocks() && page_bytes_ == cache.page_bytes() &&
      static_cast<int>(buffers_.size()) == cache.num_layers())
    return;
  buffers_.clear();
  conv_.clear();
  ssm_.clear();
  for (int l = 0; l < cache.num_layers(); ++l) {
    DeviceBuffer b(static_cast<size_t>(cache.page_bytes()) * cache.num_blocks());
    b.fill_bytes(0);
    const StateView hc = cache.conv_state(l), hs = cache.ssm_state(l);
    // The conv window starts the page; the SSM state sits at the same byte offset as on the host.
    const auto ssm_offset = static_cast<const std::byte*>(hs.data) - static_cast<const std::byte*>(hc.data);
    conv_.push_back({b.data(), hc.dtype, hc.block_stride});
    ssm_.push_back({static_cast<std::byte*>(b.data()) + ssm_offset, hs.dtype, hs.block_stride});
    buffers_.push_back(std::move(b));
  }
  cache_ = &cache;
  num_blocks_ = cache.num_blocks();
  page_bytes_ = cache.page_bytes();
}

}  // namespace ssmserve::cuda
