// Owns the prefill pieces of "all"-mode state stores (see prefill_segments.h).
#include "model/mixers/prefill_segments.h"

#include <cstring>

#include "core/error.h"

namespace ssmserve {

std::vector<PrefillSegment> split_prefill_rows(const MambaBatchMetadata& md) {
  std::vector<PrefillSegment> out;
  const bool stores = md.has_state_stores();
  for (int p = 0; p < md.num_prefills; ++p) {
    const int32_t begin = md.query_start_loc_p[p], end = md.query_start_loc_p[p + 1];
    const int32_t c = md.num_computed_tokens_p[p], block = md.state_indices_tensor_p[p];
    int32_t at = begin;
    if (stores)
      for (int32_t k = md.state_store_start_p[p]; k < md.state_store_start_p[p + 1]; ++k) {
        const int32_t to = begin + md.state_store_offset_p[k];
        SSM_CHECK(to > at && to < end, "state store at offset {} outside prefill row {} ({} tokens)", md.state_store_offset_p[k], p,
                  end - begin);
        out.push_back({p, at, to, c + (at - begin), block, md.state_store_block_p[k]});
        at = to;
      }
    out.push_back({p, at, end, c + (at - begin), block, 0});
  }
  return out;
}

void segment_metadata(const PrefillSegment& seg, const MambaBatchMetadata& md, MambaBatchMetadata& out) {
  const ScheduledSeq s{seg.state_block, seg.num_computed, seg.end - seg.begin, true};
  MetadataOptions opt;
  opt.chunk_size = md.chunk_size > 0 ? md.chunk_size : 256;
  build_mamba_metadata(std::span(&s, 1), opt, out);
}

void copy_state_block(const StateView& view, int64_t elems, int32_t src, int32_t dst) {
  if (elems <= 0 || src == dst) return;
  const size_t es = dtype_size(view.dtype);
  auto* base = static_cast<char*>(view.data);
  std::memcpy(base + static_cast<size_t>(dst) * view.block_stride * es, base + static_cast<size_t>(src) * view.block_stride * es,
              static_cast<size_t>(elems) * es);
}

void convert_state_block(const StateView& src, int32_t src_block, const StateView& dst, int32_t dst_block, int64_t elems) {
  visit_state_dtype(src.dtype, [&](auto st) {
    const auto* from = src.block<decltype(st)>(src_block);
    visit_state_dtype(dst.dtype, [&](auto dt) {
      auto* to = dst.block<decltype(dt)>(dst_block);
      for (int64_t i = 0; i < elems; ++i) store_f32(to[i], load_f32(from[i]));
    });
  });
}

}  // namespace ssmserve
