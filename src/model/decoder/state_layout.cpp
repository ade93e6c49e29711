// Owns the placement of module states in the block pool (see state_layout.h).
#include "model/decoder/state_layout.h"

#include <algorithm>

namespace ssmserve {

StateLayout::StateLayout(std::span<const ModuleStateSpec> specs, int tp_world) : tp_world_(tp_world) {
  std::vector<const ModuleStateSpec*> rec;
  bool any_kv = false;
  for (const ModuleStateSpec& s : specs) {
    if (s.recurrent()) rec.push_back(&s);
    any_kv |= s.attention();
  }
  const bool uniform = !rec.empty() && !any_kv && std::all_of(rec.begin(), rec.end(), [&](const ModuleStateSpec* s) {
    return s->conv_elems == rec[0]->conv_elems && s->ssm_elems == rec[0]->ssm_elems;
  });
  int64_t conv = 0, ssm = 0, full_state = 0, full_kv_token = 0;
  int r = 0;
  for (const ModuleStateSpec& s : specs) {
    Placement p;
    if (s.recurrent()) {
      p.kind = Placement::Recurrent;
      if (uniform) {
        p.pool_layer = r++;
      } else {
        p.conv_offset = conv, p.ssm_offset = ssm;
        conv += s.conv_elems, ssm += s.ssm_elems;
      }
      full_state += s.full_state_elems;
    } else if (s.attention()) {
      p.kind = Placement::Kv;
      p.kv_offset_bytes = kv_token_bytes_;  // times the block size, below
      kv_token_bytes_ += s.kv_token_bytes;
      full_kv_token += s.full_kv_token_bytes;
    }
    placements_.push_back(p);
  }
  if (uniform) {
    num_state_layers_ = r;
    shape_ = {rec[0]->conv_elems, rec[0]->ssm_elems, 0};
    return;
  }
  num_state_layers_ = 1;  // one page spans every layer
  if (full_kv_token > 0) {
    // As many tokens as the state page holds, rounded down to a power of two so that the prefix cache's block (a
    // multiple of this and of the mixers' power-of-two chunk lengths) stays their maximum, not their lcm.
    const int64_t fit = std::max<int64_t>(1, full_state > 0 ? full_state * 4 / full_kv_token : 64);
    int64_t pow2 = 1;
    while (pow2 * 2 <= fit && pow2 < (int64_t{1} << 20)) pow2 *= 2;
    kv_block_size_ = static_cast<int>(pow2);
  }
  for (Placement& p : placements_)
    if (p.kind == Placement::Kv) p.kv_offset_bytes *= kv_block_size_;
  // TP 1: a KV block is the whole page (at least kv_page_bytes). A shard: its KV block lives in its part of the SSM
  // region, counted in fp32 elements.
  if (tp_world == 1) shape_ = {conv, ssm, kv_page_bytes()};
  else shape_ = {conv, std::max(ssm, (kv_page_bytes() + 3) / 4), 0};
}

}  // namespace ssmserve
