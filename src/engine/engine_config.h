// Owns EngineConfig: every engine knob, validated once (style habit 8), with the sizes derived from them.
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "engine/scheduler.h"
#include "model/causal_lm.h"

namespace ssmserve {

/// Upper bounds of the engine knobs (EngineConfig::validate), far above any useful value on one machine; they
/// keep derived sizes (max_num_seqs + 1 blocks, token buffers) clear of int overflow and absurd allocations.
inline constexpr int kMaxNumBatchedTokens = 1 << 20;  ///< --max-num-batched-tokens
inline constexpr int kMaxNumSeqs = 1 << 14;           ///< --max-num-seqs (and bench latency --batch-size)
inline constexpr int kMaxNumStateBlocks = 1 << 20;    ///< --num-state-blocks (memory is checked separately)
/// The recurrent-state pool may take at most this fraction of physical RAM (checked before allocating it).
inline constexpr double kStateMemoryFraction = 0.8;
/// With --num-state-blocks 0 (automatic), the pool is max_num_seqs + 1 blocks capped at this fraction of RAM.
inline constexpr double kAutoStateMemoryFraction = 0.25;

/// Prefix caching's default block (tokens per cached state) is the smallest multiple of the model's unit (chunk
/// length, KV block size) of at least this many tokens.
inline constexpr int kDefaultMambaBlockSize = 256;

/// Most --threads accepted: 4 x the hardware threads, at least 64.
int max_num_threads();

/// vLLM's --dtype (ModelConfig.dtype): the weights' dtype that `dtype` names, from the registry of accepted names
/// (engine_config.cpp): nullopt for "auto" (the backend's default: bf16 weights on the GPU; on the CPU the checkpoint's
/// weights as stored, computed in fp32), DType::BF16 for "bfloat16", DType::F32 for "float32" or "float" (vLLM's
/// alias). Throws Error naming --dtype and the accepted values for anything else, "half" / "float16" included (no
/// kernel takes fp16 weights).
std::optional<DType> parse_model_dtype(std::string_view dtype);

/// --quantization against the checkpoint's quantization_config (ModelConfig::fp8): "" always passes; a known method
/// must equal the checkpoint's, as vLLM checks. Throws Error naming --quantization for an unknown method, a mismatch,
/// or an unquantized checkpoint (no quantization at load).
void check_quantization(const std::string& quantization, const ModelConfig& model);

/// Engine construction arguments (vLLM's EngineArgs names where they exist).
/// Most model steps per engine step (EngineConfig::num_scheduler_steps).
inline constexpr int kMaxSchedulerSteps = 64;

/// max_model_len of `serve` and the Python LLM / AsyncLLM when neither the user nor the model gives one (recurrent
/// models have no max_position_embeddings): prompt + generated tokens per request, so that max_tokens=None ends. vLLM
/// uses 2048 there; `generate` and `bench` keep no limit.
inline constexpr int kDefaultMaxModelLenWithoutLimit = 8192;

struct EngineConfig {
  std::filesystem::path model;               ///< checkpoint folder
  std::filesystem::path tokenizer;           ///< folder with tokenizer.json; empty = the model folder
  LoadFormat load_format = LoadFormat::Auto; ///< Dummy: random weights from config.json alone
  /// vLLM's --dtype: the weights' (and GEMM operands') dtype: "auto" (GPU: bf16; CPU: as stored), "bfloat16",
  /// "float32" or "float" (parse_model_dtype). The CPU computes in fp32 whatever the choice: "float32" is what it runs
  /// anyway (bf16 checkpoint weights widen exactly), "bfloat16" runs the same fp32 math (a one-time log note says so).
  std::string dtype = "auto";
  /// vLLM's --enforce-eager: no CUDA graphs on a GPU (ModelConfig::enforce_eager; every step's kernels launched one by
  /// one: the same results, slower decode). No effect on the CPU.
  bool enforce_eager = false;
  /// vLLM's --quantization (-q): empty = the checkpoint's own (config.json's quantization_config, if any); "fp8",
  /// "compressed-tensors", "modelopt", "gptq" (or "gptq_marlin") or "awq" (or "awq_marlin") must name the
  /// checkpoint's method. Weights are never quantized at load
  /// (vLLM's --quantization fp8 on a bf16 checkpoint is refused: check_quantization).
  std::string quantization;
  SchedulerConfig scheduler;                 ///< max_num_batched_tokens, max_num_seqs
  int num_state_blocks = 0;                  ///< state blocks incl. the null block; 0 = max_num_seqs + 1, capped at 25% of RAM
  int num_threads = 0;                       ///< CPU threads for the math; 0 = all cores
  int tensor_parallel_size = 1;              ///< ranks the model is split over (in-process threads on the CPU)
  /// Most prompt + generated tokens per request (vLLM's max_model_len); 0 = the model's context
  /// (max_position_embeddings). A value above the model's context is an error.
  int max_model_len = 0;
  /// max_model_len when neither max_model_len nor the model gives one (0 = no limit: `generate`, `bench`); the Python
  /// LLM / AsyncLLM set kDefaultMaxModelLenWithoutLimit. Not checked against the block pool (a limit the user set is).
  int max_model_len_without_limit = 0;
  std::string mamba_cache_dtype = "auto";         ///< conv state dtype: auto (= fp32 on CPU), float32, bfloat16, float16
  std::string mamba_ssm_cache_dtype = "float32";  ///< SSM state dtype: float32, bfloat16, float16, auto (= conv's)
  /// Pad decode-only batches of up to this many rows to exactly this many, with null-block rows (what CUDA
  /// graphs need; on the CPU it only exercises the padding path). 0 = no padding.
  int pad_decode_batches_to = 0;
  /// Model steps per engine step for decode-only batches of plain greedy requests (vLLM's --num-scheduler-steps,
  /// multi-step scheduling): the model runs this many decode steps back to back, each step's picks feeding the
  /// next step's inputs (on the device for GPU backends, so the GPU does not wait for the host between tokens),
  /// and every request gets up to that many tokens at once (streams get them in bursts). Taken for decode-only
  /// steps (models without KV blocks); a burst is capped at the fewest tokens a request still needs before
  /// max_tokens (rounded down to a power of two), and a request that stops earlier (EOS, stop string) keeps only
  /// its tokens up to there: the rest of the burst is computed for nothing, so K of 4-16 suits most workloads.
  /// The tokens are those of single steps. With speculative_config, a step in which any request verifies drafts
  /// runs one model step (the verify pass) and steps without drafts run the burst. 1 = off. In [1, kMaxSchedulerSteps].
  int num_scheduler_steps = 1;
  /// Where the model runs: "cpu", "cuda" (a registered device backend) or "auto" (a registered device when
  /// available for the architecture, else the CPU); see resolve_device in model/causal_lm.h.
  std::string device = "auto";
  /// Fraction of the GPU's total memory the engine may use (vLLM's --gpu-memory-utilization), for device
  /// backends: the recurrent-state pool gets what remains of it after the weights, the step workspace and memory
  /// already in use on the device (other processes included), capped at the blocks the engine can use
  /// (num_state_blocks, or max_num_seqs + 1). In (0, 1]; ignored on the CPU.
  double gpu_memory_utilization = 0.9;
  /// Prefix caching of recurrent states (vLLM's --enable-prefix-caching, on by default as in vLLM): a request whose
  /// tokens start with a cached prefix continues from that prefix's state (and shares its KV blocks).
  bool enable_prefix_caching = true;
  /// vLLM's --mamba-cache-mode: "all" (states at every block boundary; the default), "align" (states at block
  /// boundaries reached at the end of a step, prefill chunks cut on them) or "none" (no caching). "all" needs a
  /// model whose prefill stores boundary states inside a chunk (CausalLM::stores_prefill_states: the CPU backend, and
  /// GPU models whose every module stores, CudaModule::stores_prefill_states: every family now); others run "align"
  /// (vLLM likewise runs models without that support in "align").
  std::string mamba_cache_mode = "all";
  /// vLLM's --swap-space: GiB of pinned host memory that keep cached blocks (states, and hybrids' KV pages) evicted
  /// from a device pool, one pool page per slot; a later hit on one copies it back (asynchronously, before the
  /// forward that needs it). 0 = off. No effect on the CPU backend (its pool is host memory already) or without
  /// prefix caching. At most 70% of physical RAM (vLLM's limit).
  double swap_space = 0.0;
  /// --swap-space for hybrids: evicted cached KV pages go to host slots too, so a hybrid's hit survives their
  /// eviction (false: states only). Exact: in batch-invariant mode the H200 gives every family the uncached run's
  /// bits after state and KV swap-ins (tests/cuda/test_cuda_prefix_cache.cpp).
  bool swap_kv_pages = true;
  /// vLLM's --mamba-block-size: tokens per cached state; 0 = the model's default (a multiple of its unit of at least
  /// kDefaultMambaBlockSize). Must be a multiple of the chunk length of its chunked prefill forms and, for hybrids,
  /// of its KV block size.
  int mamba_block_size = 0;
  /// vLLM's --speculative-config: JSON text ("" = off), e.g. {"method": "ngram", "num_speculative_tokens": 4,
  /// "prompt_lookup_max": 4}; parsed by SpeculativeConfig::parse (engine/spec_decode.h).
  std::string speculative_config;
  /// vLLM's --reasoning-parser ("" = none; engine/reasoning.h: "qwen3", "deepseek_r1"): the model's reasoning markers.
  /// A constrained request (structured outputs) samples freely until its reasoning ends, then under its grammar
  /// (vLLM's default with a reasoning parser); the server returns the reasoning apart from the content.
  std::string reasoning_parser;
  /// vLLM's --generation-config: where the default sampling parameters come from (GenerationDefaults::load,
  /// engine/generation_defaults.h): "auto" (the model folder's generation_config.json, when it has one), "vllm" (none:
  /// vLLM's neutral defaults) or a folder holding generation_config.json. Read by the front ends that fill in a
  /// request's unset fields (serve, the Python LLM); the engine takes every request's SamplingParams as given, and
  /// `generate` / `bench` (explicit parameters) do not read it.
  std::string generation_config = "auto";
  /// vLLM's --override-generation-config: a JSON object ("" = none) merged over that config, e.g. {"temperature":
  /// 0.5}; with generation_config "vllm" only these keys are used.
  std::string override_generation_config;
  /// Accept benchmark-only drafters in speculative_config (method "replay", engine/replay_proposer.h). Only
  /// `ssmserve bench latency` sets it; generate, serve and the Python API leave it off and refuse them.
  bool allow_benchmark_proposers = false;

  /// Throws Error naming the knob when a value is out of range (see the kMax* bounds above).
  void validate() const;
  /// num_state_blocks after applying the default.
  int resolved_num_state_blocks() const {
    return num_state_blocks > 0 ? num_state_blocks : scheduler.max_num_seqs + 1;  // validate() bounds max_num_seqs
  }
};

}  // namespace ssmserve
