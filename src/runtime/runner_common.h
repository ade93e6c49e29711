// Owns what the GPU model runners share: device copies of weights in the GEMM dtype, grow-only device scratch,
// the once-per-step upload of the batch metadata, and the stack around the mixers (embedding, final norm, LM head
// on the requested rows, logits download).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"
#include "kernels/cuda/device_decode_rows.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/state_stores.h"
#include "model/causal_lm.h"
#include "model/forward_batch.h"
#include "model/weight.h"

namespace ssmserve::cuda {

/// A weight matrix [rows, cols] on the device in `dtype` (BF16 or F32).
struct DevWeight {
  DeviceBuffer buf;
  int64_t rows = 0, cols = 0;
  DType dtype = DType::BF16;
};

struct CudaModelOptions;
/// Applies the GEMM routing options (skinny_max_m, batch_invariant, pdl) to `g`.
void configure_gemm(GemmHandle& g, const CudaModelOptions& o);

/// Device memory left for the recurrent-state pool (CausalLM::device_state_budget): gpu_memory_utilization x
/// the device's total memory, minus what is in use now (weights, other processes), the step workspace
/// (`workspace_bytes`, with the scratch's 1.5x growth) and a fixed reserve for CUDA graphs and cuBLASLt.
double state_budget_bytes(double gpu_memory_utilization, double workspace_bytes);

/// Converts `w` (F32 or BF16 on the host) to `dtype` and uploads it.
DevWeight upload_weight(const Weight& w, DType dtype);

/// Sibling projections that read the same input as one weight (one GEMM instead of one per projection): parts
/// [r_i, cols] (each F32 or BF16 on the host, dtypes may differ) stacked in the given order into [sum r_i, cols] in
/// `dtype`. Each part is converted exactly as upload_weight converts it alone, so every row holds the bits it would
/// have as its own DevWeight. Throws Error on an empty list, parts of different widths, or a dtype other than
/// BF16 / F32.
DevWeight upload_stacked(const std::vector<const Weight*>& parts, DType dtype);

/// Stacks device weights [r_i, cols] (same cols and dtype) into one: part i from row (*offsets)[i], each offset and the
/// total row count rounded up to a multiple of `align_rows` (>= 1) with zero rows between, so that each part's columns
/// of the GEMM output start as aligned as the output's rows (16 bytes for fp32 with align_rows 4). Device-to-device
/// copies: every row keeps its bits. Synchronizes the device (load time). Throws Error on an empty list or parts of
/// different widths or dtypes.
DevWeight stack_device_rows(const std::vector<const DevWeight*>& parts, int64_t align_rows, std::vector<int64_t>* offsets);

/// A device buffer that only grows (by 1.5x) and is reused across steps.
struct Scratch {
  DeviceBuffer buf;
  void* get(size_t bytes) {
    if (buf.bytes() < bytes) buf = DeviceBuffer(std::max(bytes, buf.bytes() * 3 / 2));
    return buf.data();
  }
  float* f32(size_t n) { return static_cast<float*>(get(n * 4)); }
};

/// One step's metadata on the device: views into one buffer filled by a single host-to-device copy.
struct StepMeta {
  const int32_t* input_ids = nullptr;           ///< [T]
  const int32_t* query_start_loc_p = nullptr;   ///< [num_prefills + 1]
  const int32_t* state_indices_p = nullptr;     ///< [num_prefills]
  const int32_t* state_indices_d = nullptr;     ///< [num_decode_rows]
  const int32_t* logits_indices = nullptr;      ///< [n_logits]
  const int32_t* cu_chunk_seqlen_p = nullptr;   ///< [nchunks + 1]
  const int32_t* seq_idx_p = nullptr;           ///< [nchunks]
  const int32_t* last_chunk_indices_p = nullptr;///< [num_prefills]
  const uint8_t* has_initial_states_p = nullptr;///< [num_prefills]
  const int32_t* num_computed_tokens_p = nullptr;///< [num_prefills] (Gated DeltaNet's sequence-aligned chunks)
  const int32_t* query_start_loc_d = nullptr;   ///< [num_decode_rows + 1] token offsets of the decode rows
  const int32_t* state_indices_spec_d = nullptr;///< [num_decode_rows, spec_cols] (speculative verify rows)
  int spec_cols = 1;                            ///< MambaBatchMetadata::spec_cols
  /// Prefix caching's "all"-mode state stores of the prefill rows (MambaBatchMetadata::state_store_*_p, plus each
  /// store's row); stores.num == 0 when the step has none.
  DevStateStores stores = {};
  /// [nchunks] per chunk of the prefill chunk metadata: the block its end state is stored into (0: none); null when
  /// the step has no stores.
  const int32_t* chunk_store_blocks_p = nullptr;
  /// Every store offset ends a chunk of cu_chunk_seqlen_p (what the SSD's chunk-end stores need; true without stores).
  bool stores_on_chunk_ends = true;

  /// The decode rows as the decode kernels take them: plain rows (state_indices_d, one token each) or, in a step
  /// with speculative verify rows (spec_cols > 1), every row's tokens and state columns.
  DeviceDecodeRows decode_rows() const {
    return spec_cols > 1 ? DeviceDecodeRows{state_indices_spec_d, spec_cols, query_start_loc_d}
                         : DeviceDecodeRows{state_indices_d};
  }
};

/// Packs and uploads the step's arrays (asynchronously on `stream`; the host staging stays valid until the
/// next call). Throws Error on a device failure.
class StepMetaUploader {
 public:
  StepMeta upload(const ForwardBatch& batch, cudaStream_t stream);
  const void* device_buffer() const { return dev_.data(); }

 private:
  std::vector<uint8_t> host_;
  DeviceBuffer dev_;
  std::vector<int32_t> store_row_, chunk_store_;  // derived from the state stores (StepMeta::stores.row, chunk_store_blocks_p)
};

/// The per-chunk store blocks of `md`'s state stores ([nchunks], 0: none) into `chunk_store`, and each store's row
/// into `store_row`; returns whether every store offset ends a chunk of md's chunk metadata (a store that does not
/// gets no chunk entry). Both cleared when md has no stores.
bool chunk_store_blocks(const MambaBatchMetadata& md, std::vector<int32_t>& chunk_store, std::vector<int32_t>& store_row);

/// The embedding -> mixers -> final norm -> LM head frame shared by the runners.
struct LmFrame {
  DevWeight embedding, lm_head;
  bool tied = false;
  bool pdl = true;  ///< launch the embedding and the final norm with Programmatic Dependent Launch
  DeviceBuffer norm_f;
  Scratch cast, logits;  ///< cast: the normed logits rows [n_logits, H] in the head's dtype
  Scratch picks;         ///< device greedy picks [num_steps, n_logits] GreedyRow
  Scratch next_ids;      ///< multi-step decode: the next step's input ids [T] int32
  Scratch sample_in;     ///< device sampling input: rows [n_logits] SampleRowParams, then the LogitMod entries
  Scratch sample_work;   ///< processed logits [n_logits, V] of rows with logit modifications
  std::vector<GreedyRow> picks_host;

  /// Sizes the scratch for T tokens and n_logits rows (so a captured step never reallocates).
  void reserve(int64_t T, int64_t H, int64_t V, int64_t n_logits);
  /// hidden [T, H] fp32 = embedding rows of meta.input_ids.
  void embed(const StepMeta& m, int64_t T, int64_t H, float* hidden, cudaStream_t s);
  /// Enqueues device logits [n_logits, V] = lm_head(rms_norm(hidden + last_out)) on the requested rows (the
  /// final norm runs on those rows only; hidden is not modified). residual_scale / out_scale: the last sublayer's
  /// scaled residual, hidden * residual_scale + last_out * out_scale (add_rms_norm_rows), when it is left pending.
  void enqueue_head(const StepMeta& m, int64_t T, int64_t H, int64_t V, float eps, const float* last_out,
                    float* hidden, int64_t n_logits, GemmHandle& gemm, cudaStream_t s, float residual_scale = 1.0f,
                    float out_scale = 1.0f);
  /// Copies the logits to the host and waits for the stream (the step's one synchronization).
  void download(int64_t n_logits, int64_t V, float* logits_host, cudaStream_t s);
  /// Enqueues the greedy pick of every logits row (kernels/cuda/sampling.h) after enqueue_head, into picks rows
  /// [row0, row0 + n_logits); with feed, each pick also into the next step's input ids (GreedyFeed).
  void enqueue_greedy(int64_t n_logits, int64_t V, int num_top, cudaStream_t s, int64_t row0 = 0,
                      const GreedyFeed* feed = nullptr);
  /// Copies the n_logits GreedyRow picks to picks_host and waits for the stream (shared by the two downloads).
  void fetch_picks(int64_t n_logits, cudaStream_t s);
  /// Copies the picks to the host (waiting for the stream) into out [n_logits].
  void download_greedy(int64_t n_logits, int num_top, std::vector<GreedyPick>& out, cudaStream_t s);
  /// Uploads `sample` and enqueues the full device sampling of every logits row (kernels/cuda/sampling.h
  /// sample_rows) after enqueue_head; not part of a captured graph (its inputs change every step).
  void enqueue_sample(int64_t n_logits, int64_t V, const DeviceSampleBatch& sample, cudaStream_t s);
  /// Copies the picks to the host (waiting for the stream) into out [n_logits]; rows left to the host
  /// (kPickOnHost) get their raw logits row in out[i].logits.
  void download_sample(int64_t n_logits, int64_t V, const DeviceSampleBatch& sample, std::vector<GreedyPick>& out,
                       cudaStream_t s);
  /// Device pointers the enqueued work depends on (for DecodeGraphs signatures).
  void pointers(std::vector<const void*>& out) const;
};

/// CUDA graphs for decode-only steps (issue 7 step 4): a step's device work, keyed by its shape, is run eagerly
/// the first time (module loading, cuBLASLt heuristics), captured the second time, and replayed after that.
/// A graph is dropped when the device pointers it baked in change (signature). Outputs equal the eager path
/// bit for bit (the same kernels with the same arguments).
class DecodeGraphs {
 public:
  explicit DecodeGraphs(size_t max_graphs = 64) : max_graphs_(max_graphs) {}
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  /// Enqueues `body` (device work only: no allocation, no host synchronization) on `s` for step shape `key`
  /// whose baked-in device pointers hash to `signature`.
  void run(cudaStream_t s, uint64_t key, uint64_t signature, const std::function<void()>& body) { run(s, {key, 0}, signature, body); }
  /// Same, with a two-part key (the step shape, and what else its captured work depends on: e.g. the KV block-table
  /// width of a hybrid's decode work list).
  void run(cudaStream_t s, std::pair<uint64_t, uint64_t> key, uint64_t signature, const std::function<void()>& body);
  int64_t replays() const { return replays_; }
  int64_t captures() const { return captures_; }
  /// Brackets the n-th replay (1-based; 0: none) with cudaProfilerStart / cudaProfilerStop and a stream synchronize,
  /// so a profiler started with its capture range off (`ncu --profile-from-start off`) records one decode step's
  /// kernels, each graph node as its own kernel (SSMSERVE_PROFILE_REPLAY, docs/environment.md).
  void set_profile_replay(int64_t n) { profile_replay_ = n; }

 private:
  struct Entry {
    cudaGraphExec_t exec = nullptr;
    uint64_t signature = 0;
    bool seen = false;
    bool failed = false;  // capture refused: eager for good
  };
  size_t max_graphs_;
  std::map<std::pair<uint64_t, uint64_t>, Entry> graphs_;
  int64_t replays_ = 0, captures_ = 0;
  int64_t profile_replay_ = 0;
};

/// DecodeGraphs key of a step: T tokens, n_logits rows, and the output mode (-1: logits; k >= 0: greedy picks
/// with k top log-probabilities); tp_gather: a tensor-parallel rank's step that all-gathers the logits on the device
/// (device picks).
inline uint64_t step_key(int64_t T, int64_t n_logits, int greedy_top, bool tp_gather = false) {
  return (static_cast<uint64_t>(T) << 32) | (static_cast<uint64_t>(tp_gather) << 31) |
         (static_cast<uint64_t>(greedy_top + 1) << 24) | static_cast<uint64_t>(n_logits & 0xffffff);
}

/// FNV-1a hash of a pointer list.
uint64_t pointer_signature(const std::vector<const void*>& ptrs);

class DeviceStateMirror;  // runtime/device_state.h
struct RunnerTp;          // runtime/tp_runner.h

/// What a GPU runner hands the shared step frame (run_step): its pieces and its two per-model hooks.
struct StepFrameArgs {
  const char* arch = "";  ///< model family for error messages ("Mamba", "Mamba2")
  int num_layers = 0;        ///< layers (sublayers) the mixer hook runs
  int num_state_layers = -1; ///< the pool's layer count the batch is checked against (-1: num_layers)
  int64_t hidden_size = 0, vocab_size = 0;
  float eps = 0.0f;       ///< the final RMSNorm's epsilon
  bool cuda_graphs = true;
  int num_steps = 1;      ///< multi-step decode (CausalLM::forward_greedy_steps): decode steps per call
  LmFrame* frame = nullptr;
  StepMetaUploader* meta = nullptr;
  DecodeGraphs* graphs = nullptr;
  DeviceStateMirror* states = nullptr;
  RunnerTp* tp = nullptr;
  GemmHandle* gemm = nullptr;
  Scratch* hidden = nullptr;  ///< [T, H] fp32 residual stream
  Scratch* out = nullptr;     ///< [T, H] fp32 last mixer output
  std::vector<const Scratch*> scratch;  ///< every scratch buffer the mixers use (decode graphs' signature)
  /// Further device pointers a captured step bakes in (called after reserve; may be empty).
  std::function<void(std::vector<const void*>& out)> pointers;
  uint64_t key_extra = 0;  ///< what else the captured work depends on besides the step shape (DecodeGraphs key)
  /// Whether steps with speculative verify rows may be captured: their work depends only on the step shape, the
  /// row count and the state columns (false when a layer's plan depends on the rows' lengths, e.g. attention).
  bool capture_verify = true;
  /// True when the last layer's output is still to be added to the residual (the LM head's norm adds `out`); false
  /// when the last layer applied its residual itself.
  bool last_out_pending = true;
  /// The pending last output's residual rule, hidden * last_out_alpha + out * last_out_beta (a scaled residual left to
  /// the LM head's norm: CudaModelOptions::fuse_scaled_residual); 1, 1 for the plain sum.
  float last_out_alpha = 1.0f, last_out_beta = 1.0f;
  std::function<void(int64_t T, int64_t n_logits)> reserve;  ///< sizes the runner's scratch
  std::function<void(int layer, const StepMeta& meta, int64_t T)> mixer;  ///< enqueues one layer (sublayer)
};

/// One step of a GPU runner (the frame both runners shared line for line): checks the batch against the cache,
/// the token ids and logits rows against the vocabulary / T (Error otherwise), syncs the state mirror's layout,
/// reserves the scratch, uploads the metadata once, enqueues embedding -> mixers -> final norm -> LM head
/// (-> greedy picks when greedy_top >= 0) on `s` (decode-only steps through a CUDA graph keyed by shape), and
/// returns the logits [n_logits, V] into `logits` or the picks into *picks (tensor parallel: all-gathered).
/// sample (non-null, greedy_top = -1): the logits rows are sampled on the device after the (graph) step and the
/// picks returned into *picks (LmFrame::enqueue_sample).
/// a.num_steps > 1 (greedy_top >= 0, a decode-only batch, Error otherwise): the step runs a.num_steps times in one
/// graph, each step's picks fed into the next step's input ids on the device (GreedyFeed); *picks gets
/// [num_steps, n_logits] step-major.
void run_step(const StepFrameArgs& a, const ForwardBatch& batch, StateCache& cache, cudaStream_t s, float* logits,
              int greedy_top, std::vector<GreedyPick>* picks, const DeviceSampleBatch* sample = nullptr);

/// The CausalLM forward entry points of a GPU runner, written once over its step: forward (logits),
/// forward_greedy (greedy picks on the device) and forward_sample (full sampling on the device). A runner derives
/// from it and says only what differs: its step (a tensor-parallel rank's all-gathers the logits slices, so every
/// rank picks from whole rows) and whether it has a device greedy path at all (without one forward_greedy returns
/// false, CausalLM's default).
class CudaCausalLM : public CausalLM {
 public:
  /// Speculative verify rows run on the device decode kernels (kernels/cuda/device_decode_rows.h), on one GPU and
  /// on tensor-parallel ranks alike: every rank runs the same verify rows on its head / channel shard with its shard
  /// of every state column, the row-parallel all-reduces sum every token row, and the logits all-gather (host or
  /// device picks) covers every verify position.
  bool supports_speculative_decoding() const override { return true; }
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;
  /// Error when num_top is outside [0, kMaxDeviceGreedyTop] (on a runner with a device greedy path).
  bool forward_greedy(const ForwardBatch& batch, StateCache& cache, int num_top, std::vector<GreedyPick>& out) override;
  bool forward_sample(const ForwardBatch& batch, StateCache& cache, const DeviceSampleBatch& sample,
                      std::vector<GreedyPick>& out) override;

 protected:
  /// One step: the logits [n_logits, V] fp32 into `logits` (greedy_top < 0, sample null), greedy picks with
  /// greedy_top top log-probabilities into *picks (greedy_top >= 0), or the rows sampled on the device with
  /// *sample into *picks (sample non-null, greedy_top = -1); see run_step.
  virtual void step(const ForwardBatch& batch, StateCache& cache, float* logits, int greedy_top,
                    std::vector<GreedyPick>* picks, const DeviceSampleBatch* sample) = 0;
  /// False when the runner has no device greedy path (the engine then samples through forward_sample / forward).
  virtual bool device_greedy() const { return true; }

 public:
  /// Multi-step decode on the device (StepFrameArgs::num_steps): false without a device greedy path. Error when
  /// num_top is outside [0, kMaxDeviceGreedyTop], num_steps < 1, or the batch is not decode-only.
  bool forward_greedy_steps(const ForwardBatch& batch, StateCache& cache, int num_top, int num_steps,
                            std::vector<GreedyPick>& out) override;

 protected:
  int num_steps_ = 1;  ///< the step() in flight runs this many decode steps (runners copy it into StepFrameArgs)
};

}  // namespace ssmserve::cuda
