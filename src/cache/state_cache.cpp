// Owns the recurrent state pool storage and the parsing of its dtype options (see state_cache.h).
#include "cache/state_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "core/error.h"
#include "core/huge_pages.h"

namespace ssmserve {
namespace {

constexpr int64_t kAlign = 64;  // bytes: one cache line
constexpr int64_t round_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

DType parse_dtype(std::string_view v, DType auto_dtype, std::string_view flag) {
  if (v == "auto") return auto_dtype;
  if (v == "float32") return DType::F32;
  if (v == "bfloat16") return DType::BF16;
  if (v == "float16") return DType::F16;
  fail("{} must be auto, float32, bfloat16 or float16 (got \"{}\")", flag, v);
}

}  // namespace

StateDtypes StateDtypes::from_options(std::string_view mamba_cache_dtype, std::string_view mamba_ssm_cache_dtype) {
  StateDtypes d;
  d.conv = parse_dtype(mamba_cache_dtype, kCpuActivationDType, "--mamba-cache-dtype");
  d.ssm = parse_dtype(mamba_ssm_cache_dtype, d.conv, "--mamba-ssm-cache-dtype");
  return d;
}

void StateCache::HugePageFree::operator()(std::byte* p) const { huge_page_free(p, bytes); }

StateCache::StateCache(int num_layers, StateShape shape, int num_blocks, StateDtypes dtypes)
    : shape_(shape), dtypes_(dtypes), num_blocks_(num_blocks) {
  SSM_CHECK(num_blocks >= 2, "StateCache: need at least 2 blocks (block 0 is the null block), got {}", num_blocks);
  SSM_CHECK(num_layers >= 0 && shape.conv_elems >= 0 && shape.ssm_elems >= 0,
            "StateCache: negative size (layers {}, conv {}, ssm {})", num_layers, shape.conv_elems, shape.ssm_elems);
  // Page: conv state, then the SSM state, each starting on a cache line; page size a whole number of lines,
  // so page_bytes divides by every dtype size and each view's block stride is a whole number of elements.
  ssm_offset_ = round_up(shape.conv_elems * static_cast<int64_t>(dtype_size(dtypes.conv)), kAlign);
  page_bytes_ = round_up(ssm_offset_ + shape.ssm_elems * static_cast<int64_t>(dtype_size(dtypes.ssm)), kAlign);
  page_bytes_ = std::max(page_bytes_, round_up(shape.min_page_bytes, kAlign));
  const auto bytes = static_cast<size_t>(page_bytes_ * num_blocks);
  for (int l = 0; l < num_layers; ++l) {
    // Huge pages: a decode step streams every layer's states (huge_pages.h); alignment is >= kAlign.
    auto* p = static_cast<std::byte*>(huge_page_alloc(bytes));
    std::memset(p, 0, bytes);
    buffers_.emplace_back(p, HugePageFree{bytes});
  }
}

StateView StateCache::conv_state(int layer) const {
  if (parent_) {
    StateView v = parent_->conv_state(layer);
    v.data = static_cast<std::byte*>(v.data) + conv_shard_bytes_;
    return v;
  }
  SSM_CHECK(layer >= 0 && layer < num_layers(), "StateCache: layer {} out of range [0, {})", layer, num_layers());
  return {buffers_[layer].get(), dtypes_.conv, page_bytes_ / static_cast<int64_t>(dtype_size(dtypes_.conv))};
}

StateView StateCache::ssm_state(int layer) const {
  if (parent_) {
    StateView v = parent_->ssm_state(layer);
    v.data = static_cast<std::byte*>(v.data) + ssm_shard_bytes_;
    return v;
  }
  SSM_CHECK(layer >= 0 && layer < num_layers(), "StateCache: layer {} out of range [0, {})", layer, num_layers());
  return {buffers_[layer].get() + ssm_offset_, dtypes_.ssm, page_bytes_ / static_cast<int64_t>(dtype_size(dtypes_.ssm))};
}

void StateCache::zero_block(int block) {
  SSM_CHECK(block >= 0 && block < num_blocks_, "StateCache: block {} out of range [0, {})", block, num_blocks_);
  if (parent_) {
    for (int l = 0; l < num_layers(); ++l) {
      std::memset(conv_state(l).block<std::byte>(0) + block * page_bytes_, 0, shape_.conv_elems * dtype_size(dtypes_.conv));
      std::memset(ssm_state(l).block<std::byte>(0) + block * page_bytes_, 0, shape_.ssm_elems * dtype_size(dtypes_.ssm));
    }
    return;
  }
  for (auto& buf : buffers_) std::memset(buf.get() + block * page_bytes_, 0, static_cast<size_t>(page_bytes_));
}

void StateCache::copy_block(int src, int dst) {
  SSM_CHECK(src > 0 && src < num_blocks_ && dst > 0 && dst < num_blocks_, "StateCache: copying block {} to {}: outside [1, {})",
            src, dst, num_blocks_);
  if (src == dst) return;
  if (parent_) {
    for (int l = 0; l < num_layers(); ++l) {
      std::byte* c = conv_state(l).block<std::byte>(0);
      std::byte* s = ssm_state(l).block<std::byte>(0);
      std::memcpy(c + dst * page_bytes_, c + src * page_bytes_, shape_.conv_elems * dtype_size(dtypes_.conv));
      std::memcpy(s + dst * page_bytes_, s + src * page_bytes_, shape_.ssm_elems * dtype_size(dtypes_.ssm));
    }
    return;
  }
  for (auto& buf : buffers_)
    std::memcpy(buf.get() + dst * page_bytes_, buf.get() + src * page_bytes_, static_cast<size_t>(page_bytes_));
}

}  // namespace ssmserve

namespace ssmserve {

StateCache StateCache::shard(StateShape shard, int64_t conv_offset, int64_t ssm_offset) const {
  SSM_CHECK(conv_offset >= 0 && shard.conv_elems >= 0 && conv_offset + shard.conv_elems <= shape_.conv_elems && ssm_offset >= 0 &&
                shard.ssm_elems >= 0 && ssm_offset + shard.ssm_elems <= shape_.ssm_elems,
            "StateCache::shard: conv [{}, +{}) / ssm [{}, +{}) outside the page's conv {} / ssm {} elements", conv_offset,
            shard.conv_elems, ssm_offset, shard.ssm_elems, shape_.conv_elems, shape_.ssm_elems);
  StateCache v;
  v.shape_ = shard;
  v.dtypes_ = dtypes_;
  v.num_blocks_ = num_blocks_;
  v.page_bytes_ = page_bytes_;
  v.parent_ = parent_ ? parent_ : this;
  v.conv_shard_bytes_ = conv_shard_bytes_ + conv_offset * static_cast<int64_t>(dtype_size(dtypes_.conv));
  v.ssm_shard_bytes_ = ssm_shard_bytes_ + ssm_offset * static_cast<int64_t>(dtype_size(dtypes_.ssm));
  return v;
}

}  // namespace ssmserve
