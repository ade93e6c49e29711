// Prefix caching's "all"-mode state stores on the GPU (issue 28; kernels/cuda/state_stores.h): the block each store
// writes against the CPU's stored block. The CPU mixers store by running a prefill row as pieces split at the store
// offsets (model/mixers/prefill_segments.h), so the reference of a store after `o` tokens of row r is the CPU kernel
// run over the row's first o tokens from the row's initial state (conv windows, Mamba-1 scan), or the CPU SSD's
// chunk-end state of the chunk the store ends (the same computation: the store offsets end chunks); lightning
// attention and the gated delta rule likewise against their CPU prefill over the row's first o tokens (from the row's
// computed tokens and initial state). Every store block of a null row stays untouched. Also the host side: the
// per-chunk store blocks the runner uploads, the lightning plan's cuts at the stores. The GPU cases skip without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/lightning.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cpu/ssd.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/kernel_tuning.h"
#include "kernels/cuda/lightning.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/ssd.h"
#include "kernels/cuda/state_stores.h"
#include "model/batch_metadata.h"
#include "runtime/runner_common.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// Host store list over a Batch: row r stores after each of offsets[r] tokens, into blocks first_block, +1, ...
struct Stores {
  std::vector<int32_t> start{0}, offset, block, row;
  int num() const { return static_cast<int>(offset.size()); }
};
Stores make_stores(const std::vector<std::vector<int>>& offsets, int first_block) {
  Stores s;
  for (size_t r = 0; r < offsets.size(); ++r) {
    for (int o : offsets[r]) s.offset.push_back(o), s.block.push_back(first_block++), s.row.push_back(static_cast<int>(r));
    s.start.push_back(s.num());
  }
  return s;
}
/// Device copies of `s` (kept alive by the struct).
struct DevStores {
  DeviceBuffer start, offset, block, row;
  explicit DevStores(const Stores& s)
      : start(to_device(s.start)), offset(to_device(s.offset)), block(to_device(s.block)), row(to_device(s.row)) {}
  cuda::DevStateStores view(const Stores& s) const {
    return {s.num(), start.as<int32_t>(), offset.as<int32_t>(), block.as<int32_t>(), row.as<int32_t>()};
  }
};

/// Copies host block src of `pool` into block dst (the CPU's piece continues from the row's state in the store block).
void copy_host_block(StatePool& pool, int src, int dst) {
  const size_t n = static_cast<size_t>(pool.block_elems) * dtype_size(pool.dtype);
  std::memcpy(pool.host.data() + dst * n, pool.host.data() + src * n, n);
}
std::vector<int32_t> all_blocks(int n) {
  std::vector<int32_t> v;
  for (int b = 1; b < n; ++b) v.push_back(b);
  return v;
}

/// Sequence-aligned chunks over `b` (a row with an initial state starts `cut` tokens short of chunk_size, as a
/// continuing prefill whose computed tokens are not a multiple of the chunk; 0 = a full first chunk).
struct Chunks {
  std::vector<int32_t> cu{0}, seq_idx, last;
};
Chunks make_chunks(const Batch& b, int chunk_size, int cut) {
  Chunks c;
  for (int s = 0; s < b.num_seqs(); ++s) {
    int32_t t = b.query_start_loc[s];
    int first = b.has_initial_states[s] ? chunk_size - cut : chunk_size;
    while (t < b.query_start_loc[s + 1]) {
      t += std::min<int32_t>(first, b.query_start_loc[s + 1] - t);
      c.cu.push_back(t), c.seq_idx.push_back(s);
      first = chunk_size;
    }
    c.last.push_back(static_cast<int32_t>(c.seq_idx.size()) - 1);
  }
  return c;
}

// ---- conv windows -----------------------------------------------------------------------------------------------

void check_conv_stores(std::mt19937& rng, int64_t dim, int width, DType dtype, const Batch& b,
                       const std::vector<std::vector<int>>& offsets) {
  const int64_t T = b.num_tokens(), xs = dim + 16, os = dim + 1;
  const int nseq = b.num_seqs(), S = width - 1;
  const Stores st = make_stores(offsets, nseq + 1);
  const int nblocks = nseq + 1 + st.num();
  StatePool pool(dtype, S * dim, nblocks, rng);
  auto w = rand_vec(rng, dim * width, -0.5f, 0.5f), bias = rand_vec(rng, dim, -0.2f, 0.2f), x = rand_vec(rng, T * xs);
  cpu::ConvParams cp{dim, width, w.data(), bias.data(), pool.host_view(), true};
  std::vector<float> scratch(T * os);
  for (int i = 0; i < st.num(); ++i) {  // the CPU's pieces: the row's first `offset` tokens from its window
    const int r = st.row[i];
    if (b.state_indices[r] == 0) continue;
    copy_host_block(pool, b.state_indices[r], st.block[i]);
    const std::vector<int32_t> q{0, st.offset[i]}, blk{st.block[i]};
    const std::vector<uint8_t> init{b.has_initial_states[r]};
    cpu::causal_conv1d_fwd(x.data() + b.query_start_loc[r] * xs, xs, scratch.data(), os, cp, sp(q), sp(blk), sp(init));
  }
  cpu::causal_conv1d_fwd(x.data(), xs, scratch.data(), os, cp, sp(b.query_start_loc), sp(b.state_indices),
                         sp(b.has_initial_states));
  DeviceBuffer dw = to_device(w), dbias = to_device(bias), dx = to_device(x), dout = poisoned(T * os);
  DeviceBuffer dq = to_device(b.query_start_loc), dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states);
  const DevStores ds(st);
  cuda::ConvParams gp{dim, width, dw.as<float>(), dbias.as<float>(), pool.dev_view(), true};
  SSM_CUDA_CHECK(cuda::conv_store_windows(dx.as<float>(), xs, dim, width, pool.dev_view(), dq.as<int32_t>(),
                                          dsi.as<int32_t>(), dh.as<uint8_t>(), ds.view(st), nullptr));
  SSM_CUDA_CHECK(cuda::causal_conv1d_fwd(dx.as<float>(), xs, dout.as<float>(), os, gp, dq.as<int32_t>(), dsi.as<int32_t>(),
                                         dh.as<uint8_t>(), nseq, T, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  // Copies of the same inputs, rounded once to the state dtype: equal to the CPU's windows.
  EXPECT_LT(pool.rel_err_blocks(all_blocks(nblocks)), 1e-7) << "stored and running windows";
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaStateStores, ConvWindowsMatchCpuPieces) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Rows with and without initial states (make_batch alternates), a null row, stores before width - 1 tokens (the
  // window reaches into the row's initial state), consecutive offsets and offsets near the row's end.
  const Batch b = make_batch({9, 37, 64, 20, 5}, {3});
  const std::vector<std::vector<int>> offsets = {{1, 2, 8}, {16, 32, 36}, {1, 3, 63}, {4, 10}, {}};
  for (DType dt : {DType::F32, DType::BF16})
    for (int width : {4, 2, 8}) {
      SCOPED_TRACE(testing::Message() << "state " << dtype_name(dt) << " width " << width);
      check_conv_stores(rng, 200, width, dt, b, offsets);
    }
  check_conv_stores(rng, 1536, 4, DType::F32, b, offsets);  // mamba-130m's conv channels
  // Width 1: no window, nothing to store (and nothing read).
  const Stores st = make_stores(offsets, 7);
  const DevStores ds(st);
  EXPECT_EQ(cuda::conv_store_windows(nullptr, 0, 16, 1, StateView{}, nullptr, nullptr, nullptr, ds.view(st), nullptr),
            cudaSuccess);
  EXPECT_EQ(cuda::conv_store_windows(nullptr, 0, 16, 9, StateView{}, nullptr, nullptr, nullptr, ds.view(st), nullptr),
            cudaErrorInvalidValue);
}

// ---- Mamba-1 selective scan ---------------------------------------------------------------------------------------

/// chunk_size 0: the sequential scan (selective_scan_fwd); else the chunk-parallel scan over chunks of chunk_size.
void check_scan_stores(std::mt19937& rng, const Mamba1Shape& s, DType dtype, const Batch& b,
                       const std::vector<std::vector<int>>& offsets, int chunk_size) {
  const int64_t dim = s.d_inner, T = b.num_tokens();
  const int N = s.d_state, nseq = b.num_seqs();
  const int64_t us = dim + 3, ds_ = dim + 5, bcs = 2 * N + 1, ys = dim + 2;
  const Stores st = make_stores(offsets, nseq + 1);
  const int nblocks = nseq + 1 + st.num();
  auto u = rand_vec(rng, T * us), delta = rand_vec(rng, T * ds_, -4.0f, 1.0f), bc = rand_vec(rng, T * bcs);
  std::vector<float> A(dim * N), D = rand_vec(rng, dim), dbias = rand_vec(rng, dim, -1, 0.5f);
  for (int64_t c = 0; c < dim; ++c)
    for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (c % 97));
  StatePool pool(dtype, dim * N, nblocks, rng, 0.5f);
  cpu::ScanParams cp{dim, N, A.data(), D.data(), dbias.data(), true, pool.host_view()};
  auto inputs_at = [&](int64_t t0) {
    return cpu::ScanInputs{{u.data() + t0 * us, us}, {delta.data() + t0 * ds_, ds_}, {bc.data() + t0 * bcs, bcs},
                           {bc.data() + t0 * bcs + N, bcs}, {nullptr, 0}};
  };
  std::vector<float> scratch(T * ys);
  for (int i = 0; i < st.num(); ++i) {
    const int r = st.row[i];
    if (b.state_indices[r] == 0) continue;
    copy_host_block(pool, b.state_indices[r], st.block[i]);
    const std::vector<int32_t> q{0, st.offset[i]}, blk{st.block[i]};
    const std::vector<uint8_t> init{b.has_initial_states[r]};
    cpu::selective_scan_fwd(inputs_at(b.query_start_loc[r]), cp, scratch.data(), ys, sp(q), sp(blk), sp(init));
  }
  cpu::selective_scan_fwd(inputs_at(0), cp, scratch.data(), ys, sp(b.query_start_loc), sp(b.state_indices),
                          sp(b.has_initial_states));
  DeviceBuffer du = to_device(u), dd = to_device(delta), dbc = to_device(bc), dA = to_device(A), dD = to_device(D),
               dbi = to_device(dbias), dy = poisoned(T * ys);
  DeviceBuffer dq = to_device(b.query_start_loc), dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states);
  cuda::ScanInputs gi{{du.as<float>(), us}, {dd.as<float>(), ds_}, {dbc.as<float>(), bcs}, {dbc.as<float>() + N, bcs},
                      {nullptr, 0}};
  cuda::ScanParams gp{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool.dev_view()};
  const DevStores dst(st);
  const Chunks ch = make_chunks(b, std::max(chunk_size, 1), chunk_size > 3 ? 3 : 0);
  DeviceBuffer dcu = to_device(ch.cu), dseq = to_device(ch.seq_idx), dlast = to_device(ch.last);
  cuda::ChunkMetadataDev gm{nseq, static_cast<int>(ch.seq_idx.size()), dcu.as<int32_t>(), dseq.as<int32_t>(),
                            dlast.as<int32_t>(), dsi.as<int32_t>(), dh.as<uint8_t>(), chunk_size};
  gm.stores = dst.view(st);
  SSM_CUDA_CHECK(cuda::selective_scan_chunked_fwd(gi, gp, dy.as<float>(), ys, gm, dq.as<int32_t>(), nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_LT(pool.rel_err_blocks(all_blocks(nblocks)), dtype == DType::F32 ? 1e-4 : 1e-2) << "stored and final states";
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaStateStores, Mamba1ScanStoresMatchCpuPieces) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Offsets on and off the chunk grid (Mamba-1's blocks need not be multiples of the chunk), several in one chunk.
  const Batch b = make_batch({9, 70, 300, 20, 33}, {3});
  const std::vector<std::vector<int>> offsets = {{1, 8}, {16, 17, 32, 69}, {5, 100, 256, 299}, {4}, {16}};
  for (DType dt : {DType::F32, DType::BF16})
    for (int chunk : {0, 16, 256}) {
      SCOPED_TRACE(testing::Message() << "state " << dtype_name(dt) << " chunk " << chunk);
      check_scan_stores(rng, mamba1_shapes()[0], dt, b, offsets, chunk);
    }
  // d_state 64 (the sequential kernel's several states per lane; the chunked call falls back to it).
  check_scan_stores(rng, {"custom", 64, 200, 64, 4, 8}, DType::F32, b, offsets, 16);
}

// ---- Mamba-2 SSD ----------------------------------------------------------------------------------------------------

enum class SsdForm { Exact, Bf16, Sequential };

/// Stores at the end of every other chunk (null rows' chunks included: their blocks must stay untouched).
void check_ssd_stores(std::mt19937& rng, const Mamba2Shape& s, DType dtype, const Batch& b, SsdForm form) {
  const int H = s.heads, P = s.head_dim, G = s.n_groups, N = s.d_state, nseq = b.num_seqs();
  const int64_t T = b.num_tokens(), HP = s.d_inner(), GN = static_cast<int64_t>(G) * N;
  const int64_t xbc = HP + 2 * GN + 5, dts = H + 7, ys = HP + 1, PN = HP * N;
  auto xBC = rand_vec(rng, T * xbc), dt = rand_vec(rng, T * dts, -5.0f, 1.0f);
  std::vector<float> A(H), D = rand_vec(rng, H), dtb = rand_vec(rng, H, -2.0f, 0.0f);
  for (int h = 0; h < H; ++h) A[h] = -(1.0f + 15.0f * h / H);
  const Chunks ch = make_chunks(b, s.chunk_size, 5);
  const int nchunks = static_cast<int>(ch.seq_idx.size());
  std::vector<int32_t> chunk_store(nchunks, 0);
  int nblocks = nseq + 1;
  for (int c = 0; c < nchunks; c += 2) chunk_store[c] = nblocks++;
  StatePool pool(dtype, PN, nblocks, rng, 0.5f);
  const std::vector<uint8_t> before = pool.host;  // the store blocks' contents before (null rows keep them)
  cpu::SsdInputs ci{{xBC.data(), xbc}, {dt.data(), dts}, {xBC.data() + HP, xbc}, {xBC.data() + HP + GN, xbc}};
  cpu::SsdParams cp{H, P, G, N, A.data(), D.data(), dtb.data(), 0.0f, 0.5f, pool.host_view()};
  cpu::SsdChunkMetadata cm{s.chunk_size, sp(b.query_start_loc), sp(ch.cu), sp(ch.seq_idx), sp(ch.last),
                           sp(b.state_indices), sp(b.has_initial_states)};
  std::vector<float> ref(T * ys, 0.0f), ref_cs(static_cast<size_t>(nchunks) * PN, 0.0f);
  cpu::ssd_chunk_scan_fwd(ci, cp, cm, ref.data(), ys, ref_cs.data());
  DeviceBuffer dxbc = to_device(xBC), ddt = to_device(dt), dA = to_device(A), dD = to_device(D), ddtb = to_device(dtb);
  DeviceBuffer dcu = to_device(ch.cu), dseq = to_device(ch.seq_idx), dlast = to_device(ch.last),
               dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states), dcsb = to_device(chunk_store);
  cuda::SsdInputs gi{{dxbc.as<float>(), xbc}, {ddt.as<float>(), dts}, {dxbc.as<float>() + HP, xbc},
                     {dxbc.as<float>() + HP + GN, xbc}, {}, {}, {}};
  cuda::SsdParams gp{H, P, G, N, dA.as<float>(), dD.as<float>(), ddtb.as<float>(), 0.0f, 0.5f, pool.dev_view()};
  gp.exact_products = form == SsdForm::Exact;
  gp.bf16_products = form == SsdForm::Bf16;
  cuda::SsdChunkMetadataDev gm{nseq, nchunks, dcu.as<int32_t>(), dseq.as<int32_t>(), dlast.as<int32_t>(),
                               dsi.as<int32_t>(), dh.as<uint8_t>(), form == SsdForm::Sequential ? 0 : s.chunk_size};
  gm.chunk_store_blocks = dcsb.as<int32_t>();
  DeviceBuffer dy = poisoned(T * ys);
  SSM_CUDA_CHECK(cuda::ssd_chunk_scan_fwd(gi, gp, gm, dy.as<float>(), ys, nullptr, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  const double tol = form == SsdForm::Bf16 ? 1e-2 : 1e-4, state_tol = dtype == DType::F32 ? tol : 1e-2;
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), state_tol) << "final states";
  std::vector<uint8_t> dev(pool.host.size());
  pool.dev.download(dev.data(), dev.size());
  const StateView dv{dev.data(), dtype, PN}, bv{const_cast<uint8_t*>(before.data()), dtype, PN};
  for (int c = 0; c < nchunks; ++c) {
    if (chunk_store[c] == 0) continue;
    const std::vector<float> got = state_to_f32(dv, chunk_store[c], PN);
    if (b.state_indices[ch.seq_idx[c]] == 0) {
      EXPECT_EQ(got, state_to_f32(bv, chunk_store[c], PN)) << "chunk " << c << " of a null row written";
      continue;
    }
    double num = 0, den = 0;
    for (int64_t i = 0; i < PN; ++i) {
      const double want = ref_cs[c * PN + i];
      num += (got[i] - want) * (got[i] - want), den += want * want;
    }
    EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), state_tol) << "stored state at the end of chunk " << c;
  }
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaStateStores, SsdChunkEndStoresMatchCpuChunkStates) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Batch b = make_batch({5, 130, 1, 200, 64}, {2});
  for (const auto& s : mamba2_shapes())
    for (DType dt : {DType::F32, DType::BF16})
      for (SsdForm f : {SsdForm::Exact, SsdForm::Bf16, SsdForm::Sequential}) {
        SCOPED_TRACE(testing::Message() << s.name << " state " << dtype_name(dt) << " form " << static_cast<int>(f));
        check_ssd_stores(rng, s, dt, b, f);
      }
  check_ssd_stores(rng, {"small-chunks", 64, 6, 20, 3, 16, 4, 8}, DType::F32, make_batch({1, 30, 7, 65}, {}),
                   SsdForm::Exact);
}

// ---- lightning attention ---------------------------------------------------------------------------------------------

/// Lightning prefill of a packed batch (lens, computed tokens nc, null row at null_at) with `offsets` stores per row:
/// the fp32 path (bf16_path false: state passing per block) or the bf16 path (range scan; blocks_per_range bpr). The
/// stored blocks and the final states against the CPU's pieces (the row's first `offset` tokens from its computed
/// tokens and initial state), the outputs against the CPU's uncut rows.
void check_lightning_stores(std::mt19937& rng, int D, int bs, DType dtype, bool bf16_path, int bpr,
                            const std::vector<int32_t>& lens, const std::vector<int32_t>& nc, int null_at,
                            const std::vector<std::vector<int>>& offsets) {
  const int H = 4, nseq = static_cast<int>(lens.size());
  std::vector<int32_t> qsl{0}, idx;
  for (int s = 0; s < nseq; ++s) qsl.push_back(qsl.back() + lens[s]), idx.push_back(s == null_at ? 0 : s + 1);
  const int64_t T = qsl.back(), qs = 3LL * H * D + 8, os = static_cast<int64_t>(H) * D + 8;
  const Stores st = make_stores(offsets, nseq + 1);
  const int nblocks = nseq + 1 + st.num();
  std::vector<float> slopes;
  for (int h = 0; h < H; ++h) slopes.push_back(std::vector<float>{0.95f, 0.3f, 0.05f, 0.001f}[h % 4]);
  StatePool pool(dtype, static_cast<int64_t>(H) * D * D, nblocks, rng, 0.5f);
  auto qkv = rand_vec(rng, T * qs);
  round_bf16(qkv);  // bf16-valued inputs: both paths see the CPU's values
  const cpu::LightningParams cp{H, D, bs, slopes.data(), pool.host_view()};
  std::vector<float> ref(T * os, 0.0f), scratch(T * os);
  for (int i = 0; i < st.num(); ++i) {
    const int r = st.row[i];
    if (idx[r] == 0) continue;
    copy_host_block(pool, idx[r], st.block[i]);
    const std::vector<int32_t> q{0, st.offset[i]}, c{nc[r]}, blk{st.block[i]};
    cpu::lightning_prefill(qkv.data() + qsl[r] * qs, qs, scratch.data(), os, cp, q, c, blk);
  }
  cpu::lightning_prefill(qkv.data(), qs, ref.data(), os, cp, qsl, nc, idx);
  const auto plan = cuda::LightningPlan::build(qsl, nc, bs, bpr, st.start, st.offset, st.block);
  ASSERT_TRUE(plan.has_stores());
  DeviceBuffer dslopes = to_device(slopes), db = to_device(plan.blocks), df = to_device(plan.seq_first_block),
               dqt = to_device(plan.qtiles), di = to_device(idx), dn = to_device(nc), dr = to_device(plan.ranges),
               dfr = to_device(plan.seq_first_range), dbr = to_device(plan.block_range),
               dbs = to_device(plan.block_store), drs = to_device(plan.range_store);
  DeviceBuffer ws(std::max<size_t>(16, cuda::lightning_workspace_floats(plan.num_blocks, H, D) * 4));
  const cuda::LightningDevParams gp{H, D, bs, dslopes.as<float>(), pool.dev_view()};
  cuda::LightningPlanDev pd{plan.num_seqs,      plan.num_blocks,    plan.num_qtiles,    db.as<int32_t>(),
                            df.as<int32_t>(),   dqt.as<int32_t>(),  di.as<int32_t>(),   dn.as<int32_t>(),
                            plan.num_ranges,    dr.as<int32_t>(),   dfr.as<int32_t>(),  dbr.as<int32_t>(),
                            dbs.as<int32_t>(),  drs.as<int32_t>()};
  DeviceBuffer dout = poisoned(T * os);
  if (bf16_path) {
    DeviceBuffer dq16 = to_device(to_bf16_bits(qkv));
    SSM_CUDA_CHECK(cuda::lightning_prefill_bf16(static_cast<const __nv_bfloat16*>(dq16.data()), qs, dout.as<float>(), os,
                                                gp, pd, ws.as<float>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
  } else {
    DeviceBuffer dq = to_device(qkv);
    SSM_CUDA_CHECK(cuda::lightning_prefill(dq.as<float>(), qs, dout.as<float>(), os, gp, pd, ws.as<float>(), nullptr));
    SSM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // The tolerances of test_cuda_minimax_ops (bf16 path: one bf16 operand per product; bf16 states: their rounding).
  const double tol = bf16_path ? 2e-2 : dtype == DType::F32 ? 1e-4 : 1e-2;
  const double state_tol = bf16_path || dtype != DType::F32 ? 1e-2 : 1e-4;
  const auto got = to_host<float>(dout, T * os);
  for (int s = 0; s < nseq; ++s)
    if (idx[s] != 0)
      EXPECT_LT(rel_err(got.data() + qsl[s] * os, os, ref.data() + qsl[s] * os, os, lens[s], H * D), tol)
          << "out of sequence " << s;
  for (int i = 0; i < st.num(); ++i)  // each store on its own, so a wrong one is not hidden by the others
    EXPECT_LT(pool.rel_err_blocks({st.block[i]}), idx[st.row[i]] ? state_tol : 1e-30)
        << "store " << i << " (row " << st.row[i] << ", offset " << st.offset[i] << ")";
  EXPECT_LT(pool.rel_err_blocks(idx), state_tol) << "final states";
  EXPECT_TRUE(pool.null_block_intact());
}

void check_lightning_all(std::mt19937& rng, bool bf16_path) {
  // Row 0 fresh; row 1 continues from 100 tokens (its stores at sequence positions 256 and 512: offsets 156, 412);
  // row 2 is null; row 3 continues from 64 with stores off the block grid (cuts inside blocks) and one token apart;
  // row 4 has no store; row 5 stores after its first token.
  const std::vector<int32_t> lens{700, 520, 300, 400, 90, 257}, nc{0, 100, 0, 64, 7, 256};
  const std::vector<std::vector<int>> offsets = {{256, 512}, {156, 412}, {64, 200}, {1, 2, 192, 300}, {}, {1, 256}};
  for (int D : {64, 128})
    for (DType dt : {DType::F32, DType::BF16})
      for (int bpr : bf16_path ? std::vector<int>{1, 3} : std::vector<int>{1}) {
        SCOPED_TRACE(testing::Message() << "D=" << D << " state " << dtype_name(dt) << " blocks_per_range " << bpr);
        check_lightning_stores(rng, D, 256, dt, bf16_path, bpr, lens, nc, 2, offsets);
      }
  // Block size 64 (several blocks between stores).
  check_lightning_stores(rng, 64, 64, DType::F32, bf16_path, bf16_path ? 2 : 1, lens, nc, 2, offsets);
}

TEST(CudaStateStores, LightningFp32PathStoresMatchCpuPieces) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  check_lightning_all(rng, false);
}

// The stores come from the range scan, which every step-3 variant shares; the variants' outputs follow the cut ranges.
TEST(CudaStateStores, LightningBf16PathStoresMatchCpuPieces) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const cuda::KernelTuning saved = cuda::kernel_tuning();
  for (int walk : {2, 1, 0}) {  // warpgroup walk (head_dim 128), mma.sync walk, block states + per-tile outputs
    SCOPED_TRACE(testing::Message() << "lightning_walk " << walk);
    cuda::KernelTuning t = saved;
    t.lightning_walk = walk;
    cuda::set_kernel_tuning(t);
    check_lightning_all(rng, true);
  }
  cuda::set_kernel_tuning(saved);
}

// ---- gated delta rule ------------------------------------------------------------------------------------------------

/// Gated DeltaNet prefill (the two-pass form the GPU module runs) of a packed batch with `offsets` stores per row
/// (offsets end chunks of 64 counted from the sequence start: nc + offset a multiple of 64): stored blocks and final
/// states against the CPU's pieces, outputs against the CPU's uncut rows.
void check_gated_delta_stores(std::mt19937& rng, int Hk, int Hv, int Dk, int Dv, DType dtype,
                              cuda::GatedDeltaPrecision prec, const std::vector<int32_t>& lens,
                              const std::vector<int32_t>& nc, int null_at, const std::vector<std::vector<int>>& offsets) {
  constexpr int kChunk = 64;
  const int nseq = static_cast<int>(lens.size());
  std::vector<int32_t> qsl{0}, idx;
  for (int s = 0; s < nseq; ++s) qsl.push_back(qsl.back() + lens[s]), idx.push_back(s == null_at ? 0 : s + 1);
  for (int s = 0; s < nseq; ++s)
    for (int o : offsets[s]) ASSERT_EQ((nc[s] + o) % kChunk, 0) << "test setup: store off the chunk grid";
  const int64_t T = qsl.back(), qs = int64_t{Hk} * Dk + 4, ks = int64_t{Hk} * Dk + 8, vs = int64_t{Hv} * Dv + 4;
  const int64_t gs = Hv + 3, bts = Hv + 1, os = int64_t{Hv} * Dv + 4;
  auto q = rand_vec(rng, T * qs), k = rand_vec(rng, T * ks), v = rand_vec(rng, T * vs);
  auto g = rand_vec(rng, T * gs, -6.0f, 1.0f), beta = rand_vec(rng, T * bts, 0.0f, 1.0f);
  for (auto& x : g) x = -std::exp(x);
  const auto normalize = [](float* x, int n, double scale) {
    double ss = 0;
    for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * scale / std::sqrt(ss + 1e-6));
  };
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hk; ++h) {
      normalize(q.data() + t * qs + int64_t{h} * Dk, Dk, 1.0 / std::sqrt(double(Dk)));
      normalize(k.data() + t * ks + int64_t{h} * Dk, Dk, 1.0);
    }
  const Stores st = make_stores(offsets, nseq + 1);
  const int nblocks = nseq + 1 + st.num();
  StatePool pool(dtype, int64_t{Hv} * Dk * Dv, nblocks, rng, 0.5f);
  const auto host_in = [&](int64_t r0) {
    return cpu::GatedDeltaInputs{q.data() + r0 * qs, qs, k.data() + r0 * ks, ks, v.data() + r0 * vs, vs,
                                 g.data() + r0 * gs, gs, beta.data() + r0 * bts, bts};
  };
  const cpu::GatedDeltaParams cp{Hk, Hv, Dk, Dv, kChunk, pool.host_view()};
  std::vector<float> ref(T * os, 0.0f), scratch(T * os);
  for (int i = 0; i < st.num(); ++i) {
    const int r = st.row[i];
    if (idx[r] == 0) continue;
    copy_host_block(pool, idx[r], st.block[i]);
    const std::vector<int32_t> qq{0, st.offset[i]}, c{nc[r]}, blk{st.block[i]};
    cpu::gated_delta_prefill(host_in(qsl[r]), cp, scratch.data(), os, qq, c, blk);
  }
  cpu::gated_delta_prefill(host_in(0), cp, ref.data(), os, qsl, nc, idx);
  DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dg = to_device(g), dbt = to_device(beta);
  DeviceBuffer dqsl = to_device(qsl), dn = to_device(nc), di = to_device(idx);
  const cuda::GatedDeltaInputs gi{dq.as<float>(), qs, dk.as<float>(), ks, dv.as<float>(), vs,
                                  dg.as<float>(), gs, dbt.as<float>(), bts};
  const cuda::GatedDeltaParams gp{Hk, Hv, Dk, Dv, kChunk, pool.dev_view()};
  const DevStores dst(st);
  DeviceBuffer ws = poisoned(std::max<size_t>(4, cuda::gated_delta_prefill_workspace_floats(T, nseq, gp)));
  DeviceBuffer dout = poisoned(T * os);
  SSM_CUDA_CHECK(cuda::gated_delta_prefill_two_pass(gi, gp, dout.as<float>(), os, dqsl.as<int32_t>(), dn.as<int32_t>(),
                                                    di.as<int32_t>(), nseq, T, ws.as<float>(), nullptr, prec,
                                                    dst.view(st)));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  const bool tf32 = prec == cuda::GatedDeltaPrecision::kTf32;
  // Looser than test_cuda_gated_delta_ops (2e-5 / 5e-3 / 1e-3): longer rows, TF32 with bf16 states.
  const double tol = tf32 ? 1e-2 : dtype == DType::F32 ? 1e-4 : 1e-3;
  const double state_tol = tf32 ? 1e-2 : dtype == DType::F32 ? 1e-4 : 5e-3;
  const auto got = to_host<float>(dout, T * os);
  for (int s = 0; s < nseq; ++s)
    if (idx[s] != 0)
      EXPECT_LT(rel_err(got.data() + qsl[s] * os, os, ref.data() + qsl[s] * os, os, lens[s], int64_t{Hv} * Dv), tol)
          << "out of sequence " << s;
  for (int i = 0; i < st.num(); ++i)
    EXPECT_LT(pool.rel_err_blocks({st.block[i]}), idx[st.row[i]] ? state_tol : 1e-30)
        << "store " << i << " (row " << st.row[i] << ", offset " << st.offset[i] << ")";
  EXPECT_LT(pool.rel_err_blocks(idx), state_tol) << "final states";
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaStateStores, GatedDeltaStoresMatchCpuPieces) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Row 0 fresh with stores at every chunk end and later ones; row 1 continues from 40 tokens (stores at positions
  // 64, 128, 256: offsets 24, 88, 216); row 2 null; row 3 continues from 128 (a chunk boundary); row 4 no store;
  // row 5 a single chunk plus one token.
  const std::vector<int32_t> lens{300, 250, 200, 130, 50, 65}, nc{0, 40, 0, 128, 3, 0};
  const std::vector<std::vector<int>> offsets = {{64, 128, 192, 256}, {24, 88, 216}, {64, 128}, {64}, {}, {64}};
  struct Shape {
    int Hk, Hv, Dk, Dv;
  };
  // Each walk of KernelTuning::gdn_walk: 2 (the default: 32-column tiles at this small grid), 1 (64-column tiles
  // with the prefetch), 0 (the previous walk).
  const cuda::KernelTuning saved = cuda::kernel_tuning();
  for (int walk : {2, 1, 0}) {
    cuda::KernelTuning t = saved;
    t.gdn_walk = walk;
    cuda::set_kernel_tuning(t);
    for (const Shape sh : {Shape{4, 8, 32, 32}, Shape{2, 4, 128, 128}, Shape{2, 4, 64, 96}})
      for (DType dt : {DType::F32, DType::BF16})
        for (auto prec : {cuda::GatedDeltaPrecision::kFp32, cuda::GatedDeltaPrecision::kTf32}) {
          SCOPED_TRACE(testing::Message() << "gdn_walk " << walk << " Hk " << sh.Hk << " Hv " << sh.Hv << " Dk "
                                          << sh.Dk << " Dv " << sh.Dv << " state " << dtype_name(dt) << " tf32 "
                                          << (prec == cuda::GatedDeltaPrecision::kTf32));
          check_gated_delta_stores(rng, sh.Hk, sh.Hv, sh.Dk, sh.Dv, dt, prec, lens, nc, 2, offsets);
        }
  }
  cuda::set_kernel_tuning(saved);
}

// ---- host side: the lightning plan's cuts at the stores ----------------------------------------------------------------

TEST(LightningPlanStores, StoresCutBlocksAndEndRanges) {
  // Row 0: 600 fresh tokens, stores at 256 (on the grid) and 300 (inside a block); row 1: 100 tokens from 200
  // computed, a store after 56 (position 256, on the grid); block 256, 4 blocks per range.
  const std::vector<int32_t> qsl{0, 600, 700}, nc{0, 200}, start{0, 2, 3}, offset{256, 300, 56}, block{7, 8, 9};
  const auto p = cuda::LightningPlan::build(qsl, nc, 256, 4, start, offset, block);
  // Row 0: [0, 256) [256, 300) [300, 512) [512, 600); row 1: [600, 656) [656, 700).
  EXPECT_EQ(p.blocks, (std::vector<int32_t>{0, 256, 0, 256, 44, 0, 300, 212, 0, 512, 88, 0, 600, 56, 1, 656, 44, 1}));
  EXPECT_EQ(p.block_store, (std::vector<int32_t>{7, 8, 0, 0, 9, 0}));
  // Ranges end at the stores: {0}, {1}, {2, 3}; {4}, {5}.
  EXPECT_EQ(p.ranges, (std::vector<int32_t>{0, 1, 256, 1, 1, 44, 2, 2, 300, 4, 1, 56, 5, 1, 44}));
  EXPECT_EQ(p.range_store, (std::vector<int32_t>{7, 8, 0, 9, 0}));
  EXPECT_EQ(p.seq_first_range, (std::vector<int32_t>{0, 3, 5}));
  EXPECT_EQ(p.block_range, (std::vector<int32_t>{0, 0, 1, 0, 2, 0, 2, 212, 3, 0, 4, 0}));
  // Without stores: the plain plan, no store arrays.
  const auto q = cuda::LightningPlan::build(qsl, nc, 256, 4);
  EXPECT_FALSE(q.has_stores());
  EXPECT_EQ(q.num_blocks, 5);
  EXPECT_EQ(q.num_ranges, 2);
  // Malformed stores: not increasing, at the row's end, block 0.
  EXPECT_THROW(cuda::LightningPlan::build(qsl, nc, 256, 4, start, std::vector<int32_t>{300, 256, 56}, block), Error);
  EXPECT_THROW(cuda::LightningPlan::build(qsl, nc, 256, 4, start, std::vector<int32_t>{256, 300, 100}, block), Error);
  EXPECT_THROW(cuda::LightningPlan::build(qsl, nc, 256, 4, start, offset, std::vector<int32_t>{7, 0, 9}), Error);
}

// ---- host side: the per-chunk store blocks the runner uploads ---------------------------------------------------------

TEST(StepMetaStores, ChunkStoreBlocksFollowTheChunks) {
  // Row 0 continues from 40 computed tokens (chunks of 64 from the sequence start: 24, 64, 64, ...), row 1 is fresh.
  const StateStore s0[] = {{24, 7}, {88, 8}}, s1[] = {{64, 9}};
  std::vector<ScheduledSeq> seqs = {{1, 40, 150, true, {}, s0}, {2, 0, 100, true, {}, s1}};
  MetadataOptions opt;
  opt.chunk_size = 64;
  const MambaBatchMetadata md = build_mamba_metadata(seqs, opt);
  std::vector<int32_t> chunk_store, row;
  EXPECT_TRUE(cuda::chunk_store_blocks(md, chunk_store, row));
  ASSERT_EQ(md.num_chunks(), 5);  // row 0: 24, 64, 62; row 1: 64, 36
  EXPECT_EQ(chunk_store, (std::vector<int32_t>{7, 8, 0, 9, 0}));
  EXPECT_EQ(row, (std::vector<int32_t>{0, 0, 1}));
  // An offset inside a chunk (Mamba-1 block sizes need not be multiples of the chunk): no chunk entry, and reported.
  const StateStore s2[] = {{30, 7}};
  seqs = {{1, 40, 150, true, {}, s2}};
  EXPECT_FALSE(cuda::chunk_store_blocks(build_mamba_metadata(seqs, opt), chunk_store, row));
  EXPECT_EQ(chunk_store, (std::vector<int32_t>{0, 0, 0}));
  // No stores: nothing.
  seqs = {{1, 40, 150, true}};
  EXPECT_TRUE(cuda::chunk_store_blocks(build_mamba_metadata(seqs, opt), chunk_store, row));
  EXPECT_TRUE(chunk_store.empty() && row.empty());
}

}  // namespace
}  // namespace ssmserve
