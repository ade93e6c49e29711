// Owns the engine step and the offline LLM API (see llm_engine.h).
#include "engine/llm_engine.h"

#include "core/env_options.h"
#include "model/batch_builder.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <numeric>
#include <thread>

#include "config/hf_json.h"
#include "core/error.h"
#include "engine/bad_words.h"
#include "engine/device_sampling.h"
#include "engine/reasoning.h"
#include "engine/structured_output.h"
#include "model/tensor_parallel.h"

namespace ssmserve {

RequestState::RequestState(Request r) : request(std::move(r)), rng(request.params.seed) {}
RequestState::~RequestState() = default;

namespace {

/// Physical RAM in bytes (0 when unknown).
double physical_ram_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

}  // namespace

LLMEngine::LLMEngine(EngineConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  if (!env_options().device_sampling) device_sampling_ = false;
  if (cfg_.num_threads > 0) omp_set_num_threads(cfg_.num_threads);
  if (!cfg_.quantization.empty()) check_quantization(cfg_.quantization, ModelConfig::load(cfg_.model));
  model_ = load_model(cfg_.model, cfg_.load_format, cfg_.device, cfg_.tensor_parallel_size, parse_model_dtype(cfg_.dtype),
                      cfg_.enforce_eager);
  if (const int ctx = model_->config().max_model_len; cfg_.max_model_len > 0 && ctx > 0)
    SSM_CHECK(cfg_.max_model_len <= ctx,
              "--max-model-len {} is larger than the model's context of {} tokens (max_position_embeddings)",
              cfg_.max_model_len, ctx);
  const auto tok_dir = cfg_.tokenizer.empty() ? cfg_.model : cfg_.tokenizer;
  // tokenizer.json, else a SentencePiece tokenizer.model (Codestral-Mamba ships only that): Tokenizer::from_pretrained.
  bool has_tokenizer = false;
  for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer.model.v3", "tokenizer.model.v1"})
    has_tokenizer = has_tokenizer || path_entry_exists(tok_dir / f);
  if (has_tokenizer) tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_pretrained(tok_dir));
  else if (!cfg_.tokenizer.empty())  // the user named this folder: say which option it came from
    fail("--tokenizer {}: {}", tok_dir.string(),
         path_entry_exists(tok_dir) ? "no tokenizer.json (nor a SentencePiece tokenizer.model) in that folder" : "no such folder");
  else if (cfg_.load_format != LoadFormat::Dummy)
    fail("{}: tokenizer.json not found (nor a SentencePiece tokenizer.model); --tokenizer DIR names another folder",
         tok_dir.string());
  if (!cfg_.reasoning_parser.empty()) {  // its markers as token ids (structured outputs wait for the end of reasoning)
    const ReasoningFormat& f = reasoning_format(cfg_.reasoning_parser);
    SSM_CHECK(tokenizer_, "--reasoning-parser {} needs a tokenizer", f.name);
    const auto start = tokenizer_->token_to_id(f.start), end = tokenizer_->token_to_id(f.end);
    SSM_CHECK(start && end, "--reasoning-parser {}: the tokenizer has no token \"{}\" (this model does not write its "
              "reasoning in {} ... {})", f.name, start ? f.end : f.start, f.start, f.end);
    reasoning_start_id_ = *start;
    reasoning_end_id_ = *end;
    reasoning_starts_in_ = f.starts_in_reasoning;
  }
  const PrefixCacheConfig prefix = resolve_prefix_cache();
  if (const int ctx = max_model_len(); prefix.block_size > 0 && ctx > 0 && prefix.block_size >= ctx)
    spdlog::warn("prefix caching: {} {} is not below max_model_len {}: no prompt can fill a block, so nothing will be "
                 "cached", cfg_.mamba_block_size > 0 ? "--mamba-block-size" : "the state block size (--mamba-block-size, "
                 "chosen from the model's chunk and KV block sizes)", prefix.block_size, ctx);
  spec_ = SpeculativeConfig::parse(cfg_.speculative_config);
  if (spec_.enabled()) {
    SSM_CHECK(model_->supports_speculative_decoding(),
              "--speculative-config: speculative decoding is not available on device {} for {} yet (use --device cpu)",
              cfg_.device, model_->config().architecture);
    ProposerContext pc;
    pc.target_vocab = model_->config().vocab_size;
    pc.target_tokenizer = tok_dir;
    pc.max_num_seqs = cfg_.scheduler.max_num_seqs;
    pc.max_model_len = max_model_len();
    proposer_ = make_proposer(spec_, pc);
    cfg_.scheduler.num_speculative_tokens = spec_.num_speculative_tokens;
    spec_stats_.accepted_per_pos.assign(static_cast<size_t>(spec_.num_speculative_tokens), 0);
  }
  int blocks = cfg_.resolved_num_state_blocks();
  if (const int bs = model_->kv_block_size(); bs > 0 && cfg_.num_state_blocks == 0) {
    // Hybrid models draw KV blocks from the same pool: by default a state block and one KV block per sequence,
    // plus room for one sequence of the model's whole context (capped below like any automatic size). The model's, not
    // a smaller --max-model-len: that room is also what lets many medium-length requests run at once (vLLM's KV cache
    // does not shrink with max_model_len either); --num-state-blocks sets the pool outright.
    const int ctx = model_->config().max_model_len > 0 ? std::min(model_->config().max_model_len, 1 << 20)
                                                       : kDefaultMaxModelLenWithoutLimit;
    blocks = static_cast<int>(std::min<int64_t>(kMaxNumStateBlocks, 2LL * cfg_.scheduler.max_num_seqs + 1 + (ctx + bs - 1) / bs));
  }
  // Speculative decoding: k more state columns per running request (on top of the base size, hybrids' too).
  if (spec_.enabled() && cfg_.num_state_blocks == 0)
    blocks = static_cast<int>(std::min<int64_t>(kMaxNumStateBlocks, int64_t{blocks} + int64_t{cfg_.scheduler.max_num_seqs} *
                                                                                        spec_.num_speculative_tokens));
  // Cached states live in the same pool: by default, room for as many cached blocks as running ones (at least 64).
  if (prefix.enabled() && cfg_.num_state_blocks == 0)
    blocks = static_cast<int>(std::min<int64_t>(kMaxNumStateBlocks, int64_t{blocks} + std::max(64, cfg_.scheduler.max_num_seqs)));
  const StateDtypes dtypes = StateDtypes::from_options(cfg_.mamba_cache_dtype, cfg_.mamba_ssm_cache_dtype);
  // Size the state pool before allocating it: a 2-block probe gives the bytes per block.
  const double block_bytes = static_cast<double>(StateCache(model_->num_state_layers(), model_->state_shape(), 2, dtypes).bytes_per_block());
  const double ram = physical_ram_bytes();
  if (cfg_.num_state_blocks == 0 && ram > 0) {
    // Automatic size: one block per possible sequence, within kAutoStateMemoryFraction of RAM (a request that
    // finds no free block waits, as in vLLM when the cache is full).
    const double fit = std::floor(kAutoStateMemoryFraction * ram / block_bytes);
    if (fit < blocks) {
      blocks = static_cast<int>(std::max(2.0, fit));
      spdlog::info("state pool: {} blocks ({} concurrent sequences) fit in {:.0f}% of RAM; set --num-state-blocks to change it",
                   blocks, blocks - 1, 100 * kAutoStateMemoryFraction);
    }
  }
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  // Device backends keep the states in device memory: the pool must also fit in --gpu-memory-utilization.
  if (const auto dev_budget = model_->device_state_budget(cfg_.gpu_memory_utilization,
                                                          cfg_.scheduler.max_num_batched_tokens, cfg_.scheduler.max_num_seqs)) {
    const double dev = *dev_budget;
    const double fit = std::floor(dev / block_bytes);
    if (cfg_.num_state_blocks > 0 && fit < blocks)
      fail("--num-state-blocks {} needs {:.2f} GiB of device memory for recurrent state ({:.3f} MiB per block); "
           "--gpu-memory-utilization {} leaves {:.2f} GiB after the weights and workspace",
           blocks, block_bytes * blocks / kGiB, block_bytes / 1048576.0, cfg_.gpu_memory_utilization, dev / kGiB);
    SSM_CHECK(fit >= 2, "--gpu-memory-utilization {} leaves {:.2f} GiB of device memory after the weights and workspace: "
              "not enough for 2 recurrent-state blocks of {:.3f} MiB; raise it or lower --max-num-batched-tokens",
              cfg_.gpu_memory_utilization, std::max(0.0, dev) / kGiB, block_bytes / 1048576.0);
    if (fit < blocks) {
      blocks = static_cast<int>(fit);
      spdlog::info("state pool: {} blocks ({} concurrent sequences) fit in --gpu-memory-utilization {}", blocks,
                   blocks - 1, cfg_.gpu_memory_utilization);
    }
  }
  const double need = block_bytes * blocks, budget = kStateMemoryFraction * ram;
  if (ram > 0 && need > budget) {
    if (cfg_.num_state_blocks > 0)
      fail("--num-state-blocks {} needs {:.2f} GiB of recurrent state ({:.3f} MiB per block), more than {:.0f}% of the {:.1f} GiB "
           "of physical RAM; lower --num-state-blocks",
           blocks, need / kGiB, block_bytes / 1048576.0, 100 * kStateMemoryFraction, ram / kGiB);
    fail("--max-num-seqs {} needs {} state blocks = {:.2f} GiB of recurrent state ({:.3f} MiB per block), more than {:.0f}% of the "
         "{:.1f} GiB of physical RAM; lower --max-num-seqs (or set a smaller --num-state-blocks)",
         cfg_.scheduler.max_num_seqs, blocks, need / kGiB, block_bytes / 1048576.0, 100 * kStateMemoryFraction, ram / kGiB);
  }
  cache_ = std::make_unique<StateCache>(model_->num_state_layers(), model_->state_shape(), blocks, dtypes);
  pool_ = std::make_unique<BlockPool>(blocks);
  scheduler_ = std::make_unique<Scheduler>(cfg_.scheduler, *pool_, *cache_, model_->kv_block_size(), prefix);
  // A device backend's states live in its device mirror (a new request starts with has_initial_states = 0 and
  // never reads its page): zeroing the host page per request (25 MB at the mamba-2.8b shape) is wasted time.
  if (model_->device_state_budget(cfg_.gpu_memory_utilization, cfg_.scheduler.max_num_batched_tokens,
                                  cfg_.scheduler.max_num_seqs))
    scheduler_->set_zero_host_states(false);
  spdlog::info("engine: {} state blocks x {:.2f} MiB", blocks, cache_->bytes_per_block() / 1048576.0);
  // A pool that cannot hold one cached block next to one running request caches nothing: an error, as vLLM's
  // "no space for the cache" (the flag that sizes it is named; caching can be turned off instead).
  if (prefix.enabled() && blocks - 1 < 2)
    fail("--num-state-blocks {} leaves {} usable block{} (block 0 is the null block): a running request's state block and no "
         "room for one cached state; prefix caching needs at least 3 (raise --num-state-blocks{}, or pass "
         "--no-enable-prefix-caching)",
         blocks, blocks - 1, blocks - 1 == 1 ? "" : "s", cfg_.num_state_blocks == 0 ? " or --gpu-memory-utilization" : "");
  // A hybrid request needs its state block and at least one KV block next to the null block: a pool without room for
  // that serves nothing, so it is refused here rather than request by request.
  if (const int kv = model_->kv_block_size(); kv > 0 && blocks - 1 < 2)
    fail("--num-state-blocks {} leaves {} usable block{} (block 0 is the null block): a request of this hybrid model "
         "needs its state block and at least one KV block of {} tokens; raise --num-state-blocks{}",
         blocks, blocks - 1, blocks - 1 == 1 ? "" : "s", kv, cfg_.num_state_blocks == 0 ? " or --gpu-memory-utilization" : "");
  // A given --max-model-len must fit one request's KV blocks (every front end: generate, serve, bench, LLM).
  if (const int cap = pool_token_capacity(); cfg_.max_model_len > 0 && cap > 0 && cfg_.max_model_len > cap)
    fail("--max-model-len {} does not fit in the block pool, which holds at most {} tokens of one request (its KV "
         "blocks; the null block and a state block aside): raise --num-state-blocks or lower --max-model-len",
         cfg_.max_model_len, cap);
  if (prefix.enabled() && blocks - 1 <= cfg_.scheduler.max_num_seqs && model_->kv_block_size() == 0)
    spdlog::warn("prefix caching: the pool's {} usable blocks leave no room for cached states next to --max-num-seqs {} "
                 "running requests once they are all running; raise --num-state-blocks",
                 blocks - 1, cfg_.scheduler.max_num_seqs);
  if (cfg_.swap_space > 0) enable_swap_space(prefix, ram);
  if (prefix.enabled())
    spdlog::info("prefix caching: mamba_cache_mode {}, mamba_block_size {} tokens{}",
                 prefix.mode == MambaCacheMode::All ? "all" : "align", prefix.block_size,
                 model_->kv_block_size() > 0 ? fmt::format(" (KV blocks of {} tokens shared)", model_->kv_block_size()) : "");
}

void LLMEngine::enable_swap_space(const PrefixCacheConfig& prefix, double ram) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const double bytes = cfg_.swap_space * kGiB;
  // vLLM's check: the swap space may take at most 70% of the machine's memory.
  if (ram > 0 && bytes > 0.7 * ram)
    fail("--swap-space {} GiB is more than 70% of the {:.1f} GiB of physical RAM; lower it", cfg_.swap_space, ram / kGiB);
  if (!prefix.enabled()) {
    spdlog::info("--swap-space: no effect without prefix caching");
    return;
  }
  const double block = static_cast<double>(cache_->bytes_per_block());
  const int slots = static_cast<int>(std::min<double>(kMaxNumStateBlocks, std::floor(bytes / block)));
  if (!model_->device_state_budget(cfg_.gpu_memory_utilization, cfg_.scheduler.max_num_batched_tokens, cfg_.scheduler.max_num_seqs)) {
    spdlog::info("--swap-space: no effect on this backend: its state pool is host memory already");
    return;
  }
  SSM_CHECK(slots >= 1, "--swap-space {} GiB holds no cached block ({:.3f} MiB per block); raise it or pass 0", cfg_.swap_space,
            block / 1048576.0);
  if (!model_->allocate_host_state_tier(slots, *cache_)) {
    spdlog::info("--swap-space: this backend has no host tier; ignored");
    return;
  }
  StateSwapper sw;
  sw.swap_out = [this](std::span<const BlockCopy> c) { model_->swap_out_state_blocks(c, *cache_); };
  sw.swap_in = [this](std::span<const BlockCopy> c) { model_->swap_in_state_blocks(c, *cache_); };
  sw.swap_kv_pages = cfg_.swap_kv_pages;
  scheduler_->enable_host_tier(slots, std::move(sw));
  spdlog::info("--swap-space: {} cached blocks ({}, {:.2f} GiB) in pinned host memory", slots,
               model_->kv_block_size() > 0 ? "states and KV pages" : "states", slots * block / kGiB);
}

PrefixCacheConfig LLMEngine::resolve_prefix_cache() const {
  PrefixCacheConfig pc;
  const bool user_size = cfg_.mamba_block_size > 0;
  if (!cfg_.enable_prefix_caching || cfg_.mamba_cache_mode == "none") {
    SSM_CHECK(!user_size, "--mamba-block-size needs prefix caching (--enable-prefix-caching and a --mamba-cache-mode "
                          "other than none), as in vLLM");
    pc.decode_rounds_apart = model_->prefix_block_alignment() > 1;
    pc.chunk_alignment = model_->prefix_block_alignment();
    return pc;
  }
  // "all" needs a model whose prefill stores the state at every block boundary inside a chunk; one that does not
  // (a GPU model with a module whose kernels do not store: CudaModule::stores_prefill_states) runs "align" (vLLM does
  // the same for models without SupportsMambaPrefixCaching).
  pc.mode = cfg_.mamba_cache_mode == "all" ? MambaCacheMode::All : MambaCacheMode::Align;
  if (pc.mode == MambaCacheMode::All && !model_->stores_prefill_states()) {
    pc.mode = MambaCacheMode::Align;
    spdlog::info("prefix caching: mamba_cache_mode all runs as align on this backend (its prefill does not store "
                 "states inside a chunk yet)");
  }
  const int chunk = std::max(1, model_->prefix_block_alignment()), kv = model_->kv_block_size();
  const int unit = kv > 0 ? std::lcm(chunk, kv) : chunk;
  if (user_size) {
    SSM_CHECK(cfg_.mamba_block_size % unit == 0,
              "--mamba-block-size {} must be a multiple of {} tokens for this model (its chunk length {}{})", cfg_.mamba_block_size,
              unit, chunk, kv > 0 ? fmt::format(" and its KV block size {}", kv) : "");
    SSM_CHECK(cfg_.mamba_block_size <= cfg_.scheduler.max_num_batched_tokens,
              "--mamba-block-size {} must be at most --max-num-batched-tokens {} (a prefill chunk ends on a block boundary)",
              cfg_.mamba_block_size, cfg_.scheduler.max_num_batched_tokens);
  }
  // Default: the smallest multiple of the unit of at least kDefaultMambaBlockSize tokens (a snapshot copy per block
  // of decode, and a cached block per block of history, stay cheap next to the tokens they save).
  pc.block_size = user_size ? cfg_.mamba_block_size : unit * ((kDefaultMambaBlockSize + unit - 1) / unit);
  pc.hash_granularity = kv > 0 ? kv : pc.block_size;
  // What else makes a state: the model and the state dtypes (one engine has one of each; the salt keeps hashes of
  // different configurations apart should caches ever be shared).
  pc.decode_rounds_apart = model_->prefix_block_alignment() > 1;
  pc.chunk_alignment = model_->prefix_block_alignment();
  pc.salt = std::hash<std::string>{}(cfg_.model.string() + "|" + cfg_.mamba_cache_dtype + "|" + cfg_.mamba_ssm_cache_dtype + "|" +
                                     std::to_string(cfg_.tensor_parallel_size));
  return pc;
}

LLMEngine::~LLMEngine() = default;

void LLMEngine::set_proposer(std::unique_ptr<Proposer> p) {
  SSM_CHECK(spec_.enabled(), "set_proposer: speculative decoding is off (no --speculative-config)");
  SSM_CHECK(p != nullptr, "set_proposer: null proposer");
  proposer_ = std::move(p);
}

void LLMEngine::add_request(Request req) {
  SSM_CHECK(!requests_.count(req.request_id), "request id \"{}\" is already in use", req.request_id);
  const ModelConfig& mc = model_->config();
  req.params.validate(mc.vocab_size);
  SSM_CHECK(req.params.n == 1, "n = {} is not supported yet (only n = 1)", req.params.n);
  if (req.prompt_token_ids.empty()) {
    SSM_CHECK(tokenizer_, "a text prompt needs a tokenizer (none loaded for {})", cfg_.model.string());
    req.prompt_token_ids = tokenizer_->encode(req.prompt);
  }
  SSM_CHECK(!req.prompt_token_ids.empty(), "the prompt is empty");
  for (int id : req.prompt_token_ids)
    SSM_CHECK(id >= 0 && id < mc.vocab_size, "prompt token id {} is outside the vocabulary [0, {})", id, mc.vocab_size);
  if (const int ctx = max_model_len(); ctx > 0) {
    const int len = static_cast<int>(req.prompt_token_ids.size());
    SSM_CHECK(len < ctx, "the prompt has {} token{}; the context (max_model_len) is {}", len, len == 1 ? "" : "s", ctx);
    // As vLLM: generation stops at the context (finish_reason "length"). The CLI and the server cap first (with a
    // warning / a 400); this covers the Python API, which generated past max_position_embeddings.
    if (static_cast<long long>(len) + req.params.max_tokens > ctx) {
      req.params.max_tokens = ctx - len;
      req.params.min_tokens = std::min(req.params.min_tokens, req.params.max_tokens);
    }
  }
  if (const int bs = model_->kv_block_size(); bs > 0) {
    // Hybrid models: the prompt's KV blocks and a state block must fit in the pool at once.
    const int need = 1 + (static_cast<int>(req.prompt_token_ids.size()) + bs) / bs;
    SSM_CHECK(need <= pool_->num_blocks() - 1,
              "the prompt has {} tokens and needs {} blocks (a state block + KV blocks of {} tokens), but the pool has {} usable "
              "blocks; raise --num-state-blocks",
              req.prompt_token_ids.size(), need, bs, pool_->num_blocks() - 1);
    // Generation stops where one request's KV blocks would no longer fit in the pool (finish_reason "length"), as
    // at max_model_len, instead of failing the whole run mid-generation (`serve` lowers max_model_len up front).
    const int cap = pool_token_capacity(), len = static_cast<int>(req.prompt_token_ids.size());
    if (cap > len && static_cast<long long>(len) + req.params.max_tokens > cap) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        spdlog::warn("a request's prompt + max_tokens exceed the {} tokens one request's KV blocks can take in the block pool: "
                     "generation stops there (finish_reason \"length\"); --num-state-blocks raises it", cap);
      });
      req.params.max_tokens = cap - len;
      req.params.min_tokens = std::min(req.params.min_tokens, req.params.max_tokens);
    }
  }
  if (!req.params.bad_words.empty() && req.params.bad_words_token_ids.empty()) {  // vLLM's update_from_tokenizer
    SSM_CHECK(tokenizer_, "bad_words need a tokenizer (none loaded for {})", cfg_.model.string());
    req.params.bad_words_token_ids = tokenize_bad_words(req.params.bad_words, *tokenizer_, mc.vocab_size);
  }
  std::shared_ptr<PendingGrammar> pending;
  if (req.params.structured_outputs) {
    SSM_CHECK(tokenizer_, "structured outputs need a tokenizer (none loaded for {})", cfg_.model.string());
    if (!structured_)  // built by the first constrained request (the vocabulary's tables take a moment)
      structured_ = std::make_unique<StructuredOutputManager>(*tokenizer_, mc.vocab_size, mc.eos_token_ids);
    pending = structured_->compile_async(*req.params.structured_outputs);  // validated here: errors name the field
  }
  auto st = std::make_unique<RequestState>(std::move(req));
  if (pending && reasoning_end_id_ >= 0 && !st->request.reasoning_off)  // the constraint applies once the reasoning
    st->in_reasoning = !reasoning_ended(st->request.prompt_token_ids, reasoning_start_id_, reasoning_end_id_,  // ended (vLLM)
                                        reasoning_starts_in_);
  if (tokenizer_) st->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, st->request.params.skip_special_tokens);
  st->stop = std::make_unique<StopChecker>(st->request.params, mc.eos_token_ids);
  if (st->request.params.prompt_logprobs) st->prompt_logprobs.resize(st->prompt_len());
  RequestState* raw = st.get();
  requests_.emplace(raw->request.request_id, std::move(st));
  if (pending) {  // scheduled once its grammar is compiled (admit_compiled)
    compiling_.push_back({raw, std::move(pending)});
    return;
  }
  scheduler_->add_request(raw);
}

void LLMEngine::admit_compiled(std::vector<RequestOutput>& outs) {
  for (size_t i = 0; i < compiling_.size();) {
    Compiling& c = compiling_[i];
    if (!c.pending->ready()) {
      ++i;
      continue;
    }
    RequestState* r = c.req;
    try {
      r->grammar = c.pending->take();
      scheduler_->add_request(r);
    } catch (const std::exception& e) {  // validated at admission, so rare: the request ends, the others go on
      spdlog::error("request {}: structured outputs: {}", r->request.request_id, e.what());
      r->status = RequestStatus::Finished;
      r->finish_reason = FinishReason::Abort;
      outs.push_back(make_output(*r, 0));
      requests_.erase(r->request.request_id);
    }
    compiling_.erase(compiling_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

bool LLMEngine::preempt_newest_request() {
  RequestState* r = scheduler_->preemption_candidate();
  if (!r) return false;
  scheduler_->preempt(r);
  return true;
}

void LLMEngine::abort_request(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return;
  for (auto c = compiling_.begin(); c != compiling_.end(); ++c)
    if (c->req == it->second.get()) {  // not in the scheduler yet: its compilation is skipped if not begun
      c->pending->cancel();
      compiling_.erase(c);
      requests_.erase(it);
      return;
    }
  scheduler_->finish_request(it->second.get());
  if (proposer_) proposer_->release(request_id);
  requests_.erase(it);
}

std::vector<RequestOutput> LLMEngine::step() {
  try {
    return step_impl();
  } catch (...) {
    // A failed step (a model or sampler error): end the scheduler's step so that the requests can be aborted (the
    // server aborts them) without dangling holds.
    scheduler_->abandon_step();
    throw;
  }
}

std::vector<RequestOutput> LLMEngine::step_impl() {
  std::vector<RequestOutput> outs;
  // Constrained requests whose grammars are compiled join the scheduler; when only compilations are left, wait a
  // little for the first instead of returning at once (callers loop while has_unfinished_requests()).
  if (!compiling_.empty()) {
    if (!scheduler_->has_unfinished()) compiling_.front().pending->wait_for(std::chrono::milliseconds(20));
    admit_compiled(outs);
  }
  // 0. Speculative decoding: draft tokens for the requests that decode this step (the scheduler fits them).
  if (proposer_) {
    const std::vector<RequestState*> dec = scheduler_->decoding_requests();
    if (!dec.empty()) proposer_->propose(dec, spec_.num_speculative_tokens);
    for (RequestState* r : dec)  // a constrained request decodes one token a step (its mask follows each token)
      if (r->grammar) r->draft_token_ids.clear();
    if (spec_.adaptive_draft_length)
      for (RequestState* r : dec) {
        const size_t d = static_cast<size_t>(r->draft_length.limit(spec_.num_speculative_tokens));
        if (r->draft_token_ids.size() > d) r->draft_token_ids.resize(d);
      }
  }
  // 1. Schedule.
  SchedulerOutput sched = scheduler_->schedule();
  auto copy_states = [&](std::span<const BlockCopy> c) { model_->copy_state_blocks(c, *cache_); };
  if (sched.empty()) {
    scheduler_->finish_step(sched, {}, copy_states);
    SSM_CHECK(!scheduler_->has_unfinished() || scheduler_->num_running() > 0,
              "no state block is free for the waiting requests (num_state_blocks = {})", pool_->num_blocks());
    return outs;
  }
  // Prefix-cache hits start from a copy of the cached state.
  if (!sched.state_copies.empty()) copy_states(sched.state_copies);
  // 2. Build the packed batch and its metadata (the builder reorders decodes first).
  std::vector<ScheduledRequest> order = sched.decodes;
  order.insert(order.end(), sched.prefills.begin(), sched.prefills.end());
  std::vector<ScheduledSeq> seqs(order.size());
  std::vector<std::vector<int32_t>> tokens(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const RequestState& r = *order[i].req;
    const int begin = r.num_computed_tokens, end = begin + order[i].num_tokens;
    // A one-token row past the prompt is a decode row (also when it recomputes a generated token after a preemption,
    // one per step: Scheduler::prefill_chunk); a prompt's last one-token chunk is a prefill row (is_decode_row). A
    // verify row (speculative decoding) is a decode row of its last token and its drafts, one state column each.
    const int drafts = order[i].num_draft_tokens;
    const bool is_decode = begin >= r.prompt_len() && begin > 0 && (order[i].num_tokens == 1 || drafts > 0);
    seqs[i] = {r.state_block, begin, order[i].num_tokens, !is_decode};
    seqs[i].state_stores = order[i].state_stores;  // "all" mode: prefill rows store boundary states
    if (drafts > 0) {
      seqs[i].spec_state_blocks = std::span<const int32_t>(r.spec_blocks.data(), static_cast<size_t>(drafts));
      tokens[i].push_back(r.token_at(begin));
      tokens[i].insert(tokens[i].end(), r.draft_token_ids.begin(), r.draft_token_ids.begin() + drafts);
      continue;
    }
    for (int p = begin; p < end; ++p) tokens[i].push_back(r.token_at(p));
  }
  BatchBuilderOptions opt;
  opt.meta.chunk_size = model_->chunk_size();
  opt.meta.pad_decodes_to = cfg_.pad_decode_batches_to;
  opt.kv_block_size = model_->kv_block_size();
  opt.linear_attention = model_->has_linear_attention();
  std::vector<std::vector<int32_t>> tables(opt.kv_block_size > 0 ? order.size() : 0);
  for (size_t i = 0; i < tables.size(); ++i) tables[i].assign(order[i].req->kv_blocks.begin(), order[i].req->kv_blocks.end());
  ForwardBatch batch = build_forward_batch(seqs, tokens, tables, opt);
  // Logits rows: every position that scores a not-yet-scored prompt token, and the last position (sampling).
  std::vector<RowPlan> plans(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const RequestState& r = *order[i].req;
    const int begin = r.num_computed_tokens, end = begin + order[i].num_tokens;
    plans[i].first_logit_row = static_cast<int>(batch.logits_indices.size());
    const bool want_prompt_lp = r.request.params.prompt_logprobs.has_value();
    for (int p = begin; p < end; ++p) {
      const bool score_prompt = want_prompt_lp && p + 1 < r.prompt_len() && !r.prompt_logprobs[p + 1].has_value();
      // p >= num_tokens - 1: the last known token and, in a verify row, each draft (drafts are not tokens yet).
      if (score_prompt || p >= r.num_tokens() - 1) {
        plans[i].positions.push_back(p);
        batch.logits_indices.push_back(batch.seq_first_token[i] + (p - begin));
      }
    }
  }
  // 3. Run the model. When every row is a plain greedy pick (no logit_bias, allowed_token_ids, bad_words, penalties,
  //    min_tokens masking or prompt logprobs), a device backend picks the tokens on the device and only ids + logprobs
  //    come back.
  const int V = model_->config().vocab_size;
  int num_top = 0;
  bool device_greedy = !batch.logits_indices.empty();
  for (size_t i = 0; i < order.size() && device_greedy; ++i) {
    const RequestState& r = *order[i].req;
    const SamplingParams& p = r.request.params;
    device_greedy = p.greedy() && !p.prompt_logprobs.has_value() && p.logit_bias.empty() && p.allowed_token_ids.empty() &&
                    p.bad_words_token_ids.empty() && !r.grammar &&
                    p.repetition_penalty == 1.0 &&
                    p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 &&
                    (static_cast<int>(r.output_token_ids.size()) >= p.min_tokens ||
                     (p.ignore_eos && p.stop_token_ids.empty())) &&
                    p.logprobs.value_or(0) <= kMaxDeviceGreedyTop;
    num_top = std::max(num_top, p.logprobs.value_or(0));
  }
  // 3a. Multi-step decode (num_scheduler_steps): K model steps of plain greedy decode rows, picks fed forward. Not
  //     taken when a request verifies drafts this step (speculative decoding: its verify row is the step).
  if (const int steps = multi_step_count(sched, order, device_greedy); steps > 1) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!model_->forward_greedy_steps(batch, *cache_, num_top, steps, picks_))
      host_greedy_steps(*model_, batch, *cache_, num_top, steps, logits_, scratch_, picks_);
    stats_.forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.num_prefill_tokens = 0;
    stats_.num_model_steps = steps;
    for (size_t i = 0; i < order.size(); ++i)
      process_request_steps(*order[i].req, steps, batch.logits_indices.size(), plans[i], outs);
    scheduler_->finish_step(sched, std::vector<int>(order.size(), steps), copy_states);
    stats_.num_decode_tokens = 0;  // the tokens kept (a request's tokens after its stop are dropped)
    for (const auto& o : outs) stats_.num_decode_tokens += static_cast<int>(o.delta_token_ids.size());
    for (const auto& o : outs)
      if (o.finished) {
      if (proposer_) proposer_->release(o.request_id);
      requests_.erase(o.request_id);
    }
    return outs;
  }
  stats_.num_model_steps = 1;
  const auto t0 = std::chrono::steady_clock::now();
  if (device_greedy) device_greedy = model_->forward_greedy(batch, *cache_, num_top, picks_);
  // 3b. Otherwise every row is sampled on the device from packed parameters and the request's next uniform (drawn
  //     here, exactly as sample_token would), again only ids + logprobs back. A prompt-scoring row (prompt_logprobs)
  //     gets its top-k, the next prompt token's logprob and its rank there too (SampleRowParams::score_token).
  sample_drawn_ = false;
  bool device_sample = false;
  if (!device_greedy && device_sampling_ && !batch.logits_indices.empty()) {
    bool eligible = true;
    for (size_t i = 0; i < order.size() && eligible; ++i) {
      const SamplingParams& p = order[i].req->request.params;
      // (the allowed set and a grammar's mask: host only; bad_words travel as the row's masks, pack_sample_row; a verify
      // row samples each position with its own history and draw: host only)
      eligible = p.allowed_token_ids.empty() && !order[i].req->grammar && order[i].num_draft_tokens == 0 &&
                 p.prompt_logprobs.value_or(0) <= kMaxDeviceGreedyTop;
    }
    if (eligible) {
      sample_.rows.assign(batch.logits_indices.size(), SampleRowParams{});
      sample_.mods.clear();
      for (size_t i = 0; i < order.size(); ++i) {
        RequestState& r = *order[i].req;
        const SamplingParams& sp = r.request.params;
        for (size_t k = 0; k < plans[i].positions.size(); ++k) {
          const int p = plans[i].positions[k];
          SampleRowParams& row = sample_.rows[static_cast<size_t>(plans[i].first_logit_row) + k];
          if (p + 1 < r.prompt_len()) {  // scores prompt token p + 1 (greedy pick, unused)
            row.top_k = V;
            row.num_top = *sp.prompt_logprobs;
            row.score_token = r.token_at(p + 1);
            continue;
          }
          pack_sample_row(sp, r.request.prompt_token_ids, r.output_token_ids, model_->config().eos_token_ids, V,
                          sp.greedy() ? 0.0 : r.rng.uniform(), row, sample_.mods);
        }
      }
      sample_drawn_ = true;
      device_sample = model_->forward_sample(batch, *cache_, sample_, picks_);
      if (!device_sample) device_sampling_ = false;  // no device sampler: host path from now on
    }
  }
  device_greedy = device_greedy || device_sample;
  if (!device_greedy) {
    logits_.resize(batch.logits_indices.size() * static_cast<size_t>(V));
    model_->forward(batch, *cache_, logits_.data());
  }
  stats_.forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats_.num_decode_tokens = batch.meta.num_decode_tokens;
  stats_.num_prefill_tokens = batch.meta.num_prefill_tokens;
  // 4. Sample (verify the drafts of verify rows), update and emit.
  std::vector<int> state_tokens(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    state_tokens[i] = process_request(*order[i].req, order[i], logits_.data(), device_greedy ? picks_.data() : nullptr,
                                      plans[i], outs);
  // 5. Cache the states that reached a block boundary (and full KV blocks); free what finished requests held.
  scheduler_->finish_step(sched, state_tokens, copy_states);
  log_pool_split();
  for (const auto& o : outs)
    if (o.finished) {
      if (proposer_) proposer_->release(o.request_id);
      requests_.erase(o.request_id);
    }
  return outs;
}

void LLMEngine::log_pool_split() {
  // Debug: at info, `serve` prints its stats line (the hit rate among it) instead.
  if (!spdlog::should_log(spdlog::level::debug) || !scheduler_->prefix_config().enabled()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_pool_log_ < std::chrono::seconds(10)) return;
  last_pool_log_ = now;
  const PrefixCacheStats st = scheduler_->prefix_cache_stats();
  const int total = pool_->num_blocks() - 1, avail = scheduler_->num_available_blocks();
  spdlog::debug("block pool: {} held by running requests, {} cached ({} of them evictable), {} free of {}; prefix cache hit "
               "rate {:.1f}% ({} of {} prompt tokens)",
               total - avail, scheduler_->num_cached_blocks(), avail - pool_->num_free(), pool_->num_free(), total,
               100.0 * st.hit_rate(), st.hits, st.queries);
}

}  // namespace ssmserve
