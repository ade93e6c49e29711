// Prefix caching's "all"-mode state stores on the GPU (issue 28; kernels/cuda/state_stores.h): the block each store
// writes against the CPU's stored block. The CPU mixers store by running a prefill row as pieces split at the store
// offsets (model/mixers/prefill_segments.h), so the reference of a store after `o` tokens of row r is the CPU kernel
// run over the row's first o tokens from the row's initial state (conv windows, Mamba-1 scan), or the CPU SSD's
// chunk-end state of the chunk the store ends (the same computation: the store offsets end chunks). Every store
// block of a null row stays untouched. Also the host side: the per-chunk store blocks the runner uploads. The GPU
// cases skip without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cpu/ssd.h"
#include "kernels/cuda/causal_conv1d.h"
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
