// Owns the draft-model proposer of speculative decoding ({"method": "draft_model", "model": DIR}): a smaller checkpoint
// of any supported family with the target's tokenizer drafts k tokens per step by greedy decoding, from its own states.
#pragma once
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/state_cache.h"
#include "engine/spec_decode.h"
#include "model/causal_lm.h"

namespace ssmserve {

/// Drafts with a second model on the CPU. Per request it keeps a committed state block holding every token the
/// request knows (caught up each step over the tokens added since: the accepted drafts and the new last token) and a
/// scratch block the k - 1 further draft steps run on (a copy of the committed state), so rejected drafts never touch
/// the committed state. Hybrid drafts keep their KV pages per position (drafted positions are rewritten when caught up).
/// One forward for the catch-up of all requests, then one per further draft position.
/// Blocks of the draft model's pool: a committed and a scratch state block per request (`max_seqs`) plus the null
/// block, and for a hybrid draft (`kv_block_size` > 0) KV pages as the target's default pool sizes them: one partly
/// filled page per request plus the pages of one request at the whole context (`max_model_len`, 0 = unknown: 8192)
/// and kMaxSpeculativeTokens drafted positions. Requests that find no free pages get no drafts (the output is the
/// same). Capped by the constructor at a quarter of RAM.
int64_t draft_pool_blocks(int max_seqs, int max_model_len, int kv_block_size);

class DraftModelProposer final : public Proposer {
 public:
  /// Loads the draft checkpoint `dir` (on the CPU, `threads` OpenMP threads as the target). `target_vocab`: the
  /// target's vocabulary; `target_tokenizer`: the target's tokenizer folder (or empty). Throws Error naming
  /// --speculative-config when the draft cannot load, has another vocabulary or tokenizer, or `max_seqs` requests'
  /// blocks do not fit in memory.
  DraftModelProposer(const std::filesystem::path& dir, int target_vocab, const std::filesystem::path& target_tokenizer,
                     int max_seqs, int max_model_len);
  ~DraftModelProposer() override;
  void propose(std::span<RequestState* const> reqs, int k) override;
  void release(const std::string& request_id) override;

 private:
  struct Slot {
    int committed = 0, scratch = 0;  ///< state blocks
    int num_computed = 0;            ///< tokens in the committed state
    std::vector<int32_t> kv_blocks;  ///< hybrids: KV block table
  };
  int allocate_block();
  /// Grows s's KV table to hold `tokens` positions; false (the table unchanged) when the pool has too few free blocks.
  bool reserve_kv(Slot& s, int tokens);
  /// Runs one batch of rows on the draft model and returns each row's greedy next token.
  std::vector<int32_t> run(const std::vector<ScheduledSeq>& seqs, const std::vector<std::vector<int32_t>>& tokens,
                           const std::vector<std::vector<int32_t>>& tables);

  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<StateCache> cache_;
  std::vector<int> free_;
  std::map<std::string, Slot> slots_;
  std::vector<float> logits_;
  int target_vocab_ = 0;
};

}  // namespace ssmserve
