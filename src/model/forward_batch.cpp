// Owns ForwardBatch validation.
#include "model/forward_batch.h"

#include "core/error.h"

namespace ssmserve {

void ForwardBatch::validate() const {
  const int R = num_reqs();
  SSM_CHECK(static_cast<int>(query_start_loc.size()) == R + 1, "ForwardBatch: query_start_loc has {} entries, want {}",
            query_start_loc.size(), R + 1);
  SSM_CHECK(static_cast<int>(has_initial_states.size()) == R, "ForwardBatch: has_initial_states size {} != {}",
            has_initial_states.size(), R);
  SSM_CHECK(query_start_loc[0] == 0 && query_start_loc[R] == num_tokens(),
            "ForwardBatch: query_start_loc must span [0, {}]", num_tokens());
  SSM_CHECK(num_decodes >= 0 && num_decodes <= R, "ForwardBatch: num_decodes {} out of range", num_decodes);
  for (int r = 0; r < R; ++r) {
    SSM_CHECK(query_start_loc[r + 1] > query_start_loc[r], "ForwardBatch: request {} has no tokens", r);
    if (r < num_decodes)
      SSM_CHECK(query_start_loc[r + 1] - query_start_loc[r] == 1 && has_initial_states[r],
                "ForwardBatch: decode row {} must have 1 token and an initial state", r);
  }
  for (int32_t i : logits_indices)
    SSM_CHECK(i >= 0 && i < num_tokens(), "ForwardBatch: logits index {} out of range", i);
}

}  // namespace ssmserve
