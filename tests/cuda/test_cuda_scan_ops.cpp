// GPU op harness, the scans: Mamba-1's selective scan (prefill whole or chunk-parallel, bf16 y, decode and the
// large-batch decode kernel) and Mamba-2's SSD (the chunked tensor-core forms: exact 3xTF32, one TF32 pass, bf16
// tiles, the caller's bf16 copies; the sequential walk; decode and the wide-state decode kernel) against their CPU
// kernels (the reference) on named model shapes and the edge-case schedules of cuda_test_util.h, with fresh random
// inputs per run and poisoned outputs. The other ops are test_cuda_ops.cpp. Skips without a GPU.
// SSMSERVE_CUDA_TEST_QUICK=1 keeps the small shapes only (the compute-sanitizer runs of scripts/gpu-check.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "cuda_test_util.h"
#include "kernels/cpu/selective_scan.h"
#include "kernels/cpu/ssd.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/ssd.h"
#include "device/cuda_check.h"

namespace ssmserve {
namespace {
using namespace cudatest;
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

// ---- Mamba-1 selective scan -------------------------------------------------------------------------------------

/// Chunk metadata over `b`: sequence s's first chunk is cut `offset[s]` tokens short (a continuing prefill
/// whose computed tokens are not a multiple of chunk_size), the rest at chunk_size.
struct Chunks {
  std::vector<int32_t> cu{0}, seq_idx, last;
};
Chunks make_chunks(const Batch& b, int chunk_size, std::mt19937& rng) {
  Chunks c;
  std::uniform_int_distribution<int> off(0, chunk_size - 1);
  for (int s = 0; s < b.num_seqs(); ++s) {
    int32_t t = b.query_start_loc[s];
    const int32_t end = b.query_start_loc[s + 1];
    int first = b.has_initial_states[s] ? chunk_size - off(rng) : chunk_size;
    while (t < end) {
      const int32_t n = std::min<int32_t>(first, end - t);
      t += n;
      c.cu.push_back(t);
      c.seq_idx.push_back(s);
      first = chunk_size;
    }
    c.last.push_back(static_cast<int32_t>(c.seq_idx.size()) - 1);
  }
  return c;
}

/// chunk_size 0: selective_scan_fwd over query_start_loc; else selective_scan_chunked_fwd over chunks of at most
/// chunk_size tokens (first chunk of sequences with initial states cut short at random, as a continuing prefill).
/// y_dtype BF16: the chunked form writing bf16 y (bf16 tolerance). wide_decode: the decode step through
/// selective_state_update_wide (the large-batch kernel) instead of selective_state_update.
void check_scan(std::mt19937& rng, const Mamba1Shape& s, DType state_dtype, const Batch& b, bool with_z,
                int chunk_size = 0, DType y_dtype = DType::F32, bool wide_decode = false) {
  const int64_t dim = s.d_inner, T = b.num_tokens();
  const int N = s.d_state;
  // Packed like the model: u, delta, z slices of wider rows; B and C slices of x_proj's output.
  const int64_t us = dim + 3, ds = dim + 5, bcs = s.dt_rank + 2 * N, zs = 2 * dim, ys = dim + 2;
  auto u = rand_vec(rng, T * us), delta = rand_vec(rng, T * ds, -4.0f, 1.0f), bc = rand_vec(rng, T * bcs),
       z = rand_vec(rng, T * zs, -3, 3);
  std::vector<float> A(dim * N), D = rand_vec(rng, dim), dbias = rand_vec(rng, dim, -1, 0.5f);
  for (int64_t c = 0; c < dim; ++c)
    for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (c % 97));
  StatePool pool(state_dtype, dim * N, b.num_seqs() + 1, rng, 0.5f);
  DeviceBuffer du = to_device(u), dd = to_device(delta), dbc = to_device(bc), dz = to_device(z), dA = to_device(A),
               dD = to_device(D), dbi = to_device(dbias);
  DeviceBuffer dq = to_device(b.query_start_loc), dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states);
  cpu::ScanInputs ci{{u.data(), us}, {delta.data(), ds}, {bc.data() + s.dt_rank, bcs}, {bc.data() + s.dt_rank + N, bcs},
                     {with_z ? z.data() + dim : nullptr, zs}};
  cuda::ScanInputs gi{{du.as<float>(), us}, {dd.as<float>(), ds}, {dbc.as<float>() + s.dt_rank, bcs},
                      {dbc.as<float>() + s.dt_rank + N, bcs}, {with_z ? dz.as<float>() + dim : nullptr, zs}};
  cpu::ScanParams cp{dim, N, A.data(), D.data(), dbias.data(), true, pool.host_view()};
  cuda::ScanParams gp{dim, N, dA.as<float>(), dD.as<float>(), dbi.as<float>(), true, pool.dev_view()};
  const double tol = 1e-4, state_tol = state_dtype == DType::F32 ? 1e-4 : 1e-2;

  std::vector<float> ref(T * ys, 0.0f);
  cpu::selective_scan_fwd(ci, cp, ref.data(), ys, sp(b.query_start_loc), sp(b.state_indices), sp(b.has_initial_states));
  DeviceBuffer dy = poisoned(T * ys);
  if (chunk_size == 0) {
    SSM_CUDA_CHECK(cuda::selective_scan_fwd(gi, gp, dy.as<float>(), ys, dq.as<int32_t>(), dsi.as<int32_t>(),
                                            dh.as<uint8_t>(), b.num_seqs(), nullptr));
  } else {
    Chunks ch = make_chunks(b, chunk_size, rng);
    DeviceBuffer dcu = to_device(ch.cu), dseq = to_device(ch.seq_idx), dlast = to_device(ch.last);
    const cuda::ChunkMetadataDev gm{b.num_seqs(), static_cast<int>(ch.seq_idx.size()), dcu.as<int32_t>(),
                                    dseq.as<int32_t>(), dlast.as<int32_t>(), dsi.as<int32_t>(), dh.as<uint8_t>(),
                                    chunk_size};
    if (y_dtype == DType::F32)
      SSM_CUDA_CHECK(cuda::selective_scan_chunked_fwd(gi, gp, dy.as<float>(), ys, gm, dq.as<int32_t>(), nullptr));
    else
      SSM_CUDA_CHECK(cuda::selective_scan_chunked_fwd_out(gi, gp, dy.data(), y_dtype, ys, gm, dq.as<int32_t>(),
                                                          nullptr));
  }
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto mask = b.token_mask();
  if (y_dtype == DType::BF16) {
    auto raw = to_host<uint16_t>(dy, T * ys);
    std::vector<float> got16(T * ys);
    for (int64_t i = 0; i < T * ys; ++i) got16[i] = bf16_to_f32(raw[i]);
    EXPECT_LT(rel_err(got16.data(), ys, ref.data(), ys, T, dim, &mask), 5e-3) << "prefill y (bf16)";
  } else {
    auto got = to_host<float>(dy, T * ys);
    EXPECT_LT(rel_err(got.data(), ys, ref.data(), ys, T, dim, &mask), tol) << "prefill y";
    EXPECT_TRUE(untouched(got.data(), ys, T, dim, mask)) << "null rows written";
  }
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), state_tol) << "prefill states";
  EXPECT_TRUE(pool.null_block_intact());

  // Decode: the first row of each sequence's inputs as the next token, over the same blocks.
  const int B = b.num_seqs();
  cpu::ScanInputs cd = ci;
  cuda::ScanInputs gd = gi;
  std::vector<float> refd(B * ys, 0.0f);
  cpu::selective_state_update(cd, cp, refd.data(), ys, sp(b.state_indices));
  DeviceBuffer dyd = poisoned(B * ys);
  if (wide_decode)
    SSM_CUDA_CHECK(cuda::selective_state_update_wide(gd, gp, dyd.as<float>(), DType::F32, ys, dsi.as<int32_t>(), B,
                                                     false, nullptr));
  else
    SSM_CUDA_CHECK(cuda::selective_state_update(gd, gp, dyd.as<float>(), ys, dsi.as<int32_t>(), B, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto gotd = to_host<float>(dyd, B * ys);
  std::vector<uint8_t> rmask(B);
  for (int i = 0; i < B; ++i) rmask[i] = b.state_indices[i] != 0;
  EXPECT_LT(rel_err(gotd.data(), ys, refd.data(), ys, B, dim, &rmask), state_dtype == DType::F32 ? tol : 1e-2)
      << "decode y";
  EXPECT_TRUE(untouched(gotd.data(), ys, B, dim, rmask)) << "null decode rows written";
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), state_tol) << "decode states";
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaSelectiveScan, PrefillAndDecodeMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& s : mamba1_shapes())
    for (const auto& sch : schedules())
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << s.name << " " << sch.name << " state " << dtype_name(dt));
        check_scan(rng, s, dt, make_batch(sch.lens, sch.null_at), true);
        check_scan(rng, s, dt, make_batch(sch.lens, sch.null_at), true, 256);  // chunk-parallel form
        check_scan(rng, s, dt, make_batch(sch.lens, sch.null_at), true, 16);   // many chunks per sequence
        // bf16 y (out_proj's input) from the chunked form, and the large-batch decode kernel.
        check_scan(rng, s, dt, make_batch(sch.lens, sch.null_at), true, 256, DType::BF16, true);
      }
  // The large-batch decode kernel on a batch wider than 16 rows, d_state 16 and below (scalar state path).
  for (int N : {16, 5}) {
    std::vector<int> lens(40, 2);
    check_scan(rng, {"custom", 64, 300, N, 4, 8}, DType::F32, make_batch(lens, {3, 17}), true, 16, DType::F32, true);
    check_scan(rng, {"custom", 64, 300, N, 4, 8}, DType::BF16, make_batch(lens, {0}), false, 0, DType::F32, true);
  }
  // d_state other than 16 (lanes 32, several states per lane), no gate.
  for (int N : {8, 64, 256}) {
    SCOPED_TRACE(testing::Message() << "d_state " << N);
    check_scan(rng, {"custom", 64, 200, N, 4, 8}, DType::F32, make_batch({3, 40, 1}, {1}), false);
    check_scan(rng, {"custom", 64, 200, N, 4, 8}, DType::F32, make_batch({3, 40, 1}, {1}), false, 8);
  }
}

// ---- Mamba-2 SSD ------------------------------------------------------------------------------------------------

/// How the prefill runs: the chunked tensor-core form (exact 3xTF32 products, one TF32 pass, or bf16 operands) or
/// the sequential per-sequence walk (chunk_size unknown to the op).
enum class SsdMode { ChunkedExact, ChunkedFast, ChunkedBf16, Sequential };

/// copies (ChunkedBf16): the prefill also gets bf16 copies of x, B, C (SsdInputs::x_h ...); where they are the only
/// x, B, C it reads (ssd_uses_bf16_copies), its fp32 x, B, C are all NaN.
void check_ssd(std::mt19937& rng, const Mamba2Shape& s, DType state_dtype, const Batch& b,
               SsdMode mode = SsdMode::ChunkedExact, bool wide_decode = false, bool copies = false) {
  const int H = s.heads, P = s.head_dim, G = s.n_groups, N = s.d_state;
  const int64_t T = b.num_tokens(), HP = s.d_inner(), GN = static_cast<int64_t>(G) * N;
  // Packed like the model: x, B, C are slices of the conv output row [HP + 2GN]; dt of the projection row.
  const int64_t xbc = HP + 2 * GN + 5, dts = H + 7, ys = HP + 1;
  auto xBC = rand_vec(rng, T * xbc), dt = rand_vec(rng, T * dts, -5.0f, 1.0f);
  std::vector<float> A(H), D = rand_vec(rng, H), dtb = rand_vec(rng, H, -2.0f, 0.0f);
  for (int h = 0; h < H; ++h) A[h] = -(1.0f + 15.0f * h / H);
  StatePool pool(state_dtype, static_cast<int64_t>(H) * P * N, b.num_seqs() + 1, rng, 0.5f);
  Chunks ch = make_chunks(b, s.chunk_size, rng);
  const int nchunks = static_cast<int>(ch.seq_idx.size());
  DeviceBuffer dxbc = to_device(xBC), ddt = to_device(dt), dA = to_device(A), dD = to_device(D), ddtb = to_device(dtb);
  DeviceBuffer dcu = to_device(ch.cu), dseq = to_device(ch.seq_idx), dlast = to_device(ch.last),
               dsi = to_device(b.state_indices), dh = to_device(b.has_initial_states);
  cpu::SsdInputs ci{{xBC.data(), xbc}, {dt.data(), dts}, {xBC.data() + HP, xbc}, {xBC.data() + HP + GN, xbc}};
  cuda::SsdInputs gi{{dxbc.as<float>(), xbc}, {ddt.as<float>(), dts}, {dxbc.as<float>() + HP, xbc},
                     {dxbc.as<float>() + HP + GN, xbc}, {}, {}, {}};
  cpu::SsdParams cp{H, P, G, N, A.data(), D.data(), dtb.data(), 0.0f, 0.5f, pool.host_view()};
  cuda::SsdParams gp{H, P, G, N, dA.as<float>(), dD.as<float>(), ddtb.as<float>(), 0.0f, 0.5f, pool.dev_view()};
  gp.exact_products = mode != SsdMode::ChunkedFast && mode != SsdMode::ChunkedBf16;
  gp.bf16_products = mode == SsdMode::ChunkedBf16;
  cpu::SsdChunkMetadata cm{s.chunk_size, sp(b.query_start_loc), sp(ch.cu), sp(ch.seq_idx), sp(ch.last),
                           sp(b.state_indices), sp(b.has_initial_states)};
  cuda::SsdChunkMetadataDev gm{b.num_seqs(), nchunks, dcu.as<int32_t>(), dseq.as<int32_t>(), dlast.as<int32_t>(),
                               dsi.as<int32_t>(), dh.as<uint8_t>(), mode == SsdMode::Sequential ? 0 : s.chunk_size};
  // bf16 operands (x, B, C, decayed C B^T, chunk-entry states rounded to 2^-9): ~3e-3 measured, bound 1e-2.
  const double tol = mode == SsdMode::ChunkedBf16 ? 1e-2 : mode == SsdMode::ChunkedFast ? 3e-3 : 1e-4;
  const double state_tol = state_dtype == DType::F32 ? tol : 1e-2;
  const int64_t cs_elems = static_cast<int64_t>(nchunks) * HP * N;

  std::vector<float> ref(T * ys, 0.0f), ref_cs(cs_elems, 0.0f);
  cpu::ssd_chunk_scan_fwd(ci, cp, cm, ref.data(), ys, ref_cs.data());
  DeviceBuffer dy = poisoned(T * ys), dcs = poisoned(cs_elems);
  cuda::SsdInputs gpre = gi;  // the prefill's inputs
  const int64_t hs = (HP + 2 * GN + 7) / 8 * 8;  // bf16 copy rows, 16-byte aligned
  std::vector<uint16_t> xbc_h(copies ? T * hs : 0, 0);
  for (int64_t t = 0; t < (copies ? T : 0); ++t)
    for (int64_t i = 0; i < HP + 2 * GN; ++i) xbc_h[t * hs + i] = f32_to_bf16(xBC[t * xbc + i]);
  DeviceBuffer dxbc_h = to_device(xbc_h), dnan = poisoned(copies ? T * xbc : 0);
  bool fp32_unread = false;
  if (copies) {
    const auto* base = static_cast<const uint16_t*>(dxbc_h.data());
    gpre.x_h = {base, hs}, gpre.B_h = {base + HP, hs}, gpre.C_h = {base + HP + GN, hs};
    fp32_unread = cuda::ssd_uses_bf16_copies(gpre, gp, s.chunk_size);
    if (fp32_unread)
      gpre.x.data = dnan.as<float>(), gpre.B.data = dnan.as<float>() + HP, gpre.C.data = dnan.as<float>() + HP + GN;
  }
  SSM_CUDA_CHECK(cuda::ssd_chunk_scan_fwd(gpre, gp, gm, dy.as<float>(), ys, dcs.as<float>(), nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto got = to_host<float>(dy, T * ys);
  const auto mask = b.token_mask();
  const double yerr = rel_err(got.data(), ys, ref.data(), ys, T, HP, &mask);
  if (mode == SsdMode::ChunkedBf16)
    std::printf("ssd bf16 %s%s: prefill y rel err %.3g\n", s.name, fp32_unread ? " (bf16 copies only)" : "", yerr);
  EXPECT_LT(yerr, tol) << "prefill y";
  EXPECT_TRUE(untouched(got.data(), ys, T, HP, mask)) << "null rows written";
  std::vector<uint8_t> cmask(nchunks);
  for (int c = 0; c < nchunks; ++c) cmask[c] = b.state_indices[ch.seq_idx[c]] != 0;
  auto gcs = to_host<float>(dcs, cs_elems);
  EXPECT_LT(rel_err(gcs.data(), HP * N, ref_cs.data(), HP * N, nchunks, HP * N, &cmask), tol) << "chunk states";
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), state_tol) << "prefill states";
  EXPECT_TRUE(pool.null_block_intact());

  // Decode: one token per sequence over the same blocks.
  const int B = b.num_seqs();
  std::vector<float> refd(B * ys, 0.0f);
  cpu::ssd_state_update(ci, cp, refd.data(), ys, sp(b.state_indices));
  DeviceBuffer dyd = poisoned(B * ys);
  if (wide_decode)
    SSM_CUDA_CHECK(cuda::ssd_state_update_wide(gi, gp, dyd.as<float>(), ys, dsi.as<int32_t>(), B, nullptr));
  else
    SSM_CUDA_CHECK(cuda::ssd_state_update(gi, gp, dyd.as<float>(), ys, dsi.as<int32_t>(), B, nullptr));
  SSM_CUDA_CHECK(cudaDeviceSynchronize());
  auto gotd = to_host<float>(dyd, B * ys);
  std::vector<uint8_t> rmask(B);
  for (int i = 0; i < B; ++i) rmask[i] = b.state_indices[i] != 0;
  EXPECT_LT(rel_err(gotd.data(), ys, refd.data(), ys, B, HP, &rmask), state_dtype == DType::F32 ? tol : 1e-2)
      << "decode y";
  EXPECT_TRUE(untouched(gotd.data(), ys, B, HP, rmask)) << "null decode rows written";
  EXPECT_LT(pool.rel_err_blocks(b.state_indices), state_tol) << "decode states";
  EXPECT_TRUE(pool.null_block_intact());
}

TEST(CudaSsd, ChunkedPrefillAndDecodeMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const auto& s : mamba2_shapes())
    for (const auto& sch : schedules())
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << s.name << " " << sch.name << " state " << dtype_name(dt));
        check_ssd(rng, s, dt, make_batch(sch.lens, sch.null_at));
      }
  for (const auto& s : mamba2_shapes()) {
    SCOPED_TRACE(testing::Message() << s.name << " sequential and fast-product forms");
    check_ssd(rng, s, DType::F32, make_batch({5, 1, 37, 2, 64, 3}, {1, 4}), SsdMode::Sequential);
    check_ssd(rng, s, DType::F32, make_batch({5, 1, 37, 2, 64, 3}, {1, 4}), SsdMode::ChunkedFast);
  }
  // Small chunks (many per sequence), head_dim not a multiple of 16, d_state 16 and 256.
  check_ssd(rng, {"small-chunks", 64, 6, 20, 3, 16, 4, 8}, DType::F32, make_batch({1, 30, 7, 65}, {2}));
  check_ssd(rng, {"wide-state", 64, 2, 16, 1, 256, 4, 32}, DType::F32, make_batch({1, 50}, {}));
  // ssd_state_update_wide: d_state 128 and 256 (its state-run kernel; head_dim 40 = a partial 32-row block), fp32
  // and bf16 states, and d_state 64 (its fallback).
  for (DType dt : {DType::F32, DType::BF16}) {
    check_ssd(rng, {"state-128", 64, 4, 40, 2, 128, 4, 64}, dt, make_batch({3, 70, 1}, {1}), SsdMode::ChunkedExact, true);
    check_ssd(rng, {"state-256", 64, 2, 32, 1, 256, 4, 64}, dt, make_batch({2, 9}, {}), SsdMode::ChunkedExact, true);
  }
  check_ssd(rng, mamba2_shapes()[0], DType::F32, make_batch({5, 1, 37, 2, 64, 3}, {1, 4}), SsdMode::ChunkedExact, true);
  // head_dim 80 and 128 (two 64-column tiles), chunk 100 (partial 64-row tiles), 4 heads per group.
  check_ssd(rng, {"odd-tiles", 64, 8, 80, 2, 48, 4, 100}, DType::F32, make_batch({250, 3, 101}, {}));
  check_ssd(rng, {"wide-head", 64, 2, 128, 1, 64, 4, 256}, DType::F32, make_batch({600, 1}, {}));
}

TEST(CudaSsd, Bf16TilesMatchCpu) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // bf16 tiles: every shape and schedule; small chunks with head_dim 20 and d_state 16; d_state 256; head_dim 80
  // (a partial second 64-column tile) with chunk 96 and d_state 48; head_dim 128. chunk 100 (not a multiple of 8)
  // falls back to the TF32 tiles.
  for (const auto& s : mamba2_shapes())
    for (const auto& sch : schedules())
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(testing::Message() << s.name << " " << sch.name << " state " << dtype_name(dt) << " bf16");
        check_ssd(rng, s, dt, make_batch(sch.lens, sch.null_at), SsdMode::ChunkedBf16);
      }
  check_ssd(rng, {"small-chunks", 64, 6, 20, 3, 16, 4, 8}, DType::F32, make_batch({1, 30, 7, 65}, {2}),
            SsdMode::ChunkedBf16);
  check_ssd(rng, {"wide-state", 64, 2, 16, 1, 256, 4, 32}, DType::F32, make_batch({1, 50}, {}),
            SsdMode::ChunkedBf16);
  check_ssd(rng, {"odd-tiles-96", 64, 8, 80, 2, 48, 4, 96}, DType::F32, make_batch({250, 3, 101}, {}),
            SsdMode::ChunkedBf16);
  check_ssd(rng, {"odd-tiles", 64, 8, 80, 2, 48, 4, 100}, DType::F32, make_batch({250, 3, 101}, {}),
            SsdMode::ChunkedBf16);
  check_ssd(rng, {"wide-head", 64, 2, 128, 1, 64, 4, 256}, DType::F32, make_batch({600, 1}, {}),
            SsdMode::ChunkedBf16);
  // The caller's bf16 copies (the runner's conv output) as the only x, B, C: the 2.7b / codestral shapes, a small
  // one (head_dim 64, d_state 128, chunk 64) and head_dim 128 with d_state 256; tiny-mamba2 (d_state 64) makes its
  // own padded copies.
  for (const auto& s : mamba2_shapes())
    check_ssd(rng, s, DType::F32, make_batch({5, 1, 37, 2, 64, 3}, {1, 4}), SsdMode::ChunkedBf16, false, true);
  check_ssd(rng, {"copies", 64, 4, 64, 1, 128, 4, 64}, DType::F32, make_batch({3, 130, 1, 64}, {2}),
            SsdMode::ChunkedBf16, false, true);
  check_ssd(rng, {"copies-wide", 64, 2, 128, 2, 256, 4, 32}, DType::BF16, make_batch({90, 7}, {}),
            SsdMode::ChunkedBf16, false, true);
}

}  // namespace
}  // namespace ssmserve
