// Owns the Mamba-2 forward pass over a packed batch (decode rows through the one-token SSD state update,
// prefill rows through the varlen conv + chunked SSD scan with the sequence-aligned chunk metadata) and its
// weight loading.
#include "model/archs/mamba2.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "config/model_config.h"
#include "core/error.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_rms_norm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rms_norm.h"
#include "kernels/cpu/ssd.h"
#include "kernels/cpu/vec_math.h"
#include "dist/shard.h"
#include "dist/gathered_linear.h"
#include "dist/vocab_parallel.h"
#include "model/lm_common.h"
#include "model/parallel_layers.h"

namespace ssmserve {
namespace {

int positive_int(const nlohmann::json& j, const char* field, int fallback = -1) {
  if (!j.contains(field) || j[field].is_null()) {
    SSM_CHECK(fallback > 0, "config.json: Mamba-2 field \"{}\" is missing", field);
    return fallback;
  }
  SSM_CHECK(j[field].is_number_integer() && j[field].get<int64_t>() > 0 && j[field].get<int64_t>() < (1 << 24),
            "config.json: field \"{}\" must be a positive integer (got {})", field, j[field].dump().substr(0, 40));
  return j[field].get<int>();
}

bool boolean(const nlohmann::json& j, const char* field, bool fallback) {
  if (!j.contains(field)) return fallback;
  SSM_CHECK(j[field].is_boolean(), "config.json: field \"{}\" must be true or false", field);
  return j[field].get<bool>();
}

}  // namespace

Mamba2Config Mamba2Config::from_json(const ModelConfig& cfg) {
  const nlohmann::json& j = cfg.raw;
  Mamba2Config m;
  const int expand = positive_int(j, "expand", 2);
  m.num_heads = positive_int(j, "num_heads");
  m.head_dim = positive_int(j, "head_dim", 64);
  // Bounds far above real models (codestral-mamba-7b: d_inner 8192, 8 groups of d_state 128) that keep d_inner,
  // conv_dim and the projection widths clear of int overflow and the dummy weights clear of absurd allocations.
  constexpr int64_t kMaxWidth = 1 << 16;
  const int64_t d_inner = int64_t{m.num_heads} * m.head_dim, expanded = int64_t{expand} * cfg.hidden_size;
  SSM_CHECK(d_inner <= kMaxWidth, "config.json: num_heads * head_dim = {} must be <= {}", d_inner, kMaxWidth);
  m.d_inner = static_cast<int>(d_inner);
  SSM_CHECK(expanded == d_inner || !j.contains("expand"), "config.json: num_heads * head_dim = {} must equal expand * hidden_size = {}",
            d_inner, expanded);
  m.d_state = positive_int(j, "state_size", 128);
  m.n_groups = positive_int(j, "n_groups", 1);
  SSM_CHECK(m.num_heads % m.n_groups == 0, "config.json: num_heads {} must be a multiple of n_groups {}", m.num_heads, m.n_groups);
  SSM_CHECK(int64_t{m.n_groups} * m.d_state <= kMaxWidth, "config.json: n_groups * state_size = {} must be <= {}",
            int64_t{m.n_groups} * m.d_state, kMaxWidth);
  m.d_conv = positive_int(j, "conv_kernel", 4);
  SSM_CHECK(m.d_conv <= cpu::kMaxConvWidth, "config.json: conv_kernel {} must be in [1, {}]", m.d_conv, cpu::kMaxConvWidth);
  m.chunk_size = positive_int(j, "chunk_size", 256);
  m.use_bias = boolean(j, "use_bias", false);
  m.use_conv_bias = boolean(j, "use_conv_bias", true);
  m.norm_before_gate = boolean(j, "norm_before_gate", false);
  SSM_CHECK(!j.contains("hidden_act") || j["hidden_act"] == "silu", "config.json: hidden_act {} is not supported (Mamba-2 uses silu)",
            j["hidden_act"].dump().substr(0, 40));
  if (j.contains("time_step_limit") && !j["time_step_limit"].is_null()) {
    const auto& lim = j["time_step_limit"];
    SSM_CHECK(lim.is_array() && lim.size() == 2, "config.json: time_step_limit must be [min, max]");
    m.time_step_min_limit = static_cast<float>(json_float(lim[0], "time_step_limit[0]"));
    m.time_step_max_limit = static_cast<float>(json_float(lim[1], "time_step_limit[1]"));
    SSM_CHECK(!std::isnan(m.time_step_min_limit) && !std::isnan(m.time_step_max_limit) && m.time_step_min_limit <= m.time_step_max_limit,
              "config.json: time_step_limit must be [min, max] with min <= max");
  }
  return m;
}

namespace {

/// The Mamba-2 model: weights plus per-forward scratch (one forward at a time).
class Mamba2Model final : public CausalLM {
 public:
  /// m: this rank's shard of the mixer (d_inner, num_heads, n_groups per rank); full: the unsharded one.
  Mamba2Model(ModelConfig cfg, Mamba2Config m, Mamba2Config full, Weight emb, std::vector<Mamba2LayerWeights> layers,
              std::vector<float> norm_f, Weight lm_head, std::shared_ptr<const Checkpoint> ckpt, const dist::TpRank& tp)
      : cfg_(std::move(cfg)), m_(m), full_(full), embedding_(std::move(emb)), layers_(std::move(layers)), norm_f_(std::move(norm_f)),
        lm_head_(std::move(lm_head)), ckpt_(std::move(ckpt)), tp_(tp) {}

  const ModelConfig& config() const override { return cfg_; }
  int num_state_layers() const override { return cfg_.num_hidden_layers; }
  StateShape state_shape() const override {
    return {static_cast<int64_t>(m_.d_conv - 1) * m_.conv_dim(), static_cast<int64_t>(m_.num_heads) * m_.head_dim * m_.d_state};
  }
  int chunk_size() const override { return m_.chunk_size; }
  void forward(const ForwardBatch& batch, StateCache& cache, float* logits) override;

 private:
  void mixer(int layer, const ForwardBatch& batch, StateCache& cache, int64_t T);
  void decode_layers(const ForwardBatch& batch, StateCache& cache, int64_t T);
  void gated_norm_and_out_proj_gathered(const Mamba2LayerWeights& L, int64_t T);
  cpu::ConvParams conv_params(int layer, StateCache& cache) const;
  cpu::SsdParams ssd_params(int layer, StateCache& cache) const;
  /// The SSD inputs of rows [row0, ...) of the xbc_ / proj_ scratch.
  cpu::SsdInputs ssd_inputs(int64_t row0) const;

  /// Decode-only batches of at most this many rows (TP 1) take decode_layers: every layer in one OpenMP region.
  static constexpr int64_t kFusedDecodeMaxRows = 4;

  ModelConfig cfg_;
  Mamba2Config m_;  // this rank's shard: d_inner, num_heads, n_groups per rank
  Mamba2Config full_;  // the unsharded mixer
  Weight embedding_;
  std::vector<Mamba2LayerWeights> layers_;
  std::vector<float> norm_f_;
  Weight lm_head_;
  std::shared_ptr<const Checkpoint> ckpt_;
  dist::TpRank tp_;  // world 1: no communication
  // Scratch for T packed tokens:
  std::vector<float> hidden_;  // [T, hidden] residual stream (fp32)
  std::vector<float> normed_;  // [T, hidden]
  std::vector<float> proj_;    // [T, I + C + H]: z | xBC | dt
  std::vector<float> xbc_;     // [T, C] conv output: x | B | C
  std::vector<float> y_;       // [T, I]
  std::vector<float> gated_;   // [T, I]
  std::vector<float> out_;     // [T, hidden]
  std::vector<float> yf_, zf_, gf_;  // [T, d_inner] all-gathered y and z, the gated norm over them (tp > 1)
  std::vector<float> normed_t_;      // [threads, T, hidden] every thread's own pre-norm copy (decode_layers)
  std::vector<float> gated_t_;       // [threads, T, d_inner] every thread's own gated-norm copy (decode_layers)
  std::vector<float> comm_;          // collective scratch
};

void Mamba2Model::forward(const ForwardBatch& batch, StateCache& cache, float* logits) {
  check_batch_against_cache(batch, cache, num_state_layers(), "Mamba-2");
  SSM_CHECK(batch.meta.num_prefills == 0 || batch.meta.chunk_size == m_.chunk_size,
            "Mamba-2 forward: metadata chunk_size {} != model chunk_size {}", batch.meta.chunk_size, m_.chunk_size);
  const int64_t T = batch.num_tokens(), H = cfg_.hidden_size;
  // 1. Embedding lookup. 2. Residual blocks. 3. Final norm + LM head on the requested rows.
  hidden_.resize(T * H);
  if (tp_.world > 1) dist::embed_tokens_vocab_parallel(batch, embedding_, cfg_.vocab_size, *tp_.comm, hidden_.data());
  else embed_tokens(batch, embedding_, hidden_.data());
  if (tp_.world == 1 && batch.meta.num_prefills == 0 && T <= kFusedDecodeMaxRows) decode_layers(batch, cache, T);
  else
    for (int l = 0; l < cfg_.num_hidden_layers; ++l) mixer(l, batch, cache, T);
  const float eps = cfg_.layer_norm_epsilon;
  if (tp_.world > 1)
    dist::final_norm_and_lm_head_vocab_parallel(batch, hidden_.data(), H, norm_f_.data(), eps, lm_head_, cfg_.vocab_size, *tp_.comm, logits);
  else final_norm_and_lm_head(batch, hidden_.data(), H, norm_f_.data(), eps, lm_head_, logits);
}

void Mamba2Model::mixer(int layer, const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const Mamba2LayerWeights& L = layers_[layer];
  const MambaBatchMetadata& md = batch.meta;
  const int64_t Hd = cfg_.hidden_size, I = m_.d_inner, C = m_.conv_dim(), NH = m_.num_heads;
  const int64_t PW = I + C + NH;  // projection width
  const int64_t nd = md.num_decode_rows(), P0 = batch.prefill_token_offset();
  normed_.resize(T * Hd), proj_.resize(T * PW), xbc_.resize(T * C), y_.resize(T * I), gated_.resize(T * I), out_.resize(T * Hd);
  // 1. Pre-norm and input projection: [z | xBC | dt].
  cpu::rms_norm(hidden_.data(), L.norm.data(), cfg_.layer_norm_epsilon, T, Hd, normed_.data());
  cpu::linear(normed_.data(), T, L.in_proj, L.in_proj_bias.empty() ? nullptr : L.in_proj_bias.data(), proj_.data());
  // 2. Causal conv1d + SiLU over xBC (decode rows update their window; prefill rows scan theirs).
  const cpu::ConvParams conv = conv_params(layer, cache);
  const float* xbc_in = proj_.data() + I;
  if (nd > 0) cpu::causal_conv1d_update(xbc_in, PW, xbc_.data(), C, conv, md.state_indices_tensor_d);
  if (md.num_prefills > 0)
    cpu::causal_conv1d_fwd(xbc_in + P0 * PW, PW, xbc_.data() + P0 * C, C, conv, md.query_start_loc_p,
                           md.state_indices_tensor_p, md.has_initial_states_p);
  // 3. SSD: x = xBC[:, :I] as [H, P], B and C = the next two n_groups * d_state slices, dt = proj[:, I + C:].
  const cpu::SsdParams sp = ssd_params(layer, cache);
  if (nd > 0) cpu::ssd_state_update(ssd_inputs(0), sp, y_.data(), I, md.state_indices_tensor_d);
  if (md.num_prefills > 0) {
    const cpu::SsdChunkMetadata cm{md.chunk_size, md.query_start_loc_p, md.cu_chunk_seqlen_p, md.seq_idx_p,
                                   md.last_chunk_indices_p, md.state_indices_tensor_p, md.has_initial_states_p};
    cpu::ssd_chunk_scan_fwd(ssd_inputs(P0), sp, cm, y_.data() + P0 * I, I);
  }
  // 4. Gated RMSNorm with z, then the output projection and the residual add.
  if (tp_.world > 1) {
    gated_norm_and_out_proj_gathered(L, T);
  } else {
    cpu::gated_rms_norm(y_.data(), I, proj_.data(), PW, L.gate_norm.data(), cfg_.layer_norm_epsilon, T, I, I / m_.n_groups,
                        m_.norm_before_gate, gated_.data());
    cpu::linear(gated_.data(), T, L.out_proj, L.out_proj_bias.empty() ? nullptr : L.out_proj_bias.data(), out_.data());
  }
  for (int64_t i = 0; i < T * Hd; ++i) hidden_[i] += out_[i];
}

cpu::ConvParams Mamba2Model::conv_params(int layer, StateCache& cache) const {
  const Mamba2LayerWeights& L = layers_[layer];
  return {m_.conv_dim(), m_.d_conv, L.conv_weight.data(), L.conv_bias.empty() ? nullptr : L.conv_bias.data(),
          cache.conv_state(layer), true};
}

cpu::SsdParams Mamba2Model::ssd_params(int layer, StateCache& cache) const {
  const Mamba2LayerWeights& L = layers_[layer];
  cpu::SsdParams sp;
  sp.num_heads = m_.num_heads, sp.head_dim = m_.head_dim, sp.d_state = m_.d_state, sp.n_groups = m_.n_groups;
  sp.A = L.A.data(), sp.D = L.D.data(), sp.dt_bias = L.dt_bias.data();
  sp.time_step_min = m_.time_step_min_limit, sp.time_step_max = m_.time_step_max_limit;
  sp.ssm_states = cache.ssm_state(layer);
  return sp;
}

// x = xBC[:, :I] as [H, P], B and C = the next two n_groups * d_state slices, dt = proj[:, I + C:].
cpu::SsdInputs Mamba2Model::ssd_inputs(int64_t row0) const {
  const int64_t I = m_.d_inner, C = m_.conv_dim(), PW = I + C + m_.num_heads, GN = int64_t{m_.n_groups} * m_.d_state;
  return cpu::SsdInputs{{xbc_.data() + row0 * C, C}, {proj_.data() + row0 * PW + I + C, PW},
                        {xbc_.data() + row0 * C + I, C}, {xbc_.data() + row0 * C + I + GN, C}};
}

// Decode-only batches: the same per-row arithmetic as mixer() (the same kernels on the same rows, so the results
// are bit-identical to it and batch-invariant), but every layer runs inside one OpenMP region with three
// barriers per layer instead of three parallel regions plus serial steps between them:
//   1. every thread: pre-norm of all rows into its own copy (cheap, no barrier), its in_proj columns, and the
//      conv update of the channels whose inputs are among those columns (the conv is per channel);
//   -- barrier (the SSD needs every channel's B, C and dt) --
//   2. the SSD update of its (row, head) pairs;
//   -- barrier (the gated norm of a group spans every head) --
//   3. every thread: the gated norm of all rows into its own copy, its out_proj columns and their residual adds;
//   -- barrier (the next pre-norm reads the whole residual stream) --
void Mamba2Model::decode_layers(const ForwardBatch& batch, StateCache& cache, int64_t T) {
  const MambaBatchMetadata& md = batch.meta;
  const int64_t Hd = cfg_.hidden_size, I = m_.d_inner, C = m_.conv_dim(), PW = I + C + m_.num_heads;
  const int num_layers = cfg_.num_hidden_layers;
  const float eps = cfg_.layer_norm_epsilon;
  const int64_t max_threads = omp_get_max_threads();
  proj_.resize(T * PW), xbc_.resize(T * C), y_.resize(T * I), out_.resize(T * Hd);
  normed_t_.resize(max_threads * T * Hd), gated_t_.resize(max_threads * T * I);
  // Everything that can throw happens here, outside the region.
  std::vector<cpu::ConvParams> conv(num_layers);
  std::vector<cpu::SsdParams> ssd(num_layers);
  for (int l = 0; l < num_layers; ++l) {
    conv[l] = conv_params(l, cache);
    ssd[l] = ssd_params(l, cache);
    cpu::ssd_check_params(ssd[l]);
    cpu::check_linear_part(layers_[l].in_proj, Hd, PW);
    cpu::check_linear_part(layers_[l].out_proj, I, Hd);
  }
  const cpu::SsdInputs inputs = ssd_inputs(0);
  const std::span<const int32_t> blocks = md.state_indices_tensor_d;
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float* normed = normed_t_.data() + t * T * Hd;
    float* gated = gated_t_.data() + t * T * I;
    for (int l = 0; l < num_layers; ++l) {
      const Mamba2LayerWeights& L = layers_[l];
      cpu::rms_norm(hidden_.data(), L.norm.data(), eps, T, Hd, normed);
      cpu::linear_part(normed, T, Hd, L.in_proj, L.in_proj_bias.empty() ? nullptr : L.in_proj_bias.data(), proj_.data(), PW, t, nt);
      const cpu::LinearColumns in_cols = cpu::linear_part_columns(L.in_proj, t, nt);  // proj column I + c = conv channel c
      const int64_t c0 = std::clamp<int64_t>(in_cols.begin - I, 0, C), c1 = std::clamp<int64_t>(in_cols.end - I, 0, C);
      cpu::causal_conv1d_update_channels(proj_.data() + I, PW, xbc_.data(), C, conv[l], blocks, c0, c1);
#pragma omp barrier
      cpu::ssd_state_update_part(inputs, ssd[l], y_.data(), I, blocks, t, nt);
#pragma omp barrier
      cpu::gated_rms_norm(y_.data(), I, proj_.data(), PW, L.gate_norm.data(), eps, T, I, I / m_.n_groups, m_.norm_before_gate,
                          gated);
      cpu::linear_part(gated, T, I, L.out_proj, L.out_proj_bias.empty() ? nullptr : L.out_proj_bias.data(), out_.data(), Hd, t, nt);
      const cpu::LinearColumns out_cols = cpu::linear_part_columns(L.out_proj, t, nt);
      for (int64_t r = 0; r < T; ++r)
        for (int64_t i = out_cols.begin; i < out_cols.end; ++i) hidden_[r * Hd + i] += out_[r * Hd + i];
#pragma omp barrier
    }
  }
}

// out_ = out_proj(gated RMSNorm(y, z)) with TP = 1's arithmetic (dist/gathered_linear.h): the ranks' y and z
// shards are all-gathered into the whole [T, d_inner], every rank applies the gated norm to all of it (cheap,
// elementwise; its weight is replicated), and out_proj is split by output rows over the whole d_inner.
void Mamba2Model::gated_norm_and_out_proj_gathered(const Mamba2LayerWeights& L, int64_t T) {
  const int64_t I = m_.d_inner, PW = I + m_.conv_dim() + m_.num_heads, IF = full_.d_inner, Hd = cfg_.hidden_size;
  yf_.resize(T * IF), zf_.resize(T * IF), gf_.resize(T * IF);
  dist::all_gather_columns(y_.data(), T, I, I, *tp_.comm, yf_.data(), IF, comm_);
  dist::all_gather_columns(proj_.data(), T, I, PW, *tp_.comm, zf_.data(), IF, comm_);  // z = proj[:, :I]
  cpu::gated_rms_norm(yf_.data(), IF, zf_.data(), IF, L.gate_norm.data(), cfg_.layer_norm_epsilon, T, IF, IF / full_.n_groups,
                      full_.norm_before_gate, gf_.data());
  dist::output_split_linear(gf_.data(), T, IF, L.out_proj, L.out_proj_bias.empty() ? nullptr : L.out_proj_bias.data(), Hd,
                            *tp_.comm, out_.data(), Hd, comm_);
}

}  // namespace

Mamba2LayerWeights read_mamba2_layer(WeightSource& src, const ModelConfig& cfg, const Mamba2Config& m, int64_t layer) {
  const int64_t Hd = cfg.hidden_size, I = m.d_inner, C = m.conv_dim(), NH = m.num_heads, K = m.d_conv;
  const float in_scale = 1.0f / std::sqrt(static_cast<float>(Hd)), inner_scale = 1.0f / std::sqrt(static_cast<float>(I));
  const std::string p = fmt::format("backbone.layers.{}.", layer);
  Mamba2LayerWeights L;
  L.norm = src.vector(p + "norm.weight", {Hd}, DummyInit::constant(1.0f));
  L.in_proj = src.matrix(p + "mixer.in_proj.weight", {I + C + NH, Hd}, DummyInit::uniform(in_scale));
  if (m.use_bias) L.in_proj_bias = src.vector(p + "mixer.in_proj.bias", {I + C + NH}, DummyInit::constant(0.0f));
  L.conv_weight = src.vector(p + "mixer.conv1d.weight", {C, 1, K}, DummyInit::uniform(0.5f));
  if (m.use_conv_bias) L.conv_bias = src.vector(p + "mixer.conv1d.bias", {C}, DummyInit::uniform(0.1f));
  L.dt_bias = src.vector(p + "mixer.dt_bias", {NH}, DummyInit::constant(-4.0f));
  L.A = src.vector(p + "mixer.A_log", {NH}, DummyInit::log_arange());
  for (float& a : L.A) a = -std::exp(a);
  L.D = src.vector(p + "mixer.D", {NH}, DummyInit::constant(1.0f));
  L.gate_norm = src.vector(p + "mixer.norm.weight", {I}, DummyInit::constant(1.0f));
  L.out_proj = src.matrix(p + "mixer.out_proj.weight", {Hd, I}, DummyInit::uniform(inner_scale));
  if (m.use_bias) L.out_proj_bias = src.vector(p + "mixer.out_proj.bias", {Hd}, DummyInit::constant(0.0f));
  return L;
}

std::unique_ptr<CausalLM> load_mamba2(const ModelConfig& cfg, LoadFormat format, const dist::TpRank& tp) {
  const Mamba2Config m = Mamba2Config::from_json(cfg);
  SSM_CHECK(tp.world == 1 || tp.comm, "load_mamba2: tensor-parallel size {} needs a communicator", tp.world);
  (void)dist::even_shard(m.num_heads, tp.rank, tp.world, "Mamba-2 num_heads");  // throws first when the heads don't split
  SSM_CHECK(m.n_groups == 1 || m.n_groups % tp.world == 0,
            "--tensor-parallel-size {}: Mamba-2 n_groups {} must be 1 (replicated on every rank) or a multiple of it", tp.world,
            m.n_groups);
  std::shared_ptr<const Checkpoint> ckpt;
  WeightSource src = WeightSource::dummy();
  if (format != LoadFormat::Dummy) {
    ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(cfg.dir));
    src = WeightSource::from_checkpoint(ckpt);
  }
  const int64_t Hd = cfg.hidden_size, I = m.d_inner, C = m.conv_dim(), NH = m.num_heads, K = m.d_conv, V = cfg.vocab_size;
  const int64_t N = m.d_state, GN = static_cast<int64_t>(m.n_groups) * N;
  // This rank's heads h, channels c (= heads x head_dim) and B/C group rows g (all of them when replicated); the
  // in_proj rows are [z | x | B | C | dt], the conv channels [x | B | C] (everything when tp.world == 1).
  const dist::Range h = dist::even_shard(NH, tp.rank, tp.world, "Mamba-2 num_heads");
  const dist::Range c{h.begin * m.head_dim, h.end * m.head_dim};
  const dist::Range groups = m.n_groups == 1 ? dist::Range{0, 1} : dist::even_shard(m.n_groups, tp.rank, tp.world, "Mamba-2 n_groups");
  const dist::Range g{groups.begin * N, groups.end * N};
  const dist::Range v = dist::vocab_shard(V, tp.rank, tp.world);
  const std::vector<dist::Range> conv_rows = {c, {I + g.begin, I + g.end}, {I + GN + g.begin, I + GN + g.end}};
  std::vector<dist::Range> proj_rows = {c};
  for (const dist::Range& r : conv_rows) proj_rows.push_back({I + r.begin, I + r.end});
  proj_rows.push_back({I + C + h.begin, I + C + h.end});
  Weight emb = dist::slice_rows(src.matrix("backbone.embeddings.weight", {V, Hd}, DummyInit::uniform(0.1f)), {v});
  // The LM head streams from memory at every decode step (a quarter of the 130M model's bytes): the packed panels
  // read ~7% faster than the row-major kernel at batch 1 (one stream, prefetched). A tied head and the embedding
  // share one copy, the panels (the lookup reads its rows from them); an untied head keeps only its panels too
  // (nothing reads its rows). Packed before the layers load, so the moment both layouts exist comes before the
  // model's peak.
  Weight head;
  if (cfg.tie_word_embeddings && !src.has("lm_head.weight")) {
    cpu::pack_for_linear_only(emb);
    head = emb;
  } else {
    head = dist::slice_rows(src.matrix("lm_head.weight", {V, Hd}, DummyInit::uniform(0.1f)), {v});
    cpu::pack_for_linear_only(head);
  }
  // The gated norm runs over the whole d_inner on every rank, out_proj split by output rows (dist/gathered_linear.h).
  const dist::Range o = dist::output_shard(Hd, tp.rank, tp.world);
  std::vector<Mamba2LayerWeights> layers(static_cast<size_t>(cfg.num_hidden_layers));
  for_each_layer_parallel(cfg.num_hidden_layers, [&](int64_t l) {
    Mamba2LayerWeights L = read_mamba2_layer(src, cfg, m, l);
    L.in_proj = dist::slice_rows(L.in_proj, proj_rows);
    if (!L.in_proj_bias.empty()) L.in_proj_bias = dist::slice_rows(L.in_proj_bias, 1, proj_rows);
    L.conv_weight = dist::slice_rows(L.conv_weight, K, conv_rows);
    if (!L.conv_bias.empty()) L.conv_bias = dist::slice_rows(L.conv_bias, 1, conv_rows);
    L.dt_bias = dist::slice_rows(L.dt_bias, 1, {h});
    L.A = dist::slice_rows(L.A, 1, {h});
    L.D = dist::slice_rows(L.D, 1, {h});
    L.out_proj = dist::slice_rows(L.out_proj, {o});
    if (!L.out_proj_bias.empty()) L.out_proj_bias = dist::slice_rows(L.out_proj_bias, 1, {o});
    cpu::pack_for_linear_only(L.in_proj);  // the forward reads only the panels: no row-major copy kept
    cpu::pack_for_linear_only(L.out_proj);
    layers[static_cast<size_t>(l)] = std::move(L);
  });
  std::vector<float> norm_f = src.vector("backbone.norm_f.weight", {Hd}, DummyInit::constant(1.0f));
  Mamba2Config shard = m;  // this rank's mixer dimensions
  shard.d_inner = static_cast<int>(c.size());
  shard.num_heads = static_cast<int>(h.size());
  shard.n_groups = static_cast<int>(groups.size());
  if (tp.rank == 0) src.warn_unused_tensors();
  return std::make_unique<Mamba2Model>(cfg, shard, m, std::move(emb), std::move(layers), std::move(norm_f), std::move(head),
                                       std::move(ckpt), tp);
}

}  // namespace ssmserve
