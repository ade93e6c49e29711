// Owns the per-op prefill profile of the CUDA backend: one mixer layer's kernels at real shapes (mamba-2.8b for
// Mamba-1, mamba2-2.7b for Mamba-2) over 1 x 8192 and 16 x 2048 prompt tokens, each op timed alone with CUDA
// events (median of 5), so the report can say where prefill time goes next to the GEMM roofline (the device
// image has no Nsight Systems). Random inputs, bf16 GEMM operands, fp32 activations and states, chunk 256.
// Prints one JSON object per op and a per-layer total. Usage: bench_cuda_ops
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "device/cuda_check.h"
#include "device/device.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/selective_scan.h"
#include "kernels/cuda/ssd.h"

namespace {
using namespace ssmserve;
using namespace ssmserve::cuda;

/// n bf16 weights of value 0x3c3c (~0.0115): GEMM timing only.
DeviceBuffer bf16_dev(size_t n) {
  DeviceBuffer b(n * 2);
  b.fill_bytes(0x3c);
  return b;
}

DeviceBuffer rand_dev(size_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return to_device(v);
}

struct Timer {
  cudaStream_t s;
  double total_ms = 0;
  const char* layer;
  int batch, len;
  /// Times f; `counted` = false for comparison variants left out of the layer total.
  void op(const std::string& name, const std::function<void()>& f, double flops = 0, bool counted = true) {
    f();  // warmup
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    cudaEvent_t e0, e1;
    SSM_CUDA_CHECK(cudaEventCreate(&e0));
    SSM_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> r;
    for (int i = 0; i < 5; ++i) {
      SSM_CUDA_CHECK(cudaEventRecord(e0, s));
      f();
      SSM_CUDA_CHECK(cudaEventRecord(e1, s));
      SSM_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      r.push_back(ms);
    }
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    std::sort(r.begin(), r.end());
    if (counted) total_ms += r[2];
    std::printf("{\"layer\": \"%s\", \"prompts\": \"%dx%d\", \"op\": \"%s\", \"ms\": %.4f", layer, batch, len,
                name.c_str(), r[2]);
    if (flops > 0) std::printf(", \"tflops\": %.1f", flops / (r[2] * 1e-3) / 1e12);
    std::printf("}\n");
    std::fflush(stdout);
  }
};

/// Sequence-aligned chunk metadata for `batch` prompts of `len` tokens (chunk 256), uploaded.
struct Meta {
  DeviceBuffer qsl, cu, seq, last, si, hi;
  int nchunks = 0;
  Meta(int batch, int len, int chunk) {
    std::vector<int32_t> q{0}, c{0}, sq, l, s;
    std::vector<uint8_t> h(batch, 0);
    for (int b = 0; b < batch; ++b) {
      for (int t = 0; t < len; t += chunk) {
        c.push_back(c.back() + std::min(chunk, len - t));
        sq.push_back(b);
      }
      l.push_back(static_cast<int32_t>(sq.size()) - 1);
      q.push_back(q.back() + len);
      s.push_back(b + 1);
    }
    nchunks = static_cast<int>(sq.size());
    qsl = to_device(q), cu = to_device(c), seq = to_device(sq), last = to_device(l), si = to_device(s),
    hi = to_device(h);
  }
  ChunkMetadataDev dev(int batch, int chunk) const {
    return {batch, nchunks, cu.as<int32_t>(), seq.as<int32_t>(), last.as<int32_t>(), si.as<int32_t>(),
            hi.as<uint8_t>(), chunk};
  }
};

void mamba1_layer(int batch, int len, GemmHandle& gemm, cudaStream_t s, std::mt19937& rng) {
  const int64_t T = int64_t{batch} * len, H = 2560, I = 5120, N = 16, R = 160, XD = R + 2 * N, K = 4;
  Timer tm{s, 0, "mamba-2.8b", batch, len};
  Meta meta(batch, len, 256);
  DeviceBuffer hidden = rand_dev(T * H, -1, 1, rng), out = rand_dev(T * H, -1, 1, rng), normed(T * H * 2),
               w_in = bf16_dev(2 * I * H), w_x = bf16_dev(XD * I),
               w_dt = bf16_dev(I * R), w_out = bf16_dev(H * I),
               xz(T * 2 * I * 4), xc(T * I * 4), xdbl(T * XD * 4), delta(T * I * 4), y(T * I * 4), cast(T * I * 2),
               norm_w = rand_dev(H, 0.5f, 1.5f, rng), conv_w = rand_dev(I * K, -0.5f, 0.5f, rng),
               conv_b = rand_dev(I, -0.1f, 0.1f, rng), A = rand_dev(I * N, -8.0f, -0.5f, rng),
               D = rand_dev(I, -1, 1, rng), dtb = rand_dev(I, -4, -2, rng),
               conv_state((batch + 1) * (K - 1) * I * 4), ssm_state((batch + 1) * I * N * 4);
  SSM_CUDA_CHECK(cudaMemset(xz.data(), 0, xz.bytes()));
  auto g = [&](const void* x, int64_t M, int64_t Kd, const DeviceBuffer& w, int64_t Nd, void* yv) {
    gemm.run({M, Nd, Kd, x, Kd, w.data(), Kd, DType::BF16, yv, Nd, DType::F32}, s);
  };
  tm.op("fused_add_rms_norm", [&] {
    SSM_CUDA_CHECK(fused_add_rms_norm(out.as<float>(), H, hidden.as<float>(), H, norm_w.as<float>(), 1e-5f, T, H,
                                      normed.data(), DType::BF16, H, s));
  });
  tm.op("gemm in_proj", [&] { g(normed.data(), T, H, w_in, 2 * I, xz.data()); }, 2.0 * T * 2 * I * H);
  ConvParams cp{I, static_cast<int>(K), conv_w.as<float>(), conv_b.as<float>(),
                {conv_state.data(), DType::F32, (K - 1) * I}, true};
  tm.op("causal_conv1d_fwd (fp32 only, not in total)", [&] {
    SSM_CUDA_CHECK(causal_conv1d_fwd(xz.as<float>(), 2 * I, xc.as<float>(), I, cp, meta.qsl.as<int32_t>(),
                                     meta.si.as<int32_t>(), meta.hi.as<uint8_t>(), batch, T, s));
  }, 0, false);
  tm.op("cast xc (replaced by the dual conv, not in total)",
        [&] { SSM_CUDA_CHECK(cast_rows(xc.as<float>(), I, T, I, cast.data(), DType::BF16, I, s)); }, 0, false);
  tm.op("causal_conv1d_fwd_dual (fp32 + bf16 copy)", [&] {
    SSM_CUDA_CHECK(causal_conv1d_fwd_dual(xz.as<float>(), 2 * I, xc.as<float>(), I, cast.data(), I, cp,
                                          meta.qsl.as<int32_t>(), meta.si.as<int32_t>(), meta.hi.as<uint8_t>(), batch,
                                          T, s));
  });
  DeviceBuffer xc16(T * I * 2);
  tm.op("causal_conv1d_fwd_dual (bf16 only, not in total)", [&] {
    SSM_CUDA_CHECK(causal_conv1d_fwd_dual(xz.as<float>(), 2 * I, nullptr, 0, xc16.data(), I, cp,
                                          meta.qsl.as<int32_t>(), meta.si.as<int32_t>(), meta.hi.as<uint8_t>(), batch,
                                          T, s));
  }, 0, false);
  tm.op("gemm x_proj", [&] { g(cast.data(), T, I, w_x, XD, xdbl.data()); }, 2.0 * T * XD * I);
  tm.op("cast dt_low", [&] { SSM_CUDA_CHECK(cast_rows(xdbl.as<float>(), XD, T, R, cast.data(), DType::BF16, R, s)); });
  tm.op("gemm dt_proj", [&] { g(cast.data(), T, R, w_dt, I, delta.data()); }, 2.0 * T * I * R);
  SSM_CUDA_CHECK(cudaMemset(delta.data(), 0, delta.bytes()));
  ScanInputs in{{xc.as<float>(), I}, {delta.as<float>(), I}, {xdbl.as<float>() + R, XD}, {xdbl.as<float>() + R + N, XD},
                {xz.as<float>() + I, 2 * I}};
  ScanParams sp{I, static_cast<int>(N), A.as<float>(), D.as<float>(), dtb.as<float>(), true,
                {ssm_state.data(), DType::F32, I * N}};
  ChunkMetadataDev cm = meta.dev(batch, 256);
  tm.op("selective_scan chunked (pool workspace)", [&] {
    SSM_CUDA_CHECK(selective_scan_chunked_fwd(in, sp, y.as<float>(), I, cm, meta.qsl.as<int32_t>(), s));
  }, 0, false);
  DeviceBuffer scan_ws(scan_workspace_bytes(I, meta.nchunks));
  cm.workspace = scan_ws.data(), cm.workspace_bytes = scan_ws.bytes();
  tm.op("selective_scan chunked fp32 y (not in total)", [&] {
    SSM_CUDA_CHECK(selective_scan_chunked_fwd(in, sp, y.as<float>(), I, cm, meta.qsl.as<int32_t>(), s));
  }, 0, false);
  tm.op("selective_scan chunked bf16 y", [&] {
    SSM_CUDA_CHECK(selective_scan_chunked_fwd_out(in, sp, cast.data(), DType::BF16, I, cm, meta.qsl.as<int32_t>(), s));
  });
  tm.op("selective_scan sequential (not in total)", [&] {
    SSM_CUDA_CHECK(selective_scan_fwd(in, sp, y.as<float>(), I, meta.qsl.as<int32_t>(), meta.si.as<int32_t>(),
                                      meta.hi.as<uint8_t>(), batch, s));
  }, 0, false);
  tm.op("cast y (replaced by the bf16-y scan, not in total)",
        [&] { SSM_CUDA_CHECK(cast_rows(y.as<float>(), I, T, I, cast.data(), DType::BF16, I, s)); }, 0, false);
  tm.op("gemm out_proj", [&] { g(cast.data(), T, I, w_out, H, out.data()); }, 2.0 * T * H * I);
  std::printf("{\"layer\": \"mamba-2.8b\", \"prompts\": \"%dx%d\", \"op\": \"layer total\", \"ms\": %.4f}\n",
              batch, len, tm.total_ms);
}

void mamba2_layer(int batch, int len, GemmHandle& gemm, cudaStream_t s, std::mt19937& rng) {
  const int64_t T = int64_t{batch} * len, H = 2560, I = 5120, NH = 80, P = 64, N = 128, G = 1, K = 4;
  const int64_t C = I + 2 * G * N, PW = I + C + NH;
  Timer tm{s, 0, "mamba2-2.7b", batch, len};
  Meta meta(batch, len, 256);
  DeviceBuffer hidden = rand_dev(T * H, -1, 1, rng), out = rand_dev(T * H, -1, 1, rng), normed(T * H * 2),
               w_in = bf16_dev(PW * H), w_out = bf16_dev(H * I),
               proj = rand_dev(T * PW, -1, 1, rng), xbc(T * C * 4), y(T * I * 4), gated(T * I * 2),
               norm_w = rand_dev(I, 0.5f, 1.5f, rng), conv_w = rand_dev(C * K, -0.5f, 0.5f, rng),
               conv_b = rand_dev(C, -0.1f, 0.1f, rng), A = rand_dev(NH, -8.0f, -1.0f, rng),
               D = rand_dev(NH, -1, 1, rng), dtb = rand_dev(NH, -4, -2, rng),
               conv_state((batch + 1) * (K - 1) * C * 4), ssm_state((batch + 1) * NH * P * N * 4);
  auto g = [&](const void* x, int64_t M, int64_t Kd, const DeviceBuffer& w, int64_t Nd, void* yv, int64_t ys) {
    gemm.run({M, Nd, Kd, x, Kd, w.data(), Kd, DType::BF16, yv, ys, DType::F32}, s);
  };
  tm.op("fused_add_rms_norm", [&] {
    SSM_CUDA_CHECK(fused_add_rms_norm(out.as<float>(), H, hidden.as<float>(), H, norm_w.as<float>(), 1e-5f, T, H,
                                      normed.data(), DType::BF16, H, s));
  });
  DeviceBuffer proj_scratch(T * PW * 4);
  tm.op("gemm in_proj", [&] { g(normed.data(), T, H, w_in, PW, proj_scratch.data(), PW); }, 2.0 * T * PW * H);
  ConvParams cp{C, static_cast<int>(K), conv_w.as<float>(), conv_b.as<float>(),
                {conv_state.data(), DType::F32, (K - 1) * C}, true};
  tm.op("causal_conv1d_fwd fp32 out (TF32 SSD; not in total)", [&] {
    SSM_CUDA_CHECK(causal_conv1d_fwd(proj.as<float>() + I, PW, xbc.as<float>(), C, cp, meta.qsl.as<int32_t>(),
                                     meta.si.as<int32_t>(), meta.hi.as<uint8_t>(), batch, T, s));
  }, 0, false);
  // The runner with bf16 weights: the conv writes only bf16 rows, the bf16 SSD tiles read them.
  DeviceBuffer xbc_h(T * C * 2);
  tm.op("causal_conv1d_fwd bf16 out only", [&] {
    SSM_CUDA_CHECK(causal_conv1d_fwd_dual(proj.as<float>() + I, PW, nullptr, C, xbc_h.data(), C, cp,
                                          meta.qsl.as<int32_t>(), meta.si.as<int32_t>(), meta.hi.as<uint8_t>(), batch,
                                          T, s));
  });
  const float* xb = xbc.as<float>();
  SsdInputs in{{xb, C}, {proj.as<float>() + I + C, PW}, {xb + I, C}, {xb + I + G * N, C}, {}, {}, {}};
  SsdParams sp;
  sp.num_heads = NH, sp.head_dim = P, sp.n_groups = G, sp.d_state = N, sp.A = A.as<float>(), sp.D = D.as<float>();
  sp.dt_bias = dtb.as<float>(), sp.ssm_states = {ssm_state.data(), DType::F32, NH * P * N};
  const double ssd_flops = 2.0 * T * (NH * P * N * 2 + 256.0 / 2 * (G * N + NH * P));
  ChunkMetadataDev cm = meta.dev(batch, 256);
  tm.op("ssd chunked TF32 (pool workspace, not in total)", [&] {
    SSM_CUDA_CHECK(ssd_chunk_scan_fwd(in, sp, cm, y.as<float>(), I, nullptr, s));
  }, ssd_flops, false);
  DeviceBuffer ssd_ws(ssd_workspace_bytes(sp, meta.nchunks, 256));
  cm.workspace = ssd_ws.data(), cm.workspace_bytes = ssd_ws.bytes();
  for (bool exact : {false, true}) {
    sp.exact_products = exact;
    // The runner uses the bf16 tiles with bf16 weights: the TF32 variants are shown, not counted.
    tm.op(exact ? "ssd chunked 3xTF32 (not in total)" : "ssd chunked TF32 (not in total)", [&] {
      SSM_CUDA_CHECK(ssd_chunk_scan_fwd(in, sp, cm, y.as<float>(), I, nullptr, s));
    }, ssd_flops, false);
  }
  sp.exact_products = false, sp.bf16_products = true;
  DeviceBuffer ssd_ws_bf16(ssd_workspace_bytes(sp, meta.nchunks, 256));
  cm.workspace = ssd_ws_bf16.data(), cm.workspace_bytes = ssd_ws_bf16.bytes();
  tm.op("ssd chunked bf16, own bf16 copies (not in total)", [&] {
    SSM_CUDA_CHECK(ssd_chunk_scan_fwd(in, sp, cm, y.as<float>(), I, nullptr, s));
  }, ssd_flops, false);
  SsdInputs in_h = in;
  const auto* xh = static_cast<const uint16_t*>(xbc_h.data());
  in_h.x_h = {xh, C}, in_h.B_h = {xh + I, C}, in_h.C_h = {xh + I + G * N, C};
  tm.op("ssd chunked bf16 (the conv's bf16 rows)", [&] {
    SSM_CUDA_CHECK(ssd_chunk_scan_fwd(in_h, sp, cm, y.as<float>(), I, nullptr, s));
  }, ssd_flops);
  sp.bf16_products = false;
  sp.exact_products = false;
  const ChunkMetadataDev seq = meta.dev(batch, 0);  // chunk_size 0: the sequential walk
  tm.op("ssd sequential (not in total)",
        [&] { SSM_CUDA_CHECK(ssd_chunk_scan_fwd(in, sp, seq, y.as<float>(), I, nullptr, s)); }, 0, false);
  tm.op("gated_rms_norm", [&] {
    SSM_CUDA_CHECK(gated_rms_norm(y.as<float>(), I, proj.as<float>(), PW, norm_w.as<float>(), 1e-5f, T, I, I / G,
                                  false, gated.data(), DType::BF16, I, s));
  });
  tm.op("gemm out_proj", [&] { g(gated.data(), T, I, w_out, H, out.data(), H); }, 2.0 * T * H * I);
  std::printf("{\"layer\": \"mamba2-2.7b\", \"prompts\": \"%dx%d\", \"op\": \"layer total\", \"ms\": %.4f}\n",
              batch, len, tm.total_ms);
}

/// The mamba-2.8b decode state update at a large batch (one token per row, every row its own state block):
/// the lane-per-state kernel against the thread-per-channel one, next to the state-traffic bound.
void mamba1_decode_scan(int batch, cudaStream_t s, std::mt19937& rng) {
  const int64_t I = 5120, N = 16, B = batch;
  Timer tm{s, 0, "mamba-2.8b decode scan", batch, 1};
  DeviceBuffer u = rand_dev(B * I, -1, 1, rng), delta = rand_dev(B * I, -1, 1, rng), bc = rand_dev(B * 2 * N, -1, 1, rng),
               z = rand_dev(B * I, -1, 1, rng), A = rand_dev(I * N, -8.0f, -0.5f, rng), D = rand_dev(I, -1, 1, rng),
               dtb = rand_dev(I, -4, -2, rng), y(B * I * 4), ssm_state((B + 1) * I * N * 4);
  SSM_CUDA_CHECK(cudaMemset(ssm_state.data(), 0, ssm_state.bytes()));
  std::vector<int32_t> idx(B);
  for (int64_t b = 0; b < B; ++b) idx[b] = static_cast<int32_t>(b + 1);
  DeviceBuffer didx(B * 4);
  SSM_CUDA_CHECK(cudaMemcpy(didx.data(), idx.data(), B * 4, cudaMemcpyHostToDevice));
  ScanInputs in{{u.as<float>(), I}, {delta.as<float>(), I}, {bc.as<float>(), 2 * N}, {bc.as<float>() + N, 2 * N},
                {z.as<float>(), I}};
  ScanParams sp{I, static_cast<int>(N), A.as<float>(), D.as<float>(), dtb.as<float>(), true,
                {ssm_state.data(), DType::F32, I * N}};
  tm.op("selective_state_update (lane per state, not in total)", [&] {
    SSM_CUDA_CHECK(selective_state_update(in, sp, static_cast<float*>(y.data()), I, didx.as<int32_t>(), batch, s));
  }, 0, false);
  tm.op("selective_state_update_wide", [&] {
    SSM_CUDA_CHECK(selective_state_update_wide(in, sp, y.data(), DType::BF16, I, didx.as<int32_t>(), batch, false, s));
  });
  std::printf("{\"layer\": \"mamba-2.8b decode scan\", \"batch\": %d, \"state_bytes\": %.0f}\n", batch,
              2.0 * B * I * N * 4);
}

/// The mamba2-2.7b decode state update at a large batch (80 heads x 64 x 128 fp32 state per row), next to its
/// state-traffic bound (state_bytes read + written).
void mamba2_decode_ssd(int batch, cudaStream_t s, std::mt19937& rng) {
  const int H = 80, P = 64, G = 1, N = 128;
  const int64_t HP = int64_t{H} * P, GN = int64_t{G} * N, B = batch, W = HP + 2 * GN;
  Timer tm{s, 0, "mamba2-2.7b decode ssd", batch, 1};
  DeviceBuffer xbc = rand_dev(B * W, -1, 1, rng), dt = rand_dev(B * H, -3, 0, rng), A = rand_dev(H, -8.0f, -1.0f, rng),
               D = rand_dev(H, -1, 1, rng), dtb = rand_dev(H, -4, -2, rng), y(B * HP * 4),
               ssm_state((B + 1) * HP * N * 4);
  SSM_CUDA_CHECK(cudaMemset(ssm_state.data(), 0, ssm_state.bytes()));
  std::vector<int32_t> idx(B);
  for (int64_t b = 0; b < B; ++b) idx[b] = static_cast<int32_t>(b + 1);
  DeviceBuffer didx(B * 4);
  SSM_CUDA_CHECK(cudaMemcpy(didx.data(), idx.data(), B * 4, cudaMemcpyHostToDevice));
  SsdInputs in{{xbc.as<float>(), W}, {dt.as<float>(), H}, {xbc.as<float>() + HP, W}, {xbc.as<float>() + HP + GN, W},
               {}, {}, {}};
  SsdParams sp{H, P, G, N, A.as<float>(), D.as<float>(), dtb.as<float>()};
  sp.ssm_states = {ssm_state.data(), DType::F32, HP * N};
  tm.op("ssd_state_update (small batches, not in total)", [&] {
    SSM_CUDA_CHECK(ssd_state_update(in, sp, static_cast<float*>(y.data()), HP, didx.as<int32_t>(), batch, s));
  }, 0, false);
  tm.op("ssd_state_update_wide", [&] {
    SSM_CUDA_CHECK(ssd_state_update_wide(in, sp, static_cast<float*>(y.data()), HP, didx.as<int32_t>(), batch, s));
  });
  std::printf("{\"layer\": \"mamba2-2.7b decode ssd\", \"batch\": %d, \"state_bytes\": %.0f}\n", batch,
              2.0 * B * HP * N * 4);
}

}  // namespace

int main(int argc, char** argv) {
  // `bench_cuda_ops mamba2`: the Mamba-2 layer only (both prompt shapes); `mamba2-8k`: at 1 x 8192 only.
  const std::string_view arg = argc > 1 ? argv[1] : "";
  const bool only_mamba2 = arg == "mamba2" || arg == "mamba2-8k";
  if (!gpu_available()) {
    std::puts("{\"error\": \"no CUDA device\"}");
    return 1;
  }
  std::mt19937 rng(1);
  Stream stream;
  GemmHandle gemm;
  for (auto [b, l] : {std::pair{1, 8192}, std::pair{16, 2048}}) {
    if (!only_mamba2) mamba1_layer(b, l, gemm, stream.get(), rng);
    if (arg != "mamba2-8k" || b == 1) mamba2_layer(b, l, gemm, stream.get(), rng);
  }
  if (only_mamba2) return 0;
  for (int b : {64, 256}) mamba1_decode_scan(b, stream.get(), rng);
  for (int b : {1, 64, 256}) mamba2_decode_ssd(b, stream.get(), rng);
  return 0;
}
