// Owns the model interface every architecture implements, and the registry that picks an implementation from
// config.json's `architectures` (vllm-ssm-design.md §1: each mixer reports its state shapes; the engine owns
// the pool).
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cache/state_cache.h"
#include "config/model_config.h"
#include "core/device_sampling.h"
#include "model/forward_batch.h"

namespace ssmserve {

/// Where weights come from: the checkpoint's safetensors, or random values from the config alone (benchmarks).
enum class LoadFormat { Auto, Dummy };

/// Most top log-probabilities a device greedy step returns per row (CausalLM::forward_greedy).
inline constexpr int kMaxDeviceGreedyTop = 20;

/// One logits row's greedy pick made on the device: the token (argmax, lowest id on ties), its raw log-probability
/// (log_softmax of the unmodified logits) and `top` (id, logprob) pairs sorted by logprob descending, ties lower id
/// first. token = -1: the row's logits held a NaN or +inf, or were all -inf.
struct GreedyPick {
  int token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top;
  /// forward_sample rows with token == kPickOnHost: the row's raw logits [vocab] fp32 for the host sampler.
  std::vector<float> logits;
  /// forward_sample rows with SampleRowParams::score_token set (prompt scoring): that token's raw logprob and rank
  /// (1 + the number of logits strictly above it).
  float score_logprob = 0.0f;
  int score_rank = 0;
  /// The picked token's rank in the raw distribution (1 + the logits strictly above it; a greedy pick's is 1);
  /// forward_sample rows compute it when SampleRowParams::rank_sampled is set, else 0.
  int sampled_rank = 0;
};

/// One state-block copy (prefix caching): block `src`'s states onto block `dst`, in every recurrent layer.
struct BlockCopy {
  int src = 0;
  int dst = 0;
};

/// A causal language model with recurrent layers.
class CausalLM {
 public:
  virtual ~CausalLM() = default;
  virtual const ModelConfig& config() const = 0;
  /// Recurrent layers (each gets conv + ssm state in every block).
  virtual int num_state_layers() const = 0;
  /// State elements per block per layer.
  virtual StateShape state_shape() const = 0;
  /// Tokens per chunk of the chunked prefill scan (Mamba-2's `chunk_size`); the metadata builder cuts prefill
  /// rows at multiples of it from each sequence's start. Models without a chunked scan keep the default.
  virtual int chunk_size() const { return 256; }
  /// Tokens a prefix-cache block must be a multiple of so that a state cached at a block boundary equals the state
  /// an uncached prefill passes through there: the chunk length of chunked prefill forms (their chunks are counted
  /// from the sequence start), 1 for models whose prefill is token by token (Mamba-1).
  virtual int prefix_block_alignment() const { return chunk_size(); }
  /// Whether forward stores states inside prefill rows (MambaBatchMetadata::state_store_*_p, prefix caching's "all"
  /// mode): every recurrent layer copies its state at each store offset into the store's block. Models that do not
  /// (the default) run "all" as "align" (vLLM likewise for models without the support).
  virtual bool stores_prefill_states() const { return false; }
  /// Tokens per KV block of the softmax-attention layers (hybrids such as MiniMax), or 0 when the model has none.
  /// KV blocks come from the same pool as state blocks (one page each; docs/architecture.md); the engine then
  /// allocates them as sequences grow and fills ForwardBatch::linear_meta / attn_meta every step.
  virtual int kv_block_size() const { return 0; }
  /// True when the model has layers that read ForwardBatch::linear_meta (lightning or softmax attention): the batch
  /// builder (model/batch_builder.h) then fills it. Models with softmax layers (kv_block_size() > 0) always do.
  virtual bool has_linear_attention() const { return kv_block_size() > 0; }
  /// Runs the packed batch, updating the states of its blocks in `cache`, and writes logits for
  /// batch.logits_indices into `logits`: [logits_indices.size(), vocab_size] fp32.
  /// Throws Error on an inconsistent batch or a token id outside [0, vocab_size).
  virtual void forward(const ForwardBatch& batch, StateCache& cache, float* logits) = 0;
  /// Device backends (issue 7: sampling on the device, only ids and log-probabilities back to the host): runs the
  /// batch like forward but, instead of logits, returns out[i] for logits row i (num_top in [0,
  /// kMaxDeviceGreedyTop] top pairs each): what sample_token gives a greedy request with no penalties and no
  /// min_tokens masking in effect. Returns false, doing nothing, when the model has no device sampler (the
  /// engine then calls forward).
  virtual bool forward_greedy(const ForwardBatch& batch, StateCache& cache, int num_top, std::vector<GreedyPick>& out) {
    (void)batch, (void)cache, (void)num_top, (void)out;
    return false;
  }
  /// Device backends (multi-step decode, EngineConfig::num_scheduler_steps): a decode-only batch (one token and one
  /// logits row per sequence) run `num_steps` times back to back; step j + 1's input id of each sequence is its
  /// step-j greedy pick, made as in forward_greedy. out: [num_steps, logits rows] step-major. The states advance
  /// by num_steps tokens. Returns false, doing nothing, when the model has no such path (the engine then loops
  /// forward itself, host_greedy_steps in engine/llm_engine.h). Throws Error as forward_greedy, or when the batch
  /// is not decode-only.
  virtual bool forward_greedy_steps(const ForwardBatch& batch, StateCache& cache, int num_top, int num_steps,
                                    std::vector<GreedyPick>& out) {
    (void)batch, (void)cache, (void)num_top, (void)num_steps, (void)out;
    return false;
  }
  /// Device backends (issue 7): runs the batch like forward but samples every logits row on the device with
  /// sample.rows[i] (packed by engine/device_sampling.h pack_sample_row, uniform pre-drawn from the request's
  /// RequestRng) and returns only out[i] for row i: what sample_token_with_uniform gives for those params (token,
  /// raw logprob, rows[i].num_top top pairs). token == -1: NaN / +inf logits or every processed logit -inf;
  /// token == kPickOnHost: the device left the row to the host and out[i].logits holds its raw logits. Returns
  /// false, doing nothing, when the model has no device sampler (the engine then calls forward).
  /// sample.rows.size() must equal batch.logits_indices.size() (Error otherwise).
  virtual bool forward_sample(const ForwardBatch& batch, StateCache& cache, const DeviceSampleBatch& sample,
                              std::vector<GreedyPick>& out) {
    (void)batch, (void)cache, (void)sample, (void)out;
    return false;
  }
  /// Whether forward() runs speculative verify rows (decode rows of 1 + k tokens with a state column per token,
  /// MambaBatchMetadata::spec_cols > 1). The CPU decoder does; a backend that does not returns false and the engine
  /// refuses --speculative-config for it.
  virtual bool supports_speculative_decoding() const { return true; }
  /// Copies states between blocks of the pool (prefix caching: a cached state into a request's running block before
  /// the step that continues from it, or a running state into a block that caches it), in order, in every layer,
  /// where the model keeps its states (host pages: StateCache::copy_block; device backends: their mirror, ordered
  /// before the next forward on the device). Throws Error on a block outside [1, num_blocks).
  virtual void copy_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) {
    for (const BlockCopy& c : copies) cache.copy_block(c.src, c.dst);
  }
  /// Device backends, the host tier of cached blocks (--swap-space): allocates `num_slots` pinned host pages, each
  /// holding one block's page of every layer as the device keeps them (a cached state, or a hybrid's KV page: both
  /// live in the pool's pages), and returns true; false (the default, and models whose states already live in host
  /// memory) when the model has no such tier. Throws Error when the host memory cannot be allocated.
  virtual bool allocate_host_state_tier(int num_slots, const StateCache& cache) {
    (void)num_slots, (void)cache;
    return false;
  }
  /// Host tier: copies device block c.src's page (states or KV) into host slot c.dst for each copy, ordered after
  /// everything queued on the device before and before everything queued after (an evicted block is written again
  /// later).
  virtual void swap_out_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) { (void)copies, (void)cache; }
  /// Host tier: copies host slot c.src's page into device block c.dst for each copy, asynchronously (a side stream),
  /// ordered before the next forward and state copy. Throws Error on a slot or block out of range.
  virtual void swap_in_state_blocks(std::span<const BlockCopy> copies, StateCache& cache) { (void)copies, (void)cache; }
  /// Device backends: bytes of device memory left for the recurrent-state pool when the engine may use
  /// `gpu_memory_utilization` of the device's total memory, after what is in use now (weights, other
  /// processes) and the step workspace for up to `max_num_batched_tokens` tokens and `max_num_seqs` logits rows
  /// (negative: nothing left). nullopt for models whose states live in host memory (the default).
  virtual std::optional<double> device_state_budget(double gpu_memory_utilization, int64_t max_num_batched_tokens,
                                                    int64_t max_num_seqs) const {
    (void)gpu_memory_utilization, (void)max_num_batched_tokens, (void)max_num_seqs;
    return std::nullopt;
  }
};

/// Loads the model in `dir` (config.json + safetensors), picking the architecture from the registry.
/// Throws Error naming the file / tensor / field on any defect, or listing the supported architectures.
std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, LoadFormat format = LoadFormat::Auto);

/// Same, from an already-loaded config.
std::unique_ptr<CausalLM> load_model(const ModelConfig& config, LoadFormat format);

/// Same, split over `tensor_parallel_size` in-process ranks (a TensorParallelLM, model/tensor_parallel.h) when
/// it is above 1. Throws Error also when the size is out of range, does not divide the model's sharded dimensions
/// or the architecture has no tensor-parallel loader.
std::unique_ptr<CausalLM> load_model(const ModelConfig& config, LoadFormat format, int tensor_parallel_size);
std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, LoadFormat format, int tensor_parallel_size);

/// Architecture names the registry knows ("MambaForCausalLM", ...).
std::vector<std::string> supported_architectures();

/// Device backends besides the CPU (issue 7): a backend registers a loader per architecture it runs, with a
/// probe saying whether the device is usable now (e.g. a GPU is present).
using DeviceModelLoader = std::function<std::unique_ptr<CausalLM>(const ModelConfig&, LoadFormat)>;
void register_device_model(const std::string& device, const std::string& architecture, DeviceModelLoader loader,
                           std::function<bool()> available);
/// Device backends with tensor parallelism (issue 9): loads all `tensor_parallel_size` ranks of the model on
/// `device` as one CausalLM (e.g. one GPU per rank over NCCL).
using DeviceTpModelLoader = std::function<std::unique_ptr<CausalLM>(const ModelConfig&, LoadFormat, int tensor_parallel_size)>;
void register_device_tp_model(const std::string& device, const std::string& architecture, DeviceTpModelLoader loader);
/// The device a model will run on: "cpu" stays "cpu"; "auto" is the first registered device that is available
/// and runs config.architecture, else "cpu"; any other name is returned as is when registered for the
/// architecture. Throws Error naming --device for an unknown device or one without this architecture.
std::string resolve_device(const std::string& device, const ModelConfig& config);
/// Loads the model in `dir` on `device` ("cpu", "auto" or a registered device such as "cuda"), split over
/// `tensor_parallel_size` CPU ranks on the CPU ("auto" stays on the CPU when it is above 1), or through the
/// device's tensor-parallel loader. `dtype`: the weights' dtype (ModelConfig::dtype, vLLM's --dtype; nullopt = the
/// backend's default); the CPU computes in fp32 whatever it is, and logs a note once per process for BF16.
/// `enforce_eager`: no CUDA graphs on a device backend (ModelConfig::enforce_eager). Throws Error also for a device
/// backend without a tensor-parallel loader for the architecture when tensor_parallel_size > 1.
std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, LoadFormat format, const std::string& device,
                                     int tensor_parallel_size = 1, std::optional<DType> dtype = std::nullopt,
                                     bool enforce_eager = false);

}  // namespace ssmserve
