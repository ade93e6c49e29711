// Owns the placement of a decoder's per-request state in the one block pool, computed from what each module declares
// (ModuleStateSpec) and shared by the CPU decoder and the GPU runner, so block ids address the same bytes on both:
//  - models of recurrent layers only, all with the same state sizes (Mamba-1, Mamba-2): one pool layer per recurrent
//    layer, the page holding that layer's conv window and SSM state (StateCache's layout);
//  - otherwise (hybrids): one pool layer whose page holds every recurrent layer's conv window (in the conv part) and
//    state (in the SSM part) at offsets in layer order, and a KV block of the softmax layers is a whole page (TP 1) or
//    a rank's part of the SSM region (TP > 1; TensorParallelLM places the ranks' regions side by side). The KV block
//    size makes a KV page about a state page, computed for the unsharded model so every rank cuts the same blocks
//    (vLLM's page-size unification, vllm-ssm-design.md §3.5).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "cache/state_cache.h"
#include "model/decoder/module.h"

namespace ssmserve {

class StateLayout {
 public:
  StateLayout() = default;
  /// specs: [modules] every module's declaration in layer order (stateless ones included); tp_world: the
  /// tensor-parallel size (the shard rule above).
  StateLayout(std::span<const ModuleStateSpec> specs, int tp_world);

  int num_state_layers() const { return num_state_layers_; }
  const StateShape& shape() const { return shape_; }
  /// Tokens per KV block (0: no softmax layers).
  int kv_block_size() const { return kv_block_size_; }
  /// Bytes of this rank's K and V of one KV block across all softmax layers.
  int64_t kv_page_bytes() const { return static_cast<int64_t>(kv_block_size_) * kv_token_bytes_; }
  bool has_attention() const { return kv_token_bytes_ > 0; }

  /// Module `i`'s views, given the pool's (or its device mirror's) views of pool layer l: conv(l), ssm(l). The KV
  /// view gets base, page_bytes (the SSM view's block stride in bytes), block_size and this layer's offset; its
  /// module fills num_kv_heads / head_dim. Stateless modules get empty views.
  template <class ConvFn, class SsmFn>
  ModuleState views(size_t i, int num_blocks, ConvFn conv, SsmFn ssm) const {
    ModuleState st;
    st.num_blocks = num_blocks;
    const Placement& p = placements_.at(i);
    if (p.kind == Placement::None) return st;
    if (p.kind == Placement::Kv) {
      const StateView c = conv(0), s = ssm(0);
      st.kv.base = static_cast<std::byte*>(tp_world_ == 1 ? c.data : s.data);
      st.kv.page_bytes = s.block_stride * static_cast<int64_t>(dtype_size(s.dtype));
      st.kv.block_size = kv_block_size_;
      st.kv.layer_offset_bytes = p.kv_offset_bytes;
      return st;
    }
    st.conv = shifted(conv(p.pool_layer), p.conv_offset);
    st.ssm = shifted(ssm(p.pool_layer), p.ssm_offset);
    return st;
  }

 private:
  struct Placement {
    enum Kind { None, Recurrent, Kv } kind = None;
    int pool_layer = 0;
    int64_t conv_offset = 0, ssm_offset = 0;  // elements into the page's conv / SSM part
    int64_t kv_offset_bytes = 0;              // this softmax layer's K within a KV block
  };
  static StateView shifted(StateView v, int64_t elems) {
    v.data = static_cast<std::byte*>(v.data) + elems * static_cast<int64_t>(dtype_size(v.dtype));
    return v;
  }
  std::vector<Placement> placements_;
  int tp_world_ = 1;
  int num_state_layers_ = 0;
  StateShape shape_;
  int kv_block_size_ = 0;
  int64_t kv_token_bytes_ = 0;
};

}  // namespace ssmserve
