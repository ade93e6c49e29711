// GPU dataflow Mamba-1 decode kernel (issue 7, kernels/cuda/dataflow_decode.h): the whole stack in one launch
// against the runner's op-by-op decode chain (within bf16 tolerance: the summation order differs) for several
// shapes, batch sizes and state dtypes; bit-identical on a second run, alone vs in a batch (batch invariance) and
// inside a CUDA graph; unsupported shapes and unaligned pointers refused. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda/dataflow_decode.h"
#include "mamba1_decode_case.h"

namespace ssmserve {
namespace {
using namespace cudatest;

/// The dataflow kernel's inputs for one run of a case: x_projᵀ per layer and the layer descriptors.
struct Dataflow {
  std::vector<DeviceBuffer> xt;
  std::vector<cuda::Mamba1DataflowLayer> host;
  DeviceBuffer dev, ws;
  Dataflow(const Mamba1DecodeCase& pc, const Mamba1DecodeCase::Run& r, cudaStream_t s) {
    const int64_t I = pc.sh.I, XD = pc.sh.R + 2 * pc.sh.N;
    for (int l = 0; l < pc.layers; ++l) {
      xt.emplace_back(XD * I * 2);
      SSM_CUDA_CHECK(cuda::mamba1_dataflow_transpose_x_proj(pc.w[l].x.data(), XD, I, xt.back().data(), s));
      host.push_back({pc.layer(r, l), xt.back().data()});
    }
    dev = DeviceBuffer(host.size() * sizeof(cuda::Mamba1DataflowLayer));
    dev.upload(host.data(), dev.bytes());
    ws = DeviceBuffer(cuda::mamba1_dataflow_workspace(pc.sh, pc.layers));
    ws.fill_bytes(0);
  }
  cudaError_t launch(const Mamba1DecodeCase& pc, Mamba1DecodeCase::Run& r, cudaStream_t s,
                     const cuda::Mamba1DataflowOptions& opt = {}) {
    const cuda::Mamba1DataflowBuffers buf{r.hidden.as<float>(), r.out.as<float>(), r.si.as<int32_t>(), ws.data(),
                                          ws.bytes()};
    return cuda::mamba1_dataflow_decode(pc.sh, host.data(), static_cast<const cuda::Mamba1DataflowLayer*>(dev.data()),
                                        pc.layers, pc.M, buf, opt, s);
  }
};

/// Non-null rows of hidden and out, then every layer's states (non-null blocks), as floats.
std::vector<float> floats(const Mamba1DecodeCase& pc, const Mamba1DecodeCase::Run& r) {
  std::vector<float> v;
  const int64_t H = pc.sh.H;
  const auto h = to_host<float>(r.hidden, pc.M * H), o = to_host<float>(r.out, pc.M * H);
  for (int m = 0; m < pc.M; ++m) {
    if (pc.si[m] == 0) continue;
    v.insert(v.end(), h.begin() + m * H, h.begin() + (m + 1) * H);
    v.insert(v.end(), o.begin() + m * H, o.begin() + (m + 1) * H);
  }
  for (int l = 0; l < pc.layers; ++l) {
    for (const DeviceBuffer* b : {&r.conv[l], &r.ssm[l]}) {
      const size_t elems = (b == &r.conv[l] ? pc.conv0[l].size() : pc.ssm0[l].size()) / dtype_size(pc.sd);
      const size_t per_block = elems / pc.blocks;
      std::vector<float> all;
      if (pc.sd == DType::F32) {
        all = to_host<float>(*b, elems);
      } else {
        all = bf16_bits_to_f32(to_host<uint16_t>(*b, elems));
      }
      for (int m = 0; m < pc.M; ++m)
        if (pc.si[m] != 0)
          v.insert(v.end(), all.begin() + pc.si[m] * per_block, all.begin() + (pc.si[m] + 1) * per_block);
    }
  }
  return v;
}

/// ||a - b|| / ||b|| and max |a - b| / max |b|.
std::pair<double, double> rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0, mx = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d, den += static_cast<double>(b[i]) * b[i];
    mx = std::max(mx, std::fabs(d)), mb = std::max(mb, std::fabs(static_cast<double>(b[i])));
  }
  return {std::sqrt(num / std::max(den, 1e-30)), mx / std::max(mb, 1e-30)};
}

TEST(CudaDataflowDecode, MatchesOpChainAndIsDeterministic) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<std::pair<const char*, cuda::Mamba1DecodeShape>> shapes = {
      {"tiny-mamba", {256, 512, 16, 16, 4, 1e-5f}}, {"odd", {520, 1048, 8, 24, 3, 1e-5f}},
      {"mamba-130m", {768, 1536, 16, 48, 4, 1e-5f}},
      // Fewer channel pairs and out_proj rows than SMs (blocks with no channels / rows), d_conv 2; d_state 256.
      {"narrow", {64, 128, 8, 8, 2, 1e-5f}}, {"d_state 256", {256, 512, 256, 16, 4, 1e-5f}},
      // K not a multiple of 32, so the last warp's k range ends in a cut chunk (in_proj's K = H 424, out_proj's
      // K = I 3208); before it an odd number of whole chunks for some of the warps-per-group counts the test runs
      // (in_proj: 10 and 5 warps; out_proj: 10 and 2), which the GEMVs' chunk-pair loops handle apart.
      {"ragged k", {424, 848, 8, 32, 4, 1e-5f}}, {"ragged wide k", {256, 3208, 8, 16, 4, 1e-5f}}};
  if (!quick()) shapes.push_back({"mamba-2.8b", {2560, 5120, 16, 160, 4, 1e-5f}});
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  for (const auto& [name, sh] : shapes) {
    for (DType sd : {DType::F32, DType::BF16}) {
      for (int M : {1, 3, 8}) {
        SCOPED_TRACE(::testing::Message() << name << " M=" << M << " state " << dtype_name(sd));
        if (!cuda::mamba1_dataflow_supported(sh, M, sd)) {  // shared memory: large shapes take fewer rows
          ASSERT_GT(M, 4);
          continue;
        }
        const int nl = 3;
        Mamba1DecodeCase pc(rng, sh, nl, M, sd);
        auto ref = pc.fresh();
        for (int l = 0; l < nl; ++l) pc.chain(ref, l, s);
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto want = floats(pc, ref);

        auto r = pc.fresh();
        Dataflow df(pc, r, s);
        SSM_CUDA_CHECK(df.launch(pc, r, s));
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        const auto got = floats(pc, r);
        ASSERT_EQ(got.size(), want.size());
        const auto [l2, lmax] = rel_err(got, want);
        EXPECT_LT(l2, 1e-2) << "relative L2 error against the op chain";
        EXPECT_LT(lmax, 5e-2) << "max error / max |value| against the op chain";
        for (float v : got) ASSERT_TRUE(std::isfinite(v));

        // The first run's workspace again (its launch generation moved on, its exchange words hold the first
        // run's flags), with the flags' generation bits wrapping every 2 launches (a wrap zeroes the exchange
        // words): the same bits every time.
        for (int rep = 0; rep < 3; ++rep) {
          auto r4 = pc.fresh();
          Dataflow d4(pc, r4, s);
          std::swap(d4.ws, df.ws);
          cuda::Mamba1DataflowOptions o;
          o.flag_wrap_log2 = 1;
          SSM_CUDA_CHECK(d4.launch(pc, r4, s, o));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          std::swap(d4.ws, df.ws);
          EXPECT_TRUE(pc.result(r4) == pc.result(r)) << "workspace re-used, launch " << rep;
        }

        // A second run on a fresh workspace: the same bits.
        auto r2 = pc.fresh();
        Dataflow df2(pc, r2, s);
        SSM_CUDA_CHECK(df2.launch(pc, r2, s));
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_TRUE(pc.result(r2) == pc.result(r)) << "second run differs";

        // Inside a CUDA graph, replayed: the same bits.
        auto r3 = pc.fresh();
        Dataflow df3(pc, r3, s);
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        cudaGraph_t g = nullptr;
        cudaGraphExec_t e = nullptr;
        SSM_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        SSM_CUDA_CHECK(df3.launch(pc, r3, s));
        SSM_CUDA_CHECK(cudaStreamEndCapture(s, &g));
        SSM_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
        SSM_CUDA_CHECK(cudaGraphLaunch(e, s));
        SSM_CUDA_CHECK(cudaStreamSynchronize(s));
        EXPECT_TRUE(pc.result(r3) == pc.result(r)) << "graph";
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);

        // GEMV slots taken in turn by 1 / 5 groups of consumer warps (default 2): another split order, within
        // tolerance. 3 does not divide the consumer warps and runs as 1: the same bits as 1.
        std::vector<uint8_t> one;
        for (int groups : {1, 5, 3}) {
          auto rg = pc.fresh();
          Dataflow dg(pc, rg, s);
          cuda::Mamba1DataflowOptions o;
          o.slot_groups = o.slot_groups_out = groups;
          SSM_CUDA_CHECK(dg.launch(pc, rg, s, o));
          SSM_CUDA_CHECK(cudaStreamSynchronize(s));
          const auto [g2, gmax] = rel_err(floats(pc, rg), want);
          EXPECT_LT(g2, 1e-2) << groups << " slot groups";
          EXPECT_LT(gmax, 5e-2) << groups << " slot groups";
          if (groups == 1) one = pc.result(rg);
          if (groups == 3) {
            EXPECT_TRUE(pc.result(rg) == one) << "3 slot groups should run as 1";
          }
        }
      }
    }
  }
}

TEST(CudaDataflowDecode, RowAloneEqualsRowInBatch) {
  REQUIRE_GPU();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const cuda::Mamba1DecodeShape sh{768, 1536, 16, 48, 4, 1e-5f};
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const int nl = 2, M = 5;
  Mamba1DecodeCase batch(rng, sh, nl, M, DType::F32);
  auto rb = batch.fresh();
  Dataflow db(batch, rb, s);
  SSM_CUDA_CHECK(db.launch(batch, rb, s));
  SSM_CUDA_CHECK(cudaStreamSynchronize(s));
  const int64_t H = sh.H;
  const auto hb = to_host<float>(rb.hidden, M * H), ob = to_host<float>(rb.out, M * H);
  const std::vector<int32_t> si = batch.si;
  const std::vector<float> hidden0 = batch.hidden0, out0 = batch.out0;
  for (int m : {0, 2, 4}) {  // row 1 is the null row
    // The same case with only row m (same weights and initial states).
    Mamba1DecodeCase& one = batch;
    one.M = 1;
    one.si = {si[m]};
    one.hidden0.assign(hidden0.begin() + m * H, hidden0.begin() + (m + 1) * H);
    one.out0.assign(out0.begin() + m * H, out0.begin() + (m + 1) * H);
    auto r1 = one.fresh();
    Dataflow d1(one, r1, s);
    std::swap(d1.ws, db.ws);  // the batch's workspace (words of 5-row launches) for the 1-row launch
    SSM_CUDA_CHECK(d1.launch(one, r1, s));
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    std::swap(d1.ws, db.ws);
    const auto h1 = to_host<float>(r1.hidden, H), o1 = to_host<float>(r1.out, H);
    EXPECT_EQ(0, std::memcmp(h1.data(), hb.data() + m * H, H * 4)) << "hidden, row " << m;
    EXPECT_EQ(0, std::memcmp(o1.data(), ob.data() + m * H, H * 4)) << "out, row " << m;
    for (int l = 0; l < nl; ++l) {
      const size_t per = (sh.W - 1) * sh.I, pq = sh.I * sh.N;
      const auto cb = to_host<float>(rb.conv[l], per * batch.blocks), c1 = to_host<float>(r1.conv[l], per * batch.blocks);
      const auto qb = to_host<float>(rb.ssm[l], pq * batch.blocks), q1 = to_host<float>(r1.ssm[l], pq * batch.blocks);
      const int64_t blk = si[m];
      EXPECT_EQ(0, std::memcmp(c1.data() + blk * per, cb.data() + blk * per, per * 4)) << "conv state, layer " << l;
      EXPECT_EQ(0, std::memcmp(q1.data() + blk * pq, qb.data() + blk * pq, pq * 4)) << "ssm state, layer " << l;
    }
  }
}

TEST(CudaDataflowDecode, RefusesWhatItDoesNotTake) {
  REQUIRE_GPU();
  const cuda::Mamba1DecodeShape sh{768, 1536, 16, 48, 4, 1e-5f};
  EXPECT_TRUE(cuda::mamba1_dataflow_supported(sh, 1, DType::F32));
  EXPECT_FALSE(cuda::mamba1_dataflow_supported(sh, 0, DType::F32));
  EXPECT_FALSE(cuda::mamba1_dataflow_supported(sh, cuda::kDataflowMaxRows + 1, DType::F32));
  EXPECT_FALSE(cuda::mamba1_dataflow_supported(sh, 1, DType::F16));
  EXPECT_FALSE(cuda::mamba1_dataflow_supported({770, 1536, 16, 48, 4, 1e-5f}, 1, DType::F32));  // H % 8
  EXPECT_FALSE(cuda::mamba1_dataflow_supported({768, 1536, 16, 44, 4, 1e-5f}, 1, DType::F32));  // R % 8
  std::mt19937 rng(7);
  cuda::Stream stream;
  Mamba1DecodeCase pc(rng, sh, 1, 1, DType::F32);
  auto r = pc.fresh();
  Dataflow df(pc, r, stream.get());
  df.host[0].w.in_proj = static_cast<const char*>(df.host[0].w.in_proj) + 2;  // not 16-byte aligned
  EXPECT_EQ(cudaErrorInvalidValue, df.launch(pc, r, stream.get()));
  df.host[0].w.in_proj = static_cast<const char*>(df.host[0].w.in_proj) - 2;
  const cuda::Mamba1DataflowBuffers odd{r.hidden.as<float>() + 1, r.out.as<float>(), r.si.as<int32_t>(), df.ws.data(),
                                        df.ws.bytes()};  // hidden not 16-byte aligned
  EXPECT_EQ(cudaErrorInvalidValue,
            cuda::mamba1_dataflow_decode(sh, df.host.data(), static_cast<const cuda::Mamba1DataflowLayer*>(df.dev.data()),
                                         1, 1, odd, {}, stream.get()));
  const cuda::Mamba1DataflowBuffers good{r.hidden.as<float>(), r.out.as<float>(), r.si.as<int32_t>(), df.ws.data(),
                                         df.ws.bytes()};
  EXPECT_EQ(cudaErrorInvalidValue,  // more layers than the exchange flags hold (checked before any layer is read)
            cuda::mamba1_dataflow_decode(sh, df.host.data(), static_cast<const cuda::Mamba1DataflowLayer*>(df.dev.data()),
                                         cuda::kDataflowMaxLayers + 1, 1, good, {}, stream.get()));
  const cuda::Mamba1DataflowBuffers small{r.hidden.as<float>(), r.out.as<float>(), r.si.as<int32_t>(), df.ws.data(), 16};
  EXPECT_EQ(cudaErrorInvalidValue,
            cuda::mamba1_dataflow_decode(sh, df.host.data(), static_cast<const cuda::Mamba1DataflowLayer*>(df.dev.data()),
                                         1, 1, small, {}, stream.get()));
}

}  // namespace
}  // namespace ssmserve

namespace ssmserve {
namespace {
using namespace cudatest;

/// Benchmark (run with --gtest_also_run_disabled_tests): 64 mamba-2.8b-shape layers (8 random weight sets used in
/// turn, 660 MB, so every layer streams from HBM) at M = 1, 2, 4: µs per layer of the whole launch (CUDA events,
/// median of 5), then one timed launch: every block's phase times (median over layers and blocks) and how far the
/// slowest block lags at each phase's end. Env: SSMSERVE_DATAFLOW_{DEBUG,INFLIGHT,GROUPS,GROUPS_OUT,POLL_NS}
/// (options), SSMSERVE_DATAFLOW_ONLY_M1.
TEST(CudaDataflowDecode, DISABLED_PhaseTimes) {
  REQUIRE_GPU();
  std::mt19937 rng(3);
  const cuda::Mamba1DecodeShape sh{2560, 5120, 16, 160, 4, 1e-5f};
  cuda::Stream stream;
  const cudaStream_t s = stream.get();
  const int sets = 8, nl = 64;
  const char* dbg = std::getenv("SSMSERVE_DATAFLOW_DEBUG");
  const int debug = dbg ? std::atoi(dbg) : 0;
  const char* inf = std::getenv("SSMSERVE_DATAFLOW_INFLIGHT");
  const int inflight = inf ? std::atoi(inf) : cuda::Mamba1DataflowOptions{}.inflight;
  const char* sg = std::getenv("SSMSERVE_DATAFLOW_GROUPS");
  const int groups = sg ? std::atoi(sg) : cuda::Mamba1DataflowOptions{}.slot_groups;
  const char* sgo = std::getenv("SSMSERVE_DATAFLOW_GROUPS_OUT");
  const int groups_out = sgo ? std::atoi(sgo) : cuda::Mamba1DataflowOptions{}.slot_groups_out;
  const char* pn = std::getenv("SSMSERVE_DATAFLOW_POLL_NS");
  const int poll_ns = pn ? std::atoi(pn) : cuda::Mamba1DataflowOptions{}.poll_ns;
  int sms = 0;
  SSM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const bool only_m1 = std::getenv("SSMSERVE_DATAFLOW_ONLY_M1") != nullptr;
  for (int M : {1, 2, 4}) {
    if (((debug & 3) || only_m1) && M > 1) break;
    Mamba1DecodeCase pc(rng, sh, sets, M, DType::F32);
    auto r = pc.fresh();
    Dataflow df(pc, r, s);
    std::vector<cuda::Mamba1DataflowLayer> host;
    for (int l = 0; l < nl; ++l) host.push_back(df.host[l % sets]);
    DeviceBuffer dev(host.size() * sizeof(cuda::Mamba1DataflowLayer));
    dev.upload(host.data(), dev.bytes());
    DeviceBuffer ws(cuda::mamba1_dataflow_workspace(sh, nl)), timing(static_cast<size_t>(nl) * sms * cuda::kDataflowTimePoints * 8);
    timing.fill_bytes(0);
    ws.fill_bytes(0);
    const cuda::Mamba1DataflowBuffers buf{r.hidden.as<float>(), r.out.as<float>(), r.si.as<int32_t>(), ws.data(),
                                          ws.bytes()};
    auto launch = [&](unsigned long long* t) {
      SSM_CUDA_CHECK(cuda::mamba1_dataflow_decode(sh, host.data(), static_cast<const cuda::Mamba1DataflowLayer*>(dev.data()),
                                                  nl, M, buf, {t, debug, inflight, groups, groups_out, 20, poll_ns}, s));
    };
    cudaEvent_t e0, e1;
    SSM_CUDA_CHECK(cudaEventCreate(&e0));
    SSM_CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> us;
    for (int rep = 0; rep < 6; ++rep) {
      SSM_CUDA_CHECK(cudaEventRecord(e0, s));
      launch(nullptr);
      SSM_CUDA_CHECK(cudaEventRecord(e1, s));
      SSM_CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      SSM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0) us.push_back(ms * 1000.0f / nl);
    }
    std::sort(us.begin(), us.end());
    launch(static_cast<unsigned long long*>(timing.data()));
    SSM_CUDA_CHECK(cudaStreamSynchronize(s));
    constexpr int kP = cuda::kDataflowTimePoints;
    const auto t = to_host<unsigned long long>(timing, static_cast<size_t>(nl) * sms * kP);
    auto at = [&](int l, int b, int k) { return t[(static_cast<size_t>(l) * sms + b) * kP + k]; };
    std::printf("dataflow M=%d: %.2f us per layer (median of 5 untimed launches; 82 MB of weights = 19.3 us at 4.25 "
                "TB/s)\n", M, us[us.size() / 2]);
    auto median = [](std::vector<double> d) {
      std::sort(d.begin(), d.end());
      return d[d.size() / 2];
    };
    const char* names[kP] = {"norm (residual + 1/rms wait)", "x rows", "conv", "x_proj partials", "z rows",
                             "xdbl wait + read", "dt", "scan + y publish", "y wait + read", "out rows",
                             "residual publish", "to the next layer's start"};
    std::printf("  timed launch, layers 1..%d, every block: phase median (us) | median over layers of the slowest "
                "block's lag behind the median block at the phase's end (us)\n", nl - 2);
    for (int k = 0; k < kP; ++k) {
      std::vector<double> d, lag;
      for (int l = 1; l + 1 < nl; ++l) {
        std::vector<double> ends;
        for (int b = 0; b < sms; ++b) {
          const unsigned long long a = at(l, b, k), e = k + 1 < kP ? at(l, b, k + 1) : at(l + 1, b, 0);
          d.push_back(static_cast<double>(e - a) / 1000.0);
          ends.push_back(static_cast<double>(e) / 1000.0);
        }
        std::sort(ends.begin(), ends.end());
        lag.push_back(ends.back() - ends[ends.size() / 2]);
      }
      std::printf("  %-30s %6.2f | %5.2f\n", names[k], median(d), median(lag));
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
}

}  // namespace
}  // namespace ssmserve
