// Owns the Mamba-1 decode test case the dataflow decode kernel tests and benchmarks share: random layers on the
// device (bf16 GEMM weights, fp32 rest, states in a chosen dtype), fresh per-run device state, the runner's op-by-op
// decode chain as the reference, and the results as bytes / floats.
#pragma once
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "decode_test_util.h"
#include "device/cuda_check.h"
#include "kernels/cuda/causal_conv1d.h"
#include "kernels/cuda/decode_ops.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/mamba1_decode_layer.h"
#include "kernels/cuda/selective_scan.h"

namespace ssmserve::cudatest {
using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;

/// Random Mamba-1 decode layers (bf16 GEMM weights, fp32 rest, states in `sd`) on the device, and both ways of
/// running them: the runner's op-by-op decode chain.
struct Mamba1DecodeCase {
  cuda::Mamba1DecodeShape sh;
  int layers, M, blocks;
  DType sd;
  struct LayerW {
    DeviceBuffer norm, in, cw, cb, x, dt, dtb, A, D, out;
  };
  std::vector<LayerW> w;
  std::vector<std::vector<uint8_t>> conv0, ssm0;  // initial states per layer
  std::vector<float> hidden0, out0;
  std::vector<int32_t> si;
  Mamba1DecodeCase(std::mt19937& rng, cuda::Mamba1DecodeShape s, int nl, int m, DType state_dtype)
      : sh(s), layers(nl), M(m), blocks(m + 2), sd(state_dtype) {
    const int64_t H = s.H, I = s.I, N = s.N, R = s.R, W = s.W, XD = R + 2 * N;
    auto bf = [&](int64_t n, float a) { return to_device(to_bf16_bits(rand_vec(rng, n, -a, a))); };
    for (int l = 0; l < nl; ++l) {
      LayerW L;
      L.norm = to_device(rand_vec(rng, H, 0.8f, 1.2f));
      L.in = bf(2 * I * H, 1.0f / std::sqrt(static_cast<float>(H)));
      L.cw = to_device(rand_vec(rng, I * W, -0.4f, 0.4f)), L.cb = to_device(rand_vec(rng, I, -0.2f, 0.2f));
      L.x = bf(XD * I, 1.0f / std::sqrt(static_cast<float>(I)));
      L.dt = bf(I * R, 1.0f / std::sqrt(static_cast<float>(R)));
      L.dtb = to_device(rand_vec(rng, I, -4.0f, -1.0f));
      std::vector<float> A(I * N);
      for (int64_t c = 0; c < I; ++c)
        for (int n = 0; n < N; ++n) A[c * N + n] = -static_cast<float>(n + 1) * (0.5f + 0.001f * (c % 97));
      L.A = to_device(A), L.D = to_device(rand_vec(rng, I));
      L.out = bf(H * I, 0.5f / std::sqrt(static_cast<float>(I)));
      w.push_back(std::move(L));
      StatePool c(sd, (W - 1) * I, blocks, rng, 0.5f), q(sd, I * N, blocks, rng, 0.5f);
      conv0.push_back(c.host), ssm0.push_back(q.host);
    }
    hidden0 = rand_vec(rng, M * H), out0 = rand_vec(rng, M * H);
    for (int i = 0; i < M; ++i) si.push_back(M > 1 && i == 1 ? 0 : blocks - 1 - i);  // row 1 null
  }
  StateView view(const DeviceBuffer& b, int64_t elems) const { return StateView{b.data(), sd, elems}; }
  /// Per-run device state: states, hidden, out, scratch.
  struct Run {
    std::vector<DeviceBuffer> conv, ssm;
    DeviceBuffer hidden, out, normed, xz, xc, xc16, xdbl, xdbl16, delta, y16, si;
  };
  Run fresh() const {
    const int64_t H = sh.H, I = sh.I, XD = sh.R + 2 * sh.N;
    Run r;
    for (int l = 0; l < layers; ++l) r.conv.push_back(to_device(conv0[l])), r.ssm.push_back(to_device(ssm0[l]));
    r.hidden = to_device(hidden0), r.out = to_device(out0);
    r.normed = DeviceBuffer(M * H * 2), r.xz = DeviceBuffer(M * 2 * I * 4), r.xc = DeviceBuffer(M * I * 4);
    r.xc16 = DeviceBuffer(M * I * 2), r.xdbl = DeviceBuffer(M * XD * 4), r.xdbl16 = DeviceBuffer(M * XD * 2);
    r.delta = DeviceBuffer(M * I * 4), r.y16 = DeviceBuffer(M * I * 2), r.si = to_device(si);
    for (DeviceBuffer* b : {&r.xz, &r.xc, &r.xc16, &r.xdbl, &r.xdbl16, &r.delta, &r.y16}) b->fill_bytes(0);
    return r;
  }
  cuda::Mamba1DecodeLayer layer(const Run& r, int l) const {
    const int64_t I = sh.I, N = sh.N, W = sh.W;
    const LayerW& L = w[l];
    return {L.norm.as<float>(), L.in.data(), L.cw.as<float>(), L.cb.as<float>(), L.x.data(), L.dt.data(),
            L.dtb.as<float>(), L.A.as<float>(), L.D.as<float>(), L.out.data(), view(r.conv[l], (W - 1) * I),
            view(r.ssm[l], I * N)};
  }
  /// The runner's decode chain (runtime/modules/cuda_mamba1.cpp, bf16 weights), layer l.
  void chain(Run& r, int l, cudaStream_t s) const {
    const int64_t H = sh.H, I = sh.I, N = sh.N, R = sh.R, XD = R + 2 * N;
    const cuda::Mamba1DecodeLayer L = layer(r, l);
    SSM_CUDA_CHECK(cuda::add_rms_norm_rows(l == 0 ? nullptr : r.out.as<float>(), H, r.hidden.as<float>(), H, L.norm,
                                           sh.eps, nullptr, M, H, true, r.normed.data(), DType::BF16, H, true, s));
    auto gemm = [&](const void* x, int64_t xs, const void* wt, int64_t Nn, int64_t K, void* y, int64_t ys, void* y2) {
      SSM_CUDA_CHECK(skinny({M, Nn, K, x, xs, wt, K, DType::BF16, y, ys, DType::F32}, y2, ys, true, s));
    };
    gemm(r.normed.data(), H, L.in_proj, 2 * I, H, r.xz.data(), 2 * I, nullptr);
    cuda::ConvParams conv{I, static_cast<int>(sh.W), L.conv_weight, L.conv_bias, L.conv_states, true};
    SSM_CUDA_CHECK(cuda::conv1d_update_dual(r.xz.as<float>(), 2 * I, r.xc.as<float>(), I, r.xc16.data(), I, conv,
                                            r.si.as<int32_t>(), M, true, s));
    gemm(r.xc16.data(), I, L.x_proj, XD, I, r.xdbl.data(), XD, r.xdbl16.data());
    gemm(r.xdbl16.data(), XD, L.dt_proj, I, R, r.delta.data(), I, nullptr);
    cuda::ScanInputs in{{r.xc.as<float>(), I}, {r.delta.as<float>(), I}, {r.xdbl.as<float>() + R, XD},
                        {r.xdbl.as<float>() + R + N, XD}, {r.xz.as<float>() + I, 2 * I}};
    cuda::ScanParams sp{I, static_cast<int>(N), L.A, L.D, L.dt_bias, true, L.ssm_states};
    SSM_CUDA_CHECK(cuda::selective_state_update_out(in, sp, r.y16.data(), DType::BF16, I, r.si.as<int32_t>(), M, true, s));
    gemm(r.y16.data(), I, L.out_proj, H, I, r.out.data(), H, nullptr);
  }
  /// Non-null rows of hidden and out, and every layer's states, as bytes.
  std::vector<uint8_t> result(const Run& r) const {
    std::vector<uint8_t> v;
    const auto h = to_host<float>(r.hidden, M * sh.H), o = to_host<float>(r.out, M * sh.H);
    for (int m = 0; m < M; ++m) {
      if (si[m] == 0) continue;
      const auto* a = reinterpret_cast<const uint8_t*>(h.data() + m * sh.H);
      const auto* b = reinterpret_cast<const uint8_t*>(o.data() + m * sh.H);
      v.insert(v.end(), a, a + sh.H * 4), v.insert(v.end(), b, b + sh.H * 4);
    }
    for (int l = 0; l < layers; ++l) {
      std::vector<uint8_t> c(conv0[l].size()), q(ssm0[l].size());
      r.conv[l].download(c.data(), c.size()), r.ssm[l].download(q.data(), q.size());
      v.insert(v.end(), c.begin(), c.end()), v.insert(v.end(), q.begin(), q.end());
    }
    return v;
  }
};

}  // namespace ssmserve::cudatest
