// Owns the shared parts of the GPU runners (see runner_common.h).
#include "runtime/runner_common.h"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "device/cuda_check.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/rms_norm.h"
#include "model/lm_common.h"
#include "runtime/device_state.h"
#include "runtime/tp_runner.h"

namespace ssmserve::cuda {

double state_budget_bytes(double gpu_memory_utilization, double workspace_bytes) {
  size_t free_b = 0, total_b = 0;
  SSM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  constexpr double kReserve = 512.0 * 1024 * 1024;
  const double total = static_cast<double>(total_b), used = static_cast<double>(total_b - free_b);
  return gpu_memory_utilization * total - used - 1.5 * workspace_bytes - kReserve;
}

namespace {

/// Converts `w` to `dtype` and uploads it into `buf` at byte offset `offset` (upload_weight's conversion: raw bytes
/// when the dtypes match, else through fp32 with round-to-nearest-even to bf16).
void upload_converted(const Weight& w, DType dtype, DeviceBuffer& buf, size_t offset) {
  const size_t n = static_cast<size_t>(w.rows * w.cols);
  if (w.dtype == dtype) {
    buf.upload(w.data, n * dtype_size(dtype), offset);
    return;
  }
  std::vector<float> f(n);
  to_f32(w.dtype, w.data, f.data(), n);
  if (dtype == DType::F32) {
    buf.upload(f.data(), n * 4, offset);
    return;
  }
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(f[i]);
  buf.upload(b.data(), n * 2, offset);
}

}  // namespace

DevWeight upload_weight(const Weight& w, DType dtype) { return upload_stacked({&w}, dtype); }

DevWeight upload_stacked(const std::vector<const Weight*>& parts, DType dtype) {
  SSM_CHECK(dtype == DType::BF16 || dtype == DType::F32, "GPU weights must be BF16 or F32");
  SSM_CHECK(!parts.empty(), "upload_stacked: no weights to stack");
  DevWeight d;
  d.cols = parts[0]->cols, d.dtype = dtype;
  for (size_t i = 0; i < parts.size(); ++i) {
    SSM_CHECK(parts[i]->cols == d.cols, "upload_stacked: part {} has {} columns, part 0 has {}", i, parts[i]->cols, d.cols);
    d.rows += parts[i]->rows;
  }
  d.buf = DeviceBuffer(static_cast<size_t>(d.rows * d.cols) * dtype_size(dtype));
  size_t offset = 0;
  for (const Weight* w : parts) {
    upload_converted(*w, dtype, d.buf, offset);
    offset += static_cast<size_t>(w->rows * w->cols) * dtype_size(dtype);
  }
  return d;
}

DevWeight stack_device_rows(const std::vector<const DevWeight*>& parts, int64_t align_rows, std::vector<int64_t>* offsets) {
  SSM_CHECK(!parts.empty() && align_rows >= 1, "stack_device_rows: no weights to stack or align_rows {} < 1", align_rows);
  const auto up = [&](int64_t r) { return (r + align_rows - 1) / align_rows * align_rows; };
  DevWeight d;
  d.cols = parts[0]->cols, d.dtype = parts[0]->dtype;
  offsets->clear();
  for (size_t i = 0; i < parts.size(); ++i) {
    SSM_CHECK(parts[i]->cols == d.cols && parts[i]->dtype == d.dtype, "stack_device_rows: part {} is [{}, {}] {}, part 0 [.., {}] {}",
              i, parts[i]->rows, parts[i]->cols, dtype_name(parts[i]->dtype), d.cols, dtype_name(d.dtype));
    offsets->push_back(d.rows);
    d.rows = up(d.rows + parts[i]->rows);
  }
  const size_t row_bytes = static_cast<size_t>(d.cols) * dtype_size(d.dtype);
  d.buf = DeviceBuffer(static_cast<size_t>(d.rows) * row_bytes);
  d.buf.fill_bytes(0);
  for (size_t i = 0; i < parts.size(); ++i)
    if (parts[i]->rows > 0)
      SSM_CUDA_CHECK(cudaMemcpy(d.buf.as<char>() + static_cast<size_t>((*offsets)[i]) * row_bytes, parts[i]->buf.data(),
                                static_cast<size_t>(parts[i]->rows) * row_bytes, cudaMemcpyDeviceToDevice));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());  // the copies done before the caller frees the parts
  return d;
}

bool chunk_store_blocks(const MambaBatchMetadata& md, std::vector<int32_t>& chunk_store, std::vector<int32_t>& store_row) {
  chunk_store.clear(), store_row.clear();
  if (!md.has_state_stores()) return true;
  const int np = md.num_prefills, nc = md.num_chunks();
  SSM_CHECK(static_cast<int>(md.state_store_start_p.size()) == np + 1 && md.state_store_block_p.size() == md.state_store_offset_p.size(),
            "state stores: start has {} entries for {} prefill rows", md.state_store_start_p.size(), np);
  chunk_store.assign(static_cast<size_t>(nc), 0);
  store_row.resize(md.state_store_offset_p.size());
  bool on_ends = true;
  int c = 0;  // chunks are in row order, so one pass over them serves every row's increasing offsets
  for (int p = 0; p < np; ++p) {
    const int32_t q = md.query_start_loc_p[p];
    for (int32_t i = md.state_store_start_p[p]; i < md.state_store_start_p[p + 1]; ++i) {
      store_row[i] = p;
      const int32_t end = q + md.state_store_offset_p[i];
      while (c < nc && (md.seq_idx_p[c] < p || (md.seq_idx_p[c] == p && md.cu_chunk_seqlen_p[c + 1] < end))) ++c;
      if (c < nc && md.seq_idx_p[c] == p && md.cu_chunk_seqlen_p[c + 1] == end) chunk_store[c] = md.state_store_block_p[i];
      else on_ends = false;
    }
  }
  return on_ends;
}

StepMeta StepMetaUploader::upload(const ForwardBatch& batch, cudaStream_t stream) {
  const MambaBatchMetadata& md = batch.meta;
  const bool on_ends = chunk_store_blocks(md, chunk_store_, store_row_);
  const std::vector<const std::vector<int32_t>*> ints = {
      &batch.input_ids,     &md.query_start_loc_p, &md.state_indices_tensor_p, &md.state_indices_tensor_d,
      &batch.logits_indices, &md.cu_chunk_seqlen_p, &md.seq_idx_p,             &md.last_chunk_indices_p,
      &md.num_computed_tokens_p, &md.query_start_loc_d, &md.state_indices_spec_d,
      &md.state_store_start_p, &md.state_store_offset_p, &md.state_store_block_p, &store_row_, &chunk_store_};
  size_t n_int = 0;
  for (const auto* v : ints) n_int += v->size() + 1;  // +1 keeps every view distinct and non-empty
  const size_t bytes = n_int * 4 + md.has_initial_states_p.size() + 16;
  host_.assign(bytes, 0);
  std::vector<size_t> off;
  size_t o = 0;
  for (const auto* v : ints) {
    off.push_back(o);
    if (!v->empty()) std::memcpy(host_.data() + o, v->data(), v->size() * 4);
    o += (v->size() + 1) * 4;
  }
  const size_t hi_off = o;
  if (!md.has_initial_states_p.empty())
    std::memcpy(host_.data() + o, md.has_initial_states_p.data(), md.has_initial_states_p.size());
  if (dev_.bytes() < bytes) dev_ = DeviceBuffer(std::max<size_t>(bytes, 4096) * 2);
  dev_.upload_async(host_.data(), bytes, stream);
  const auto* base = static_cast<const uint8_t*>(dev_.data());
  auto i32 = [&](int k) { return reinterpret_cast<const int32_t*>(base + off[k]); };
  StepMeta m;
  m.input_ids = i32(0), m.query_start_loc_p = i32(1), m.state_indices_p = i32(2), m.state_indices_d = i32(3);
  m.logits_indices = i32(4), m.cu_chunk_seqlen_p = i32(5), m.seq_idx_p = i32(6), m.last_chunk_indices_p = i32(7);
  m.num_computed_tokens_p = i32(8);
  m.query_start_loc_d = i32(9), m.state_indices_spec_d = i32(10);
  m.spec_cols = md.spec_cols;
  m.has_initial_states_p = base + hi_off;
  if (md.has_state_stores()) {
    m.stores = {static_cast<int>(md.state_store_offset_p.size()), i32(11), i32(12), i32(13), i32(14)};
    m.chunk_store_blocks_p = i32(15);
    m.stores_on_chunk_ends = on_ends;
  }
  return m;
}

void LmFrame::embed(const StepMeta& m, int64_t T, int64_t H, float* hidden, cudaStream_t s) {
  SSM_CUDA_CHECK(cuda::embedding(m.input_ids, T, embedding.buf.data(), embedding.dtype, embedding.rows, H, hidden, H, s, pdl));
}

void LmFrame::reserve(int64_t T, int64_t H, int64_t V, int64_t n_logits) {
  const DevWeight& head = tied ? embedding : lm_head;
  (void)T;
  cast.get(std::max<int64_t>(n_logits, 1) * H * dtype_size(head.dtype));
  logits.f32(std::max<int64_t>(n_logits, 1) * V);
  picks.get(std::max<int64_t>(n_logits, 1) * sizeof(GreedyRow));
}

void LmFrame::enqueue_greedy(int64_t n_logits, int64_t V, int num_top, cudaStream_t s, int64_t row0,
                             const GreedyFeed* feed) {
  if (n_logits == 0) return;
  auto* rows = static_cast<GreedyRow*>(picks.get((row0 + n_logits) * sizeof(GreedyRow)));
  SSM_CUDA_CHECK(
      greedy_sample(logits.f32(n_logits * V), V, static_cast<int>(n_logits), V, num_top, rows + row0, s, feed));
}

void LmFrame::fetch_picks(int64_t n_logits, cudaStream_t s) {
  picks_host.resize(static_cast<size_t>(n_logits));
  if (n_logits > 0)
    SSM_CUDA_CHECK(cudaMemcpyAsync(picks_host.data(), picks.buf.data(), n_logits * sizeof(GreedyRow),
                                   cudaMemcpyDeviceToHost, s));
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
}

void LmFrame::download_greedy(int64_t n_logits, int num_top, std::vector<GreedyPick>& out, cudaStream_t s) {
  fetch_picks(n_logits, s);
  out.resize(static_cast<size_t>(n_logits));
  for (int64_t i = 0; i < n_logits; ++i) {
    const GreedyRow& g = picks_host[i];
    GreedyPick& p = out[i];
    p.token = g.token, p.logprob = g.logprob;
    p.sampled_rank = g.token >= 0 ? 1 : 0;  // the raw argmax
    p.top.clear();
    for (int j = 0; j < num_top && g.token >= 0; ++j) p.top.emplace_back(g.top_ids[j], g.top_logprobs[j]);
  }
}

void LmFrame::enqueue_sample(int64_t n_logits, int64_t V, const DeviceSampleBatch& sample, cudaStream_t s) {
  SSM_CHECK(static_cast<int64_t>(sample.rows.size()) == n_logits, "device sampling: {} parameter rows for {} logits rows",
            sample.rows.size(), n_logits);
  if (n_logits == 0) return;
  bool any_mods = false;
  for (const SampleRowParams& r : sample.rows) {
    SSM_CHECK(r.mods_begin >= 0 && r.mods_count >= 0 &&
                  static_cast<size_t>(r.mods_begin) + static_cast<size_t>(r.mods_count) <= sample.mods.size(),
              "device sampling: a row's logit modifications [{}, +{}) lie outside the {} entries", r.mods_begin,
              r.mods_count, sample.mods.size());
    any_mods = any_mods || r.mods_count > 0;
  }
  const size_t rows_bytes = sample.rows.size() * sizeof(SampleRowParams);
  const size_t mods_off = (rows_bytes + 15) / 16 * 16;
  const size_t bytes = mods_off + sample.mods.size() * sizeof(LogitMod);
  auto* base = static_cast<uint8_t*>(sample_in.get(bytes));
  SSM_CUDA_CHECK(cudaMemcpyAsync(base, sample.rows.data(), rows_bytes, cudaMemcpyHostToDevice, s));
  if (!sample.mods.empty())
    SSM_CUDA_CHECK(cudaMemcpyAsync(base + mods_off, sample.mods.data(), sample.mods.size() * sizeof(LogitMod),
                                   cudaMemcpyHostToDevice, s));
  float* work = any_mods ? sample_work.f32(static_cast<size_t>(n_logits * V)) : nullptr;
  SSM_CUDA_CHECK(sample_rows(logits.f32(n_logits * V), V, static_cast<int>(n_logits), V,
                             reinterpret_cast<const SampleRowParams*>(base),
                             reinterpret_cast<const LogitMod*>(base + mods_off), work,
                             static_cast<GreedyRow*>(picks.get(n_logits * sizeof(GreedyRow))), s));
}

void LmFrame::download_sample(int64_t n_logits, int64_t V, const DeviceSampleBatch& sample, std::vector<GreedyPick>& out,
                              cudaStream_t s) {
  fetch_picks(n_logits, s);
  out.resize(static_cast<size_t>(n_logits));
  for (int64_t i = 0; i < n_logits; ++i) {
    const GreedyRow& g = picks_host[i];
    GreedyPick& p = out[i];
    p.token = g.token, p.logprob = g.logprob;
    p.score_logprob = g.score_logprob, p.score_rank = g.score_rank;
    p.sampled_rank = g.token >= 0 && sample.rows[i].rank_sampled ? g.sampled_rank : 0;
    p.top.clear();
    p.logits.clear();
    const int num_top = std::clamp(sample.rows[i].num_top, 0, static_cast<int>(std::min<int64_t>(V, kMaxDeviceTopLogprobs)));
    for (int j = 0; j < num_top && g.token >= 0; ++j) p.top.emplace_back(g.top_ids[j], g.top_logprobs[j]);
    if (g.token == kPickOnHost) {  // rare: the candidate set did not fit on chip
      p.logits.resize(static_cast<size_t>(V));
      SSM_CUDA_CHECK(cudaMemcpy(p.logits.data(), logits.f32(n_logits * V) + i * V, V * sizeof(float),
                                cudaMemcpyDeviceToHost));
    }
  }
}

void LmFrame::pointers(std::vector<const void*>& out) const {
  for (const Scratch* s : {&cast, &logits, &picks, &next_ids}) out.push_back(s->buf.data());
}

void LmFrame::enqueue_head(const StepMeta& m, int64_t T, int64_t H, int64_t V, float eps, const float* last_out,
                           float* hidden, int64_t n_logits, GemmHandle& gemm, cudaStream_t s, float residual_scale,
                           float out_scale) {
  (void)T;
  if (n_logits == 0) return;
  const DevWeight& head = tied ? embedding : lm_head;
  void* g_ab = cast.get(n_logits * H * dtype_size(head.dtype));
  SSM_CUDA_CHECK(add_rms_norm_rows(last_out, H, hidden, H, norm_f.as<float>(), eps, m.logits_indices, n_logits, H, false,
                                   g_ab, head.dtype, H, pdl, s, residual_scale, out_scale));
  float* dl = logits.f32(n_logits * V);
  gemm.run({n_logits, head.rows, head.cols, g_ab, H, head.buf.data(), head.cols, head.dtype, dl, V, DType::F32}, s);
}

void LmFrame::download(int64_t n_logits, int64_t V, float* logits_host, cudaStream_t s) {
  if (n_logits > 0)
    SSM_CUDA_CHECK(cudaMemcpyAsync(logits_host, logits.buf.data(), n_logits * V * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
}

uint64_t pointer_signature(const std::vector<const void*>& ptrs) {
  uint64_t h = 1469598103934665603ull;
  for (const void* p : ptrs) {
    h ^= static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
    h *= 1099511628211ull;
  }
  return h;
}

DecodeGraphs::~DecodeGraphs() {
  for (auto& [k, e] : graphs_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
}

void DecodeGraphs::run(cudaStream_t s, std::pair<uint64_t, uint64_t> key, uint64_t signature, const std::function<void()>& body) {
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= max_graphs_) return body();  // enough shapes captured: run the rest eagerly
    it = graphs_.emplace(key, Entry{}).first;
  }
  Entry& e = it->second;
  if (e.exec && e.signature == signature) {
    const bool profiled = profile_replay_ > 0 && replays_ + 1 == profile_replay_;
    if (profiled) SSM_CUDA_CHECK(cudaStreamSynchronize(s)), SSM_CUDA_CHECK(cudaProfilerStart());
    SSM_CUDA_CHECK(cudaGraphLaunch(e.exec, s));
    if (profiled) SSM_CUDA_CHECK(cudaStreamSynchronize(s)), SSM_CUDA_CHECK(cudaProfilerStop());
    ++replays_;
    return;
  }
  if (e.exec) {  // a buffer moved since the capture
    cudaGraphExecDestroy(e.exec);
    e.exec = nullptr;
  }
  if (!e.seen) {  // first sight: eager (loads modules, fills the GEMM heuristics cache)
    e.seen = true;
    return body();
  }
  if (e.failed) return body();
  // Capture; if the runtime refuses (a call in the step that cannot be captured), warn once and keep this shape
  // eager: the step is then run eagerly, so the result is the same either way.
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::string why;
  if (const cudaError_t b = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); b != cudaSuccess) {
    why = cudaGetErrorString(b);
  } else {
    try {
      body();
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (why.empty() && end != cudaSuccess) why = cudaGetErrorString(end);
    if (why.empty()) {
      const cudaError_t inst = cudaGraphInstantiate(&exec, g, 0);
      if (inst != cudaSuccess) why = cudaGetErrorString(inst);
    }
    if (g) cudaGraphDestroy(g);
  }
  if (!why.empty()) {
    cudaGetLastError();
    e.failed = true;
    spdlog::warn("CUDA graph capture failed ({}); this decode shape runs eagerly", why);
    return body();
  }
  e.exec = exec;
  e.signature = signature;
  ++captures_;
  SSM_CUDA_CHECK(cudaGraphLaunch(exec, s));
}

void run_step(const StepFrameArgs& a, const ForwardBatch& batch, StateCache& cache, cudaStream_t s, float* logits,
              int greedy_top, std::vector<GreedyPick>* picks, const DeviceSampleBatch* sample) {
  SSM_CHECK(!sample || (greedy_top < 0 && picks), "device sampling: bad run_step arguments");
  check_batch_against_cache(batch, cache, a.num_state_layers >= 0 ? a.num_state_layers : a.num_layers, a.arch);
  const int64_t T = batch.num_tokens(), H = a.hidden_size, V = a.vocab_size;
  for (int32_t id : batch.input_ids) SSM_CHECK(id >= 0 && id < V, "token id {} outside the vocabulary [0, {})", id, V);
  const int64_t nlog = static_cast<int64_t>(batch.logits_indices.size());
  for (int32_t r : batch.logits_indices) SSM_CHECK(r >= 0 && r < T, "logits row {} outside [0, {})", r, T);
  if (T == 0) return;
  a.states->sync_layout(cache);
  a.reserve(T, nlog);
  // Tensor parallelism with device picks: every rank all-gathers the logits slices into whole rows on the device
  // and runs the same greedy / sampling kernels (no logits to the host).
  const bool tp_picks = a.tp->on() && (greedy_top >= 0 || sample);
  if (tp_picks) a.tp->reserve_gather(nlog, V);
  const int K = a.num_steps;
  SSM_CHECK(K >= 1, "multi-step decode: {} steps", K);
  SSM_CHECK(K == 1 || (greedy_top >= 0 && !sample && batch.meta.num_prefills == 0 && nlog > 0),
            "multi-step decode needs a decode-only batch of greedy rows (prefills {}, logits rows {})",
            batch.meta.num_prefills, nlog);
  if (K > 1) {
    a.frame->picks.get(K * nlog * sizeof(GreedyRow));
    a.frame->next_ids.get(T * sizeof(int32_t));
  }
  const StepMeta dm = a.meta->upload(batch, s);
  auto body = [&] {
    auto* next_ids = K > 1 ? static_cast<int32_t*>(a.frame->next_ids.get(T * sizeof(int32_t))) : nullptr;
    for (int j = 0; j < K; ++j) {
      StepMeta dj = dm;
      if (j > 0) dj.input_ids = next_ids;  // the previous step's picks (fed by its greedy kernel)
      float* hidden = a.hidden->f32(T * H);
      a.frame->embed(dj, T, H, hidden, s);
      for (int l = 0; l < a.num_layers; ++l) a.mixer(l, dj, T);
      a.frame->enqueue_head(dj, T, H, a.tp->vocab_per_rank(V), a.eps,
                            a.num_layers > 0 && a.last_out_pending ? a.out->f32(T * H) : nullptr,
                            hidden, nlog, *a.gemm, s, a.last_out_alpha, a.last_out_beta);
      if (tp_picks) a.tp->gather_logits_device(*a.frame, nlog, V, s);
      // Steps before the last: rows without a logits row (padding) keep their ids; the greedy kernel writes each
      // row's pick into the next step's input ids.
      if (j == 0 && K > 1)
        SSM_CUDA_CHECK(cudaMemcpyAsync(next_ids, dm.input_ids, T * sizeof(int32_t), cudaMemcpyDeviceToDevice, s));
      const GreedyFeed feed{dm.logits_indices, next_ids};
      if (greedy_top >= 0) a.frame->enqueue_greedy(nlog, V, greedy_top, s, j * nlog, j + 1 < K ? &feed : nullptr);
    }
  };
  const bool verify = batch.meta.spec_cols > 1;  // speculative verify rows (several tokens per decode row)
  if (a.cuda_graphs && batch.meta.num_prefills == 0 && (!verify || a.capture_verify)) {
    std::vector<const void*> ptrs = {a.meta->device_buffer()};
    for (const Scratch* sc : a.scratch) ptrs.push_back(sc->buf.data());
    a.frame->pointers(ptrs);
    a.states->pointers(ptrs);
    if (tp_picks) ptrs.push_back(a.tp->gathered.buf.data());
    if (a.pointers) a.pointers(ptrs);
    // T < 2^21 (kMaxNumBatchedTokens), so bits 56.. of the key are free for the step count.
    const uint64_t key = step_key(T, nlog, greedy_top, tp_picks) | (static_cast<uint64_t>(K - 1) << 56);
    // A verify step's kernels also depend on its row count and state columns (rows < 2^20, columns <= 17).
    const uint64_t rows_key = verify ? (static_cast<uint64_t>(batch.meta.num_decode_rows()) << 32) |
                                           (static_cast<uint64_t>(batch.meta.spec_cols) << 52)
                                     : 0;
    a.graphs->run(s, {key, a.key_extra ^ rows_key}, pointer_signature(ptrs), body);
  } else {
    body();
  }
  if (sample) {
    a.frame->enqueue_sample(nlog, V, *sample, s);
    a.frame->download_sample(nlog, V, *sample, *picks, s);
  } else if (greedy_top >= 0) a.frame->download_greedy(K * nlog, greedy_top, *picks, s);
  else if (a.tp->on()) a.tp->gather_logits(*a.frame, nlog, V, logits, s);
  else a.frame->download(nlog, V, logits, s);
}

void CudaCausalLM::forward(const ForwardBatch& batch, StateCache& cache, float* logits) {
  step(batch, cache, logits, -1, nullptr, nullptr);
}

bool CudaCausalLM::forward_greedy(const ForwardBatch& batch, StateCache& cache, int num_top,
                                  std::vector<GreedyPick>& out) {
  if (!device_greedy()) return false;
  SSM_CHECK(num_top >= 0 && num_top <= kMaxDeviceGreedyTop, "greedy top log-probabilities {} outside [0, {}]", num_top,
            kMaxDeviceGreedyTop);
  step(batch, cache, nullptr, num_top, &out, nullptr);  // (tensor parallel: on the all-gathered logits)
  return true;
}

bool CudaCausalLM::forward_greedy_steps(const ForwardBatch& batch, StateCache& cache, int num_top, int num_steps,
                                        std::vector<GreedyPick>& out) {
  if (!device_greedy()) return false;
  SSM_CHECK(num_top >= 0 && num_top <= kMaxDeviceGreedyTop, "greedy top log-probabilities {} outside [0, {}]", num_top,
            kMaxDeviceGreedyTop);
  SSM_CHECK(num_steps >= 1 && num_steps <= 255, "multi-step decode: num_steps {} outside [1, 255]", num_steps);
  num_steps_ = num_steps;
  try {
    step(batch, cache, nullptr, num_top, &out, nullptr);
  } catch (...) {
    num_steps_ = 1;
    throw;
  }
  num_steps_ = 1;
  return true;
}

bool CudaCausalLM::forward_sample(const ForwardBatch& batch, StateCache& cache, const DeviceSampleBatch& sample,
                                  std::vector<GreedyPick>& out) {
  out.clear();  // (tensor parallel: every rank samples the all-gathered logits)
  step(batch, cache, nullptr, -1, &out, &sample);
  return true;
}

}  // namespace ssmserve::cuda
