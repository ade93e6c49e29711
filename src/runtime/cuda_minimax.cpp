// Owns the MiniMax GPU runner (see cuda_minimax.h): per layer
//   x^ = RMSNorm(x); h = alpha x^ + beta Attn(x^); h^ = RMSNorm(h); x' = alpha h^ + beta MoE(h^)
// as model/archs/minimax.cpp, with lightning attention (kernels/cuda/lightning.h) on this layer's part of each
// state page, softmax attention (kernels/cuda/paged_attention.h) on the KV blocks of the same pool, and the MoE
// block (kernels/cuda/moe.h; the router GEMM in fp32 so expert choices match the CPU's). Dense projections go
// through cuBLASLt in the weight dtype.
#include "runtime/cuda_minimax.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/minimax_ops.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norms.h"
#include "kernels/cuda/paged_attention.h"
#include "model/archs/minimax.h"
#include "model/checkpoint.h"
#include "model/lm_common.h"
#include "model/weight_source.h"
#include "runtime/device_state.h"
#include "runtime/runner_common.h"

namespace ssmserve::cuda {
namespace {

/// One decoder layer on the device.
struct MiniMaxLayerDev {
  bool is_linear = true;
  int index = 0;  ///< position among the lightning (or softmax) layers: state / KV page offset
  DeviceBuffer input_norm, post_norm;
  // Lightning: qkv_proj [3HD, Hd], output_gate [HD, Hd], out_proj [Hd, HD], norm [HD], slopes [H].
  DevWeight qkv_proj, output_gate, out_proj;
  DeviceBuffer norm, slopes;
  // Softmax: q/k/v/o projections.
  DevWeight q_proj, k_proj, v_proj, o_proj;
  // MoE: router [E, Hd] fp32, stacked experts (bf16).
  DevWeight gate;
  DeviceBuffer w1, w3, w2;
};

/// Stacks E expert matrices [rows, cols] into one bf16 device buffer [E, rows, cols].
DeviceBuffer stack_bf16(const std::vector<Weight>& ws) {
  const size_t n = static_cast<size_t>(ws[0].rows * ws[0].cols);
  std::vector<uint16_t> h(n * ws.size());
  std::vector<float> f(n);
  for (size_t e = 0; e < ws.size(); ++e) {
    if (ws[e].dtype == DType::BF16) {
      std::memcpy(h.data() + e * n, ws[e].data, n * 2);
    } else {
      to_f32(ws[e].dtype, ws[e].data, f.data(), n);
      for (size_t i = 0; i < n; ++i) h[e * n + i] = f32_to_bf16(f[i]);
    }
  }
  return to_device(h);
}

/// Host-side packing of one step's metadata into a single int32 array (offsets in elements).
struct MetaLayout {
  size_t lin_idx, lin_qsl, lin_nc, blocks, seq_first, qtiles, ranges, seq_first_range, block_range;  // lightning
  size_t tables, seq_lens, attn_qsl, slots, positions, tasks, items, tc_tiles;  // softmax attention
};

class CudaMiniMaxModel final : public CudaCausalLM {
 public:
  CudaMiniMaxModel(ModelConfig cfg, MiniMaxConfig m, CudaModelOptions opt) : cfg_(std::move(cfg)), m_(std::move(m)), opt_(opt) {
    const int64_t D = m_.head_dim;
    state_elems_ = static_cast<int64_t>(m_.num_linear_layers()) * m_.num_heads * D * D;
    const int64_t kv_token_bytes = static_cast<int64_t>(m_.num_full_layers()) * 2 * m_.num_kv_heads * D * 4;
    if (kv_token_bytes > 0)
      kv_block_size_ = static_cast<int>(std::max<int64_t>(1, state_elems_ > 0 ? state_elems_ * 4 / kv_token_bytes : 64));
    inv_freq_ = to_device(cpu::rope_inv_freq(m_.rope_theta, m_.head_dim));
  }

  /// Loads every parameter (names, shapes and dummy initializers of archs/minimax.cpp) and uploads it layer by
  /// layer, so the host holds one layer at a time.
  void load(WeightSource& src) {
    const int64_t Hd = cfg_.hidden_size, V = cfg_.vocab_size, D = m_.head_dim, HD = m_.num_heads * D,
                  KD = m_.num_kv_heads * D, I = m_.intermediate_size, E = m_.num_experts;
    const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), hd_scale = 1.0f / std::sqrt(static_cast<float>(HD)),
                i_scale = 1.0f / std::sqrt(static_cast<float>(I));
    const DType wd = opt_.weight_dtype;
    Weight emb = src.matrix("model.embed_tokens.weight", {V, Hd}, DummyInit::uniform(0.1f));
    frame_.embedding = upload_weight(emb, wd);
    int nlin = 0, nfull = 0;
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
      const std::string p = fmt::format("model.layers.{}.", l);
      MiniMaxLayerDev L;
      L.is_linear = m_.is_linear[l];
      L.input_norm = to_device(src.vector(p + "input_layernorm.weight", {Hd}, DummyInit::constant(1.0f)));
      L.post_norm = to_device(src.vector(p + "post_attention_layernorm.weight", {Hd}, DummyInit::constant(1.0f)));
      if (L.is_linear) {
        L.index = nlin++;
        L.qkv_proj = upload_weight(src.matrix(p + "self_attn.qkv_proj.weight", {3 * HD, Hd}, DummyInit::uniform(in_scale)), wd);
        L.output_gate = upload_weight(src.matrix(p + "self_attn.output_gate.weight", {HD, Hd}, DummyInit::uniform(in_scale)), wd);
        L.out_proj = upload_weight(src.matrix(p + "self_attn.out_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale)), wd);
        L.norm = to_device(src.vector(p + "self_attn.norm.weight", {HD}, DummyInit::constant(1.0f)));
        L.slopes = to_device(m_.slopes(l));
      } else {
        L.index = nfull++;
        L.q_proj = upload_weight(src.matrix(p + "self_attn.q_proj.weight", {HD, Hd}, DummyInit::uniform(in_scale)), wd);
        L.k_proj = upload_weight(src.matrix(p + "self_attn.k_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale)), wd);
        L.v_proj = upload_weight(src.matrix(p + "self_attn.v_proj.weight", {KD, Hd}, DummyInit::uniform(in_scale)), wd);
        L.o_proj = upload_weight(src.matrix(p + "self_attn.o_proj.weight", {Hd, HD}, DummyInit::uniform(hd_scale)), wd);
      }
      L.gate = upload_weight(src.matrix(p + "block_sparse_moe.gate.weight", {E, Hd}, DummyInit::uniform(in_scale)), DType::F32);
      std::vector<Weight> w1, w2, w3;
      for (int64_t e = 0; e < E; ++e) {
        const std::string q = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
        w1.push_back(src.matrix(q + "w1.weight", {I, Hd}, DummyInit::uniform(in_scale)));
        w2.push_back(src.matrix(q + "w2.weight", {Hd, I}, DummyInit::uniform(i_scale)));
        w3.push_back(src.matrix(q + "w3.weight", {I, Hd}, DummyInit::uniform(in_scale)));
      }
      L.w1 = stack_bf16(w1), L.w2 = stack_bf16(w2), L.w3 = stack_bf16(w3);
      layers_.push_back(std::move(L));
    }
    frame_.norm_f = to_device(src.vector("model.norm.weight", {Hd}, DummyInit::constant(1.0f)));
    frame_.tied = m_.tie_word_embeddings && !src.has("lm_head.weight");
    if (!frame_.tied) frame_.lm_head = upload_weight(src.matrix("lm_head.weight", {V, Hd}, DummyInit::uniform(0.1f)), wd);
  }

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return 1; }
  StateShape state_shape() const override {
    const int64_t kv_page = static_cast<int64_t>(kv_block_size_) * m_.num_full_layers() * 2 * m_.num_kv_heads * m_.head_dim * 4;
    return {0, state_elems_, kv_page};
  }
  int kv_block_size() const override { return kv_block_size_; }

 private:
  bool device_greedy() const override { return false; }  // greedy rows go through forward_sample
  /// One step: logits into `logits`, or (sample non-null) every logits row sampled on the device into *picks.
  void step(const ForwardBatch& batch, StateCache& cache, float* logits, int /*greedy_top: always -1*/,
            std::vector<GreedyPick>* picks, const DeviceSampleBatch* sample) override {
    check_batch_against_cache(batch, cache, num_state_layers(), "MiniMax");
    const LinearAttentionMetadata& lm = batch.linear_meta;
    const PagedAttentionMetadata& am = batch.attn_meta;
    const int B = batch.meta.num_reqs;
    SSM_CHECK(static_cast<int>(lm.state_indices_tensor.size()) == B && static_cast<int>(lm.query_start_loc.size()) == B + 1 &&
                  static_cast<int>(lm.num_computed_tokens.size()) == B,
              "MiniMax forward: the batch has no linear-attention metadata for its {} rows (build_attention_metadata)", B);
    for (int32_t b : lm.state_indices_tensor)
      SSM_CHECK(b >= 0 && b < cache.num_blocks(), "MiniMax forward: state index {} out of range", b);
    const int64_t T = batch.num_tokens(), H = cfg_.hidden_size, V = cfg_.vocab_size;
    if (m_.num_full_layers() > 0) {
      SSM_CHECK(am.block_size == kv_block_size_ && static_cast<int>(am.seq_lens.size()) == B &&
                    static_cast<int>(am.slot_mapping.size()) == T && static_cast<int>(am.positions.size()) == T &&
                    static_cast<int>(am.query_start_loc.size()) == B + 1 &&
                    static_cast<int64_t>(am.block_tables.size()) >= static_cast<int64_t>(B) * am.max_num_blocks_per_seq,
                "MiniMax forward: paged-attention metadata missing or for block size {} (model: {})", am.block_size, kv_block_size_);
      for (int32_t b : am.block_tables)
        SSM_CHECK(b >= 0 && b < cache.num_blocks(), "MiniMax forward: KV block {} out of range", b);
      for (int32_t s : am.slot_mapping)
        SSM_CHECK(s >= -1 && s < static_cast<int64_t>(cache.num_blocks()) * kv_block_size_, "MiniMax forward: slot {} out of range", s);
      for (int r = 0; r < B; ++r)
        SSM_CHECK((am.seq_lens[r] + kv_block_size_ - 1) / kv_block_size_ <= am.max_num_blocks_per_seq,
                  "MiniMax forward: row {} needs more than {} KV blocks", r, am.max_num_blocks_per_seq);
    }
    for (int32_t id : batch.input_ids) SSM_CHECK(id >= 0 && id < V, "token id {} outside the vocabulary [0, {})", id, V);
    const int64_t nlog = static_cast<int64_t>(batch.logits_indices.size());
    for (int32_t r : batch.logits_indices) SSM_CHECK(r >= 0 && r < T, "logits row {} outside [0, {})", r, T);
    if (T == 0) return;
    states_.sync_layout(cache);
    cudaStream_t s = stream_.get();
    const bool decode_only = lm.num_prefills == 0 && batch.meta.num_prefills == 0;
    pack_meta(batch, decode_only);
    reserve(T, nlog);
    const StepMeta sm = meta_.upload(batch, s);
    dmeta_buf_.get(hmeta_.size() * 4);
    SSM_CUDA_CHECK(cudaMemcpyAsync(dmeta_buf_.buf.data(), hmeta_.data(), hmeta_.size() * 4, cudaMemcpyHostToDevice, s));
    auto body = [&] {
      float* hidden = hidden_.f32(T * H);
      frame_.embed(sm, T, H, hidden, s);
      for (const MiniMaxLayerDev& L : layers_) layer(L, batch, cache, T);
      frame_.enqueue_head(sm, T, H, V, cfg_.layer_norm_epsilon, nullptr, hidden, nlog, gemm_, s);
    };
    if (opt_.cuda_graphs && decode_only) {
      std::vector<const void*> ptrs = {meta_.device_buffer(), dmeta_buf_.buf.data()};
      for (const Scratch* sc : {&hidden_, &normed_, &normed_c_, &proj_, &o_, &gate_, &gated_, &attn_, &router_, &moe_,
                                &lws_, &aws_, &mws_})
        ptrs.push_back(sc->buf.data());
      frame_.pointers(ptrs);
      states_.pointers(ptrs);
      const uint64_t key = (static_cast<uint64_t>(T) << 40) | (static_cast<uint64_t>(nlog) << 20) |
                           static_cast<uint64_t>(am.max_num_blocks_per_seq);
      graphs_.run(s, key, pointer_signature(ptrs), body);
    } else {
      body();
    }
    if (sample) {
      frame_.enqueue_sample(nlog, V, *sample, s);
      frame_.download_sample(nlog, V, *sample, *picks, s);
    } else {
      frame_.download(nlog, V, logits, s);
    }
  }

 private:
  /// Packs the lightning and attention metadata (and the work plans) of the step into hmeta_.
  void pack_meta(const ForwardBatch& batch, bool decode_only) {
    const LinearAttentionMetadata& lm = batch.linear_meta;
    const PagedAttentionMetadata& am = batch.attn_meta;
    const int nd = lm.num_decodes;
    hmeta_.clear();
    auto put = [&](const std::vector<int32_t>& v) {
      const size_t off = hmeta_.size();
      hmeta_.insert(hmeta_.end(), v.begin(), v.end());
      hmeta_.resize((hmeta_.size() + 3) / 4 * 4);  // 16-byte aligned parts
      return off;
    };
    lay_.lin_idx = put(lm.state_indices_tensor);
    lay_.lin_qsl = put(lm.query_start_loc);
    lay_.lin_nc = put(lm.num_computed_tokens);
    const auto qsl_p = std::span(lm.query_start_loc).subspan(nd);
    const int bpr = qsl_p.empty() ? 1 : LightningPlan::pick_blocks_per_range(qsl_p.back() - qsl_p.front(), m_.block_size, m_.num_heads);
    lplan_ = LightningPlan::build(qsl_p, std::span(lm.num_computed_tokens).subspan(nd), m_.block_size, bpr);
    lay_.blocks = put(lplan_.blocks);
    lay_.seq_first = put(lplan_.seq_first_block);
    lay_.qtiles = put(lplan_.qtiles);
    lay_.ranges = put(lplan_.ranges);
    lay_.seq_first_range = put(lplan_.seq_first_range);
    lay_.block_range = put(lplan_.block_range);
    if (m_.num_full_layers() > 0) {
      lay_.tables = put(am.block_tables);
      lay_.seq_lens = put(am.seq_lens);
      lay_.attn_qsl = put(am.query_start_loc);
      lay_.slots = put(am.slot_mapping);
      lay_.positions = put(am.positions);
      const int group = m_.num_heads / m_.num_kv_heads;
      aplan_ = decode_only ? PagedAttentionPlan::decode(batch.meta.num_reqs, std::max(1, am.max_num_blocks_per_seq * kv_block_size_), group)
                           : PagedAttentionPlan::build(am.query_start_loc, am.seq_lens, group, bf16_fast() ? kTcMinTokens : 0);
      lay_.tasks = put(aplan_.tasks);
      lay_.items = put(aplan_.items);
      lay_.tc_tiles = put(aplan_.tc_tiles);
    }
  }

  /// bf16 weights: the bf16 tensor-core prefill paths (lightning_prefill_bf16, paged_attention_tc); fp32
  /// weights keep the fp32-exact kernels.
  bool bf16_fast() const { return opt_.weight_dtype == DType::BF16; }

  const int32_t* dm(size_t off) const { return static_cast<const int32_t*>(dmeta_buf_.buf.data()) + off; }

  void reserve(int64_t T, int64_t nlog) {
    const int64_t Hd = cfg_.hidden_size, D = m_.head_dim, HD = m_.num_heads * D, KD = m_.num_kv_heads * D;
    const size_t ab = dtype_size(opt_.weight_dtype);
    const int64_t PW = std::max(3 * HD, HD + 2 * KD);
    hidden_.f32(T * Hd), normed_.f32(T * Hd), normed_c_.get(T * Hd * ab), proj_.f32(T * PW), o_.f32(T * HD);
    gate_.f32(T * HD), gated_.get(T * std::max<int64_t>(HD * ab, bf16_fast() ? 3 * HD * 2 : 0)), attn_.f32(T * Hd), router_.f32(T * m_.num_experts), moe_.f32(T * Hd);
    lws_.f32(std::max<size_t>(4, lightning_workspace_floats(lplan_.num_blocks, m_.num_heads, m_.head_dim)));
    aws_.f32(std::max<size_t>(4, paged_attention_workspace_floats(aplan_.num_items, m_.num_kv_heads, m_.head_dim)));
    mws_.get(moe_workspace_bytes(T, moe_weights(layers_.empty() ? nullptr : &layers_[0])));
    frame_.reserve(T, Hd, cfg_.vocab_size, nlog);
  }

  MoeDevWeights moe_weights(const MiniMaxLayerDev* L) const {
    return {m_.num_experts, m_.top_k, cfg_.hidden_size, m_.intermediate_size, L ? L->w1.data() : nullptr,
            L ? L->w3.data() : nullptr, L ? L->w2.data() : nullptr};
  }

  void gemm(const void* x, int64_t M, int64_t x_stride, const DevWeight& w, float* y, int64_t y_stride) {
    gemm_.run({M, w.rows, w.cols, x, x_stride, w.buf.data(), w.cols, w.dtype, y, y_stride, DType::F32}, stream_.get());
  }

  void layer(const MiniMaxLayerDev& L, const ForwardBatch& batch, StateCache& cache, int64_t T) {
    const int64_t Hd = cfg_.hidden_size;
    const DType wd = opt_.weight_dtype;
    cudaStream_t s = stream_.get();
    float* hidden = hidden_.f32(T * Hd);
    float* normed = normed_.f32(T * Hd);
    void* normed_c = normed_c_.get(T * Hd * dtype_size(wd));
    float* attn = attn_.f32(T * Hd);
    const float eps = cfg_.layer_norm_epsilon;
    // 1. x^ = RMSNorm(x) (fp32, and in the GEMM dtype); h = alpha x^ + beta Attn(x^).
    SSM_CUDA_CHECK(fused_add_rms_norm(nullptr, Hd, hidden, Hd, L.input_norm.as<float>(), eps, T, Hd, normed, DType::F32, Hd, s));
    SSM_CUDA_CHECK(cast_rows(normed, Hd, T, Hd, normed_c, wd, Hd, s));
    if (L.is_linear) lightning(L, batch, T, normed_c, attn);
    else softmax(L, batch, cache, T, normed_c, attn);
    const float a = L.is_linear ? m_.linear_alpha : m_.full_alpha, b = L.is_linear ? m_.linear_beta : m_.full_beta;
    SSM_CUDA_CHECK(scaled_residual(hidden, normed, a, attn, b, T * Hd, s));
    // 2. h^ = RMSNorm(h); x' = alpha h^ + beta MoE(h^) (router logits in fp32).
    SSM_CUDA_CHECK(fused_add_rms_norm(nullptr, Hd, hidden, Hd, L.post_norm.as<float>(), eps, T, Hd, normed, DType::F32, Hd, s));
    float* router = router_.f32(T * m_.num_experts);
    gemm(normed, T, Hd, L.gate, router, m_.num_experts);
    float* moe = moe_.f32(T * Hd);
    SSM_CUDA_CHECK(sparse_moe(normed, Hd, T, router, moe_weights(&L), moe, Hd, mws_.get(moe_workspace_bytes(T, moe_weights(&L))), s));
    SSM_CUDA_CHECK(scaled_residual(hidden, normed, m_.mlp_alpha, moe, m_.mlp_beta, T * Hd, s));
  }

  void lightning(const MiniMaxLayerDev& L, const ForwardBatch& batch, int64_t T, const void* normed_c, float* attn) {
    const LinearAttentionMetadata& md = batch.linear_meta;
    const int64_t Hd = cfg_.hidden_size, D = m_.head_dim, HD = m_.num_heads * D, W = 3 * HD;
    const DType wd = opt_.weight_dtype;
    cudaStream_t s = stream_.get();
    float* proj = proj_.f32(T * W);
    float* o = o_.f32(T * HD);
    // 1. qkv = SiLU(qkv_proj x^): [T, H, 3D].
    gemm(normed_c, T, Hd, L.qkv_proj, proj, W);
    SSM_CUDA_CHECK(silu_inplace(proj, W, T, W, s));
    // 2. Lightning attention on this layer's part of each state page.
    const StateView all = states_.ssm_state(0);
    LightningDevParams p{m_.num_heads, m_.head_dim, m_.block_size, L.slopes.as<float>(), all};
    p.states.data = static_cast<std::byte*>(all.data) + static_cast<int64_t>(L.index) * m_.num_heads * D * D * dtype_size(all.dtype);
    const int nd = md.num_decodes;
    if (nd > 0) SSM_CUDA_CHECK(lightning_decode(proj, W, o, HD, p, dm(lay_.lin_idx), nd, s));
    if (md.num_prefills > 0) {
      LightningPlanDev pd{lplan_.num_seqs, lplan_.num_blocks, lplan_.num_qtiles, dm(lay_.blocks), dm(lay_.seq_first),
                          dm(lay_.qtiles), dm(lay_.lin_idx) + nd, dm(lay_.lin_nc) + nd, lplan_.num_ranges,
                          dm(lay_.ranges), dm(lay_.seq_first_range), dm(lay_.block_range)};
      float* ws = lws_.f32(lightning_workspace_floats(lplan_.num_blocks, m_.num_heads, m_.head_dim));
      if (bf16_fast()) {  // the prefill rows' q | k | v as bf16 (rows keep their absolute index), bf16 tensor-core path
        auto* qkv16 = static_cast<__nv_bfloat16*>(gated_.get(T * W * 2));
        SSM_CUDA_CHECK(cast_rows(proj + nd * W, W, T - nd, W, qkv16 + nd * W, DType::BF16, W, s));
        SSM_CUDA_CHECK(lightning_prefill_bf16(qkv16, W, o, HD, p, pd, ws, s));
      } else {
        SSM_CUDA_CHECK(lightning_prefill(proj, W, o, HD, p, pd, ws, s));
      }
    }
    // 3. RMSNorm over all heads (eps 1e-6), sigmoid gate from x^, out_proj.
    SSM_CUDA_CHECK(fused_add_rms_norm(nullptr, HD, o, HD, L.norm.as<float>(), 1e-6f, T, HD, o, DType::F32, HD, s));
    float* g = gate_.f32(T * HD);
    gemm(normed_c, T, Hd, L.output_gate, g, HD);
    void* gated = gated_.get(T * HD * dtype_size(wd));
    SSM_CUDA_CHECK(sigmoid_gate(o, HD, g, HD, T, HD, gated, wd, HD, s));
    gemm(gated, T, HD, L.out_proj, attn, Hd);
  }

  void softmax(const MiniMaxLayerDev& L, const ForwardBatch& batch, StateCache& cache, int64_t T, const void* normed_c,
               float* attn) {
    const PagedAttentionMetadata& md = batch.attn_meta;
    const int D = m_.head_dim;
    const int64_t Hd = cfg_.hidden_size, QW = static_cast<int64_t>(m_.num_heads) * D, KW = static_cast<int64_t>(m_.num_kv_heads) * D;
    const DType wd = opt_.weight_dtype;
    cudaStream_t s = stream_.get();
    float* q = proj_.f32(T * (QW + 2 * KW));
    float* k = q + T * QW;
    float* v = k + T * KW;
    float* o = o_.f32(T * QW);
    gemm(normed_c, T, Hd, L.q_proj, q, QW);
    gemm(normed_c, T, Hd, L.k_proj, k, KW);
    gemm(normed_c, T, Hd, L.v_proj, v, KW);
    SSM_CUDA_CHECK(apply_rope(q, QW, T, m_.num_heads, D, dm(lay_.positions), inv_freq_.as<float>(), D / 2, s));
    SSM_CUDA_CHECK(apply_rope(k, KW, T, m_.num_kv_heads, D, dm(lay_.positions), inv_freq_.as<float>(), D / 2, s));
    KvCacheView kv;
    kv.base = static_cast<std::byte*>(states_.ssm_state(0).data);
    kv.page_bytes = cache.page_bytes();
    kv.block_size = kv_block_size_, kv.num_kv_heads = m_.num_kv_heads, kv.head_dim = D;
    kv.layer_offset_bytes = static_cast<int64_t>(L.index) * kv.layer_bytes();
    SSM_CUDA_CHECK(reshape_and_cache(k, KW, v, KW, T, dm(lay_.slots), kv, s));
    PagedAttentionArgs a{m_.num_heads, 1.0f / std::sqrt(static_cast<float>(D)), md.max_num_blocks_per_seq, dm(lay_.attn_qsl),
                         dm(lay_.seq_lens), dm(lay_.tables), dm(lay_.tasks), dm(lay_.items), aplan_.num_tasks,
                         aplan_.num_items, aplan_.tokens_per_task, aplan_.key_split, dm(lay_.tc_tiles), aplan_.num_tc_tiles,
                         aplan_.tc_tokens};
    SSM_CUDA_CHECK(paged_attention(q, QW, o, QW, kv, a,
                                   aws_.f32(paged_attention_workspace_floats(aplan_.num_items, m_.num_kv_heads, D)), s));
    void* oc = gated_.get(T * QW * dtype_size(wd));
    SSM_CUDA_CHECK(cast_rows(o, QW, T, QW, oc, wd, QW, s));
    gemm(oc, T, QW, L.o_proj, attn, Hd);
  }

  ModelConfig cfg_;
  MiniMaxConfig m_;
  CudaModelOptions opt_;
  int64_t state_elems_ = 0;
  int kv_block_size_ = 0;
  DeviceBuffer inv_freq_;
  LmFrame frame_;
  std::vector<MiniMaxLayerDev> layers_;
  Stream stream_;
  GemmHandle gemm_;
  DeviceStateMirror states_;
  StepMetaUploader meta_;
  DecodeGraphs graphs_;
  std::vector<int32_t> hmeta_;
  MetaLayout lay_{};
  LightningPlan lplan_;
  PagedAttentionPlan aplan_;
  // Scratch for T tokens: hidden / normed / attn / moe [T, Hd] fp32, normed_c [T, Hd] in the GEMM dtype, proj
  // [T, max(3HD, HD + 2KD)], o / gate [T, HD] fp32, gated [T, HD] GEMM dtype, router [T, E]; workspaces of the
  // lightning prefill, the attention splits and the MoE block; the step's packed metadata.
  Scratch hidden_, normed_, normed_c_, proj_, o_, gate_, gated_, attn_, router_, moe_, lws_, aws_, mws_, dmeta_buf_;
};

}  // namespace

std::unique_ptr<CausalLM> load_minimax_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt) {
  SSM_CHECK(gpu_available(), "--device cuda: no usable CUDA device");
  SSM_CHECK(opt.weight_dtype == DType::BF16 || opt.weight_dtype == DType::F32, "cuda weight dtype must be BF16 or F32");
  const MiniMaxConfig m = MiniMaxConfig::from_json(cfg);
  const std::string where = (cfg.dir / "config.json").string();
  SSM_CHECK(m.head_dim == 64 || m.head_dim == 128, "{}: head_dim {} is not supported on cuda (64 or 128)", where, m.head_dim);
  SSM_CHECK(m.block_size <= 1024, "{}: block_size {} > 1024 is not supported on cuda", where, m.block_size);
  SSM_CHECK(m.num_heads / m.num_kv_heads <= 16, "{}: more than 16 query heads per KV head are not supported on cuda", where);
  SSM_CHECK(m.num_experts <= 256 && m.top_k <= 8, "{}: more than 256 experts or top_k > 8 are not supported on cuda", where);
  SSM_CHECK(cfg.hidden_size % 8 == 0 && m.intermediate_size % 8 == 0,
            "{}: hidden_size and intermediate_size must be multiples of 8 on cuda", where);
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::dummy();
  if (format != LoadFormat::Dummy) {
    ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(cfg.dir));
    src = WeightSource::from_checkpoint(ckpt);
  }
  auto model = std::make_unique<CudaMiniMaxModel>(cfg, m, opt);
  model->load(src);
  return model;
}

}  // namespace ssmserve::cuda
