// Owns softmax attention over the paged KV cache on the GPU (the CUDA counterpart of kernels/cpu/paged_attention.h and
// kernels/cpu/rope.h, same cache layout: a KV block is one page of the shared pool holding, per softmax layer, K then V
// for block_size tokens, each [block_size, num_kv_heads, head_dim] fp32): RoPE (neox / rotate_half), reshape_and_cache,
// and causal GQA attention for prefill and decode rows with one code path. Attention is a split-KV FlashAttention-style
// pass in fp32 (online softmax per split of key_split keys, then a combine in split order), so long contexts spread
// over the whole GPU; a query tile of up to 16 query heads x tokens of one KV head shares every key / value load. Tasks
// of one query token (decode rows, in a decode or a prefill plan) go through a decode kernel that streams K / V from
// the cache with 16-byte register loads, no shared-memory staging (issue 31: near HBM bandwidth at long contexts;
// KernelTuning::attn_decode_kernel, groups up to 8); with fixed splits (batch-invariant mode) every task does, one
// block per token, so a query's arithmetic never depends on its tile. Prefill rows of 16+ new tokens can go through a
// tensor-core pass instead (paged_attention_tc: bf16 operands, mma.sync, fp32 online softmax; the runner's choice with
// bf16 weights). The tensor-core pass walks each tile's keys in chunks (tc_chunk_keys: a function of the row's own
// seq_len only) and merges the chunks in order, so its result does not depend on whether a step runs the chunks in one
// block or splits them over blocks (tc_items, a combine kernel): long cached contexts behind a short prefill fill the
// GPU, and a row's bits stay the same alone or in any batch.
// Framework-free: device pointers, sizes, row strides (elements), a stream; each
// returns the launch status (cudaErrorInvalidValue for bad sizes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cache/kv_cache.h"

namespace ssmserve::cuda {

/// Keys per split of the split-KV pass. A step's key_split is chosen so its work list has about kFillItems items
/// (tasks x splits: decode at batch 1 over 2k keys makes 64 splits of 32 keys, not 4 blocks of 512 walking their keys
/// one chunk after another), between kMinKeySplit and kKeySplit keys; a plan with at least kManyTasks tasks has
/// parallelism enough and uses one split per task (no combine traffic, small workspace). Batch-invariant mode
/// (fixed_split) keeps kKeySplit, so a query's splits depend on nothing but its own position.
inline constexpr int kKeySplit = 512;
inline constexpr int kMinKeySplit = 32;
inline constexpr int kFillItems = 256;
inline constexpr int kManyTasks = 2048;

/// The fill rule above: keys per split for `tasks` tasks whose longest context is `longest` keys (a multiple of 32
/// in [kMinKeySplit, kKeySplit]); fill_items: the items aimed at (kFillItems; the plans pass
/// KernelTuning::attn_fill_items).
constexpr int fill_key_split(int64_t tasks, int64_t longest, int64_t fill_items = kFillItems) {
  const int64_t t = tasks < 1 ? 1 : tasks, per_task = ((fill_items < 1 ? 1 : fill_items) + t - 1) / t;
  const int64_t ks = ((longest + per_task - 1) / per_task + 31) / 32 * 32;
  return static_cast<int>(ks < kMinKeySplit ? kMinKeySplit : ks > kKeySplit ? kKeySplit : ks);
}

/// Tensor-core pass: query rows per tile (tokens x the KV head's query heads) and key chunking. A tile's keys
/// [0, last] are walked in chunks of tc_chunk_keys(seq_len) keys (a multiple of 64: at least kTcChunkKeys, at most
/// kTcMaxChunks chunks per row), each with its own online softmax, merged in chunk order (a context of one chunk gives
/// exactly the unchunked pass). When some tile of a step has two or more chunks, those chunks get their own blocks
/// (PagedAttentionPlan::tc_items), each writing a partial to a workspace slot, while the step's slots stay within
/// kTcSplitMaxItems (tiles in order; a tile past that walks its chunks in one block), and a combine kernel merges them
/// in the same order with the same arithmetic: bit-identical to one block per tile.
inline constexpr int kTcRows = 128;
inline constexpr int kTcChunkKeys = 1024;
inline constexpr int kTcMaxChunks = 16;
inline constexpr int kTcSplitMaxItems = 256;

/// Keys per chunk of the tensor-core pass for a row of seq_len keys: max(kTcChunkKeys, ceil(seq_len / kTcMaxChunks)
/// rounded up to 64). Depends on nothing but seq_len (batch-invariant).
__host__ __device__ constexpr int tc_chunk_keys(int seq_len) {
  const int c = ((seq_len + kTcMaxChunks - 1) / kTcMaxChunks + 63) / 64 * 64;
  return c > kTcChunkKeys ? c : kTcChunkKeys;
}

/// Rotates the first 2 * half dims of every head in place (cpu::apply_rope): x: [T, num_heads * head_dim] fp32,
/// row stride x_stride; positions: [T] (device); inv_freq: [half] (device, cpu::rope_inv_freq).
cudaError_t apply_rope(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, const int32_t* positions,
                       const float* inv_freq, int half, cudaStream_t stream);

/// Writes each token's K and V rows ([T, num_kv_heads * head_dim] fp32, row strides k_stride / v_stride) into its
/// cache slot (slot_mapping [T] device: block * block_size + offset, -1 = skip). pdl: Programmatic Dependent Launch
/// (pdl.cuh; the kernel waits on its predecessor in every block, then lets its successor launch).
cudaError_t reshape_and_cache(const float* k, int64_t k_stride, const float* v, int64_t v_stride, int64_t T,
                              const int32_t* slot_mapping, const KvCacheView& cache, cudaStream_t stream, bool pdl = false);

/// The attention projections' per-token epilogue in one launch instead of three (head_rms_norm_qk, apply_rope over
/// the q and k heads, reshape_and_cache), each element with that op's arithmetic: x [T, (num_heads + 2 K) D] fp32
/// = [q heads (num_heads) | k heads (K) | v heads (K)] per token, row stride x_stride (K = cache.num_kv_heads, D =
/// cache.head_dim, 2..1024). In order: q and k heads RMS-normed in place with q_weight / k_weight ([D] fp32 device;
/// q_weight null: no norm; D even when normed); their first 2 * half dims rotated at positions [T] (device) with
/// inv_freq [half] (device; null: no RoPE); each token's k and v written into its cache slot (slot_mapping [T]
/// device: block * block_size + offset, -1 = skip). Returns cudaErrorInvalidValue for bad sizes or missing pointers.
/// pdl: Programmatic Dependent Launch (pdl.cuh; the kernel waits on its predecessor in every block first).
cudaError_t qk_norm_rope_cache(float* x, int64_t x_stride, int64_t T, int num_heads, const float* q_weight,
                               const float* k_weight, float eps, const int32_t* positions, const float* inv_freq, int half,
                               const int32_t* slot_mapping, const KvCacheView& cache, cudaStream_t stream,
                               bool pdl = false);

/// The attention pass's work list, built on the host from the step's metadata (PagedAttentionMetadata's
/// query_start_loc and seq_lens): tasks = (row, first token, tokens) tiles of one row; items = (task, split).
struct PagedAttentionPlan {
  int num_tasks = 0, num_items = 0, tokens_per_task = 0;
  int num_single_tasks = 0;    ///< tasks of one token (decode rows): the decode partial kernel's
  /// Built with fixed_split (batch-invariant mode): every task's queries go through the decode partial kernel, one
  /// block per token, so a query's bits depend neither on its task's other tokens (how a prompt was chunked) nor on
  /// the plan kind.
  bool fixed_split = false;
  int key_split = kKeySplit;   ///< keys per split (a multiple of 32)
  std::vector<int32_t> tasks;  ///< [num_tasks, 4] row, first token, tokens, first item
  std::vector<int32_t> items;  ///< [num_items, 2] task, split
  int num_tc_tiles = 0, tc_tokens = 0;
  std::vector<int32_t> tc_tiles;  ///< [num_tc_tiles, 3] row, first token, tokens: the tensor-core pass's tiles
  /// [num_tc_items, 3] tile, chunk, workspace slot: the tensor-core pass's blocks when some tile has several chunks
  /// (else empty: one block per tile). Tiles in order; a split tile's chunks 0 .. n - 1 with slots s .. s + n - 1 are
  /// contiguous; (tile, 0, -1) a tile of one chunk, (tile, -1, -1) one walking all its chunks (over the slot budget).
  int num_tc_items = 0, num_tc_slots = 0;
  std::vector<int32_t> tc_items;
  /// The tensor-core rows' keys staged as bf16 (tc_stage_floats, paged_attention_tc): tc_row_key_base [rows] = the
  /// row's first key in the staging buffer (-1: no tensor-core tiles), tc_stage_rows [num_tc_stage_rows] those rows,
  /// tc_stage_keys their seq_lens' sum, tc_stage_max_keys the longest.
  std::vector<int32_t> tc_row_key_base, tc_stage_rows;
  int num_tc_stage_rows = 0;
  int64_t tc_stage_keys = 0;
  int tc_stage_max_keys = 0;
  /// Every row's tokens in tiles of max(1, 16 / group) tokens; a tile of last position p gets ceil((p + 1) /
  /// key_split) splits (key_split: kKeySplit with fixed_split; else the longest context when there are kManyTasks
  /// tasks or more, else fill_key_split). A query's result depends only on its own position and keys when the
  /// splits are fixed (the split-KV pass adds a masked key as an exact zero, and a split with no key of the query
  /// has weight zero), which is what batch-invariant mode needs: fixed_split and tc_min_tokens 0.
  /// Rows with seq_len 0 get tiles with one split (zeros). Rows with at least tc_min_tokens new tokens
  /// (tc_min_tokens > 0) go to the tensor-core pass instead: tiles of kTcRows / group tokens (tc_tiles), tiles of several
  /// key chunks split over blocks (tc_items) up to kTcSplitMaxItems workspace slots. Throws Error on malformed spans.
  static PagedAttentionPlan build(std::span<const int32_t> query_start_loc, std::span<const int32_t> seq_lens,
                                  int group, int tc_min_tokens = 0, bool fixed_split = false);
  /// Decode rows (one token each) with room for contexts up to max_context: fixed size, so a CUDA graph can be
  /// replayed with other seq_lens / block tables (splits past a row's context do nothing). key_split:
  /// fill_key_split(batch, max_context, KernelTuning::attn_fill_items), or kKeySplit with fixed_split.
  static PagedAttentionPlan decode(int batch, int max_context, int group, bool fixed_split = false);
};

/// Device arrays of one attention call.
struct PagedAttentionArgs {
  int num_heads = 0;  ///< query heads (a multiple of the cache's num_kv_heads; group = num_heads / num_kv_heads <= 16)
  float scale = 0.0f;
  int max_blocks = 0;                        ///< columns of block_tables
  const int32_t* query_start_loc = nullptr;  ///< [rows + 1]
  const int32_t* seq_lens = nullptr;         ///< [rows] context incl. this step's tokens (0 = padding: zeros)
  const int32_t* block_tables = nullptr;     ///< [rows, max_blocks]
  const int32_t* tasks = nullptr;            ///< plan.tasks
  const int32_t* items = nullptr;            ///< plan.items
  int num_tasks = 0, num_items = 0, tokens_per_task = 0;
  int key_split = kKeySplit;  ///< plan.key_split
  const int32_t* tc_tiles = nullptr;  ///< plan.tc_tiles
  int num_tc_tiles = 0, tc_tokens = 0;
  const int32_t* tc_items = nullptr;  ///< plan.tc_items (null when num_tc_items is 0)
  int num_tc_items = 0;
  /// plan.num_single_tasks; -1 (unknown): both split-KV partial kernels are launched, each taking its own tasks.
  int num_single_tasks = -1;
  bool fixed_split = false;  ///< plan.fixed_split
  /// Staged keys (tc_stage_floats > 0, else null: the pass reads the fp32 cache): plan.tc_row_key_base,
  /// plan.tc_stage_rows and the sizes, the pass's workspace then followed by the bf16 K / V (paged_attention_tc).
  const int32_t* tc_row_key_base = nullptr;
  const int32_t* tc_stage_rows = nullptr;
  int num_tc_stage_rows = 0, tc_stage_max_keys = 0;
  int64_t tc_stage_keys = 0;
  int num_tc_slots = 0;  ///< plan.num_tc_slots (where the staged K / V start in the pass's workspace)
  /// With staged keys at head_dim 128 / 256: the tiles on the warpgroup kernel (sm_90a wgmma, paged_attention_tc_wg.cu)
  /// instead of the mma.sync one (within bf16 rounding of it; each row's bits still its own).
  bool tc_wgmma = false;
  /// Optional bf16 copy of out ([tokens, num_heads * head_dim], row stride out_bf16_stride: o_proj's input), each value
  /// the bf16 rounding of the fp32 one (cast_rows' store), written by the split-KV combine in the same launch; only for
  /// plans without tensor-core tiles (decode steps), else cudaErrorInvalidValue.
  void* out_bf16 = nullptr;
  int64_t out_bf16_stride = 0;
};

/// Workspace floats paged_attention needs for a plan: num_items * num_kv_heads * 16 * (head_dim + 2).
inline size_t paged_attention_workspace_floats(int num_items, int num_kv_heads, int head_dim) {
  return static_cast<size_t>(num_items) * num_kv_heads * 16 * (head_dim + 2);
}

/// Workspace floats paged_attention needs for a plan with both passes: the split-KV pass's (above) followed by the
/// tensor-core pass's chunk partials, num_tc_slots * num_kv_heads * kTcRows * (head_dim + 2) (at most
/// kTcSplitMaxItems slots: 136 MB at 8 KV heads of 128 or 4 of 256).
inline size_t paged_attention_workspace_floats(const PagedAttentionPlan& plan, int num_kv_heads, int head_dim) {
  return paged_attention_workspace_floats(plan.num_items, num_kv_heads, head_dim) +
         static_cast<size_t>(plan.num_tc_slots) * num_kv_heads * kTcRows * (head_dim + 2);
}

/// The tensor-core pass's staged keys at most (bytes): above, a step's rows read the fp32 cache (the same bits).
inline constexpr int64_t kTcStageMaxBytes = int64_t{512} << 20;

/// Floats of the tensor-core rows' K and V as bf16 (tc_stage_keys x num_kv_heads x head_dim x 2 bf16), or 0 when the
/// pass reads the fp32 cache instead: stage false, no staged keys, over kTcStageMaxBytes or over 65535 staged rows
/// (the staging kernel's grid). Staging converts each
/// key once per step and layer instead of once per 128-row tile (the conversion the pass does anyway: same bits) and
/// halves the bytes every tile streams.
inline size_t tc_stage_floats(const PagedAttentionPlan& plan, int num_kv_heads, int head_dim, bool stage) {
  const int64_t f = plan.tc_stage_keys * num_kv_heads * head_dim;
  return stage && f > 0 && 4 * f <= kTcStageMaxBytes && plan.num_tc_stage_rows <= 65535 ? static_cast<size_t>(f) : 0;
}

/// Head sizes the attention passes are built for (64, 128; 256 for Qwen3-Next / Qwen3.5, whose tiles live in dynamic
/// shared memory above the 48 KB static limit: 82 KB per split-KV block, 197 KB per tensor-core block).
constexpr bool paged_attention_head_dim_ok(int head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

/// Head sizes the tensor-core pass's warpgroup tile kernel serves (PagedAttentionArgs::tc_wgmma: whole 128-column
/// output halves); others take the mma.sync tiles.
constexpr bool tc_wgmma_head_dim_ok(int head_dim) { return head_dim == 128 || head_dim == 256; }

/// Prefill rows are best served by the tensor-core pass: rows with at least this many new tokens use it when the
/// caller opts in (bf16 operands: scores and values rounded to bf16, fp32 softmax and accumulation).
inline constexpr int kTcMinTokens = 16;

/// Causal attention (cpu::paged_attention): q [T, num_heads * head_dim] (row stride q_stride) -> out (row stride
/// out_stride), keys / values read from `cache` (already holding this step's tokens). head_dim 64, 128 or 256
/// (paged_attention_head_dim_ok).
/// The split-KV fp32 pass runs the plan's tasks, the tensor-core pass (paged_attention_tc) its tc_tiles (tc_items).
/// workspace: paged_attention_workspace_floats(plan, ...) floats. pdl: the split-KV pass's kernels (partial, decode
/// partial, combine) launched with Programmatic Dependent Launch (pdl.cuh); the tensor-core pass stays a plain launch.
cudaError_t paged_attention(const float* q, int64_t q_stride, float* out, int64_t out_stride, const KvCacheView& cache,
                            const PagedAttentionArgs& a, float* workspace, cudaStream_t stream, bool pdl = false);

/// The tensor-core pass alone (paged_attention_tc.cu): FlashAttention-2 style, one 8-warp block per (tile, KV
/// head) over kTcRows = 128 query rows (tokens x the KV head's query heads; 16 per warp) and 64-key tiles; q / K / V
/// rounded to bf16, mma.sync m16n8k16, fp32 online softmax per key chunk, chunks merged in order. Keys either
/// straight from the paged fp32 cache, fetched with cp.async one tile half ahead (a tile's V during Q K^T, the next K
/// during P V) through an fp32 staging tile, or (a.tc_row_key_base set) first converted once per call into bf16
/// planes K [num_kv_heads][tc_stage_keys][head_dim] then V alike (workspace + the partial slots), from which whole
/// K / V tiles are fetched a tile ahead into double buffers: the same bf16 operands and arithmetic, so the same bits.
/// With a.num_tc_items > 0 one block per (item, KV head) and a combine kernel; workspace then holds the plan's
/// num_tc_slots * num_kv_heads * kTcRows * (head_dim + 2) floats (cudaErrorInvalidValue when null), then the staged
/// keys' tc_stage_floats. q_stride a multiple of 4, out_stride of 2; a.tc_tokens * group <= kTcRows.
cudaError_t paged_attention_tc(const float* q, int64_t q_stride, float* out, int64_t out_stride, const KvCacheView& cache,
                               const PagedAttentionArgs& a, cudaStream_t stream, float* workspace = nullptr);

}  // namespace ssmserve::cuda
