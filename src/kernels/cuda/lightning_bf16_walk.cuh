// Owns the range walk of the bf16 lightning prefill (step 3 of lightning_bf16.cu on mma.sync: one CTA per range and
// head carrying the fp32 state through the range in 64-token chunks) and its launcher. Part of lightning_bf16.cu's
// translation unit: included there inside its anonymous namespace, after the constants and helpers it uses.
template <int D>
constexpr size_t walk_smem_bytes() {
  return (2 * 3 * kChunk + D) * (D + 8) * sizeof(bf16) + (kChunk + 4) * sizeof(float);
}

/// 3 (walk; replaces 2b and 3). Grid (num_ranges, H), 8 warps. One CTA walks its range's tokens in chunks of 64
/// (counted from the range start: the math does not depend on the block grid) carrying the state in fp32
/// accumulators, from S_r (step 2, agg) at the range start; per chunk of n rows with S entering it (a bf16 copy in
/// shared memory), i, j chunk-local:
///   o_i = e^{-s(i+1)} q_i S + sum_{j<=i} e^{-s(i-j)} (q_i . k_j) v_j,   S <- e^{-s n} S + sum_j e^{-s(n-1-j)} k_j^T v_j
/// so no per-block state goes through memory and each query meets at most 64 keys. Q / K / V chunks stream through
/// two cp.async stages (the next chunk loads while this one computes). Output: warp w owns rows 16 (w % 4).. and
/// columns (w / 4) D / 2.. (the pair recomputes its rows' scores); state: rows (w % 4) D / 4.., columns (w / 4) D / 2..
template <int D, class TO>
__global__ void __launch_bounds__(kWalkThreads, 1) walk_kernel(const bf16* __restrict__ qkv, int64_t qs,
                                                               TO* __restrict__ out, int64_t os, LightningDevParams p,
                                                               LightningPlanDev plan, const float* __restrict__ agg) {
  constexpr int LD = D + 8, CH = D / 8, KD = D / 16, OC = D / 2, ON = OC / 8;
  constexpr int WM = D / 4, WN = D / 2, MI = WM / 16, NI = WN / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* const stage0 = reinterpret_cast<bf16*>(smem);  // [2][Q, K, V][64][LD]
  bf16* const Ss = stage0 + 2 * 3 * kChunk * LD;        // [D][LD] bf16(S entering the chunk)
  float* const dd = reinterpret_cast<float*>(Ss + D * LD);  // [65] e^{-s k}

  const int r = blockIdx.x, h = blockIdx.y;
  const int b0 = plan.ranges[3 * r], ntok = plan.ranges[3 * r + 2];
  const int tok0 = plan.blocks[3 * b0], seq = plan.blocks[3 * b0 + 2];
  TO* const outr = out + static_cast<int64_t>(tok0) * os + static_cast<int64_t>(h) * D;
  if (plan.state_indices[seq] == 0) {
    for (int idx = threadIdx.x; idx < ntok * D; idx += kWalkThreads)
      store(outr + static_cast<int64_t>(idx / D) * os + idx % D, 0.0f);
    return;
  }
  const bool has_state = b0 != plan.seq_first_block[seq] || plan.num_computed[seq] > 0;
  const bf16* const qbase = qkv + static_cast<int64_t>(tok0) * qs + static_cast<int64_t>(h) * 3 * D;
  const int nchunk = (ntok + kChunk - 1) / kChunk;
  auto issue = [&](int c) {  // chunk c's Q, K, V rows into stage c % 2; rows past the range zero-filled
    bf16* st = stage0 + (c & 1) * 3 * kChunk * LD;
    for (int idx = threadIdx.x; idx < 3 * kChunk * CH; idx += kWalkThreads) {
      const int rr = idx / CH, cc = (idx % CH) * 8, row = kChunk * c + rr % kChunk;
      const bool ok = row < ntok;
      cp_async16(st + rr * LD + cc, qbase + static_cast<int64_t>(ok ? row : 0) * qs + (rr / kChunk) * D + cc,
                 ok ? 16 : 0);
    }
  };
  issue(0);
  cp_async_commit_group();
  const float s = p.slopes[h];
  for (int k = threadIdx.x; k <= kChunk; k += kWalkThreads) dd[k] = decay(s, static_cast<double>(k));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wm = (warp & 3) * WM, wn = (warp >> 2) * WN;       // state tile
  const int wr = (warp & 3) * 16, oc = (warp >> 2) * OC;        // output tile
  float S[MI][NI][4];
  {
    const float* Sr = agg + (static_cast<int64_t>(r) * p.num_heads + h) * D * D;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int n = 0; n < NI; ++n) {
        const int row = wm + 16 * i + g, col = wn + 8 * n + 2 * t;
        float2 a = make_float2(0.f, 0.f), b = a;
        if (has_state) {
          a = *reinterpret_cast<const float2*>(Sr + row * D + col);
          b = *reinterpret_cast<const float2*>(Sr + (row + 8) * D + col);
        }
        S[i][n][0] = a.x, S[i][n][1] = a.y, S[i][n][2] = b.x, S[i][n][3] = b.y;
        *reinterpret_cast<uint32_t*>(Ss + row * LD + col) = pack_bf16(a.x, a.y);
        *reinterpret_cast<uint32_t*>(Ss + (row + 8) * LD + col) = pack_bf16(b.x, b.y);
      }
  }
  const int i0 = wr + g, i1 = i0 + 8;  // this thread's chunk-local query rows
  for (int c = 0; c < nchunk; ++c) {
    cp_async_wait_group<0>();
    __syncthreads();  // chunk c landed; S entering it is in Ss; every warp is done with the other stage
    if (c + 1 < nchunk) issue(c + 1);
    cp_async_commit_group();
    const int n = min(kChunk, ntok - kChunk * c);
    const bf16* Qs = stage0 + (c & 1) * 3 * kChunk * LD;
    const bf16* Ks = Qs + kChunk * LD;
    const bf16* Vs = Ks + kChunk * LD;
    uint32_t qf[KD][4];
#pragma unroll
    for (int k = 0; k < KD; ++k) load_a(qf[k], Qs, LD, wr, 16 * k);
    float o[ON][4] = {};
    if (c > 0 || has_state) {  // e^{-s(i+1)} q_i S
#pragma unroll
      for (int k = 0; k < KD; ++k)
#pragma unroll
        for (int m = 0; m < ON; m += 2) {
          uint32_t bb[4];
          load_b_kn(bb, Ss, LD, 16 * k, oc + 8 * m);
          mma_bf16(o[m], qf[k], bb[0], bb[1]);
          mma_bf16(o[m + 1], qf[k], bb[2], bb[3]);
        }
      const float f0 = dd[i0 + 1], f1 = dd[i1 + 1];
#pragma unroll
      for (int m = 0; m < ON; ++m) o[m][0] *= f0, o[m][1] *= f0, o[m][2] *= f1, o[m][3] *= f1;
    }
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {  // keys 16 kk.. (up to this warp's last row)
      if (16 * kk > wr) break;
      float sc[2][4] = {};
#pragma unroll
      for (int k = 0; k < KD; ++k) {
        uint32_t bb[4];
        load_b_nk(bb, Ks, LD, 16 * k, 16 * kk);
        mma_bf16(sc[0], qf[k], bb[0], bb[1]);
        mma_bf16(sc[1], qf[k], bb[2], bb[3]);
      }
      float v[2][4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = 16 * kk + 8 * half + 2 * t;
        v[half][0] = j <= i0 ? sc[half][0] * dd[i0 - j] : 0.0f;
        v[half][1] = j + 1 <= i0 ? sc[half][1] * dd[i0 - j - 1] : 0.0f;
        v[half][2] = j <= i1 ? sc[half][2] * dd[i1 - j] : 0.0f;
        v[half][3] = j + 1 <= i1 ? sc[half][3] * dd[i1 - j - 1] : 0.0f;
      }
      const uint32_t pa[4] = {pack_bf16(v[0][0], v[0][1]), pack_bf16(v[0][2], v[0][3]), pack_bf16(v[1][0], v[1][1]),
                              pack_bf16(v[1][2], v[1][3])};
#pragma unroll
      for (int m = 0; m < ON; m += 2) {
        uint32_t bb[4];
        load_b_kn(bb, Vs, LD, 16 * kk, oc + 8 * m);
        mma_bf16(o[m], pa, bb[0], bb[1]);
        mma_bf16(o[m + 1], pa, bb[2], bb[3]);
      }
    }
    TO* const outc = outr + static_cast<int64_t>(kChunk) * c * os;
#pragma unroll
    for (int m = 0; m < ON; ++m) {
      const int col = oc + 8 * m + 2 * t;
      if (i0 < n) store2(outc + static_cast<int64_t>(i0) * os + col, o[m][0], o[m][1]);
      if (i1 < n) store2(outc + static_cast<int64_t>(i1) * os + col, o[m][2], o[m][3]);
    }
    if (c + 1 == nchunk) break;  // the range's final state is step 2's business
    // S <- e^{-s n} S + sum_j bf16(e^{-s(n-1-j)} k_j)^T v_j (rows j >= n are zero-filled: weight 0)
    const float bd = dd[n];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int m = 0; m < NI; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) S[i][m][e] *= bd;
#pragma unroll
    for (int kk = 0; kk < kChunk; kk += 16) {
      float kd[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int j = kk + 2 * t + (q & 1) + 8 * (q >> 1);
        kd[q] = j < n ? dd[n - 1 - j] : 0.0f;
      }
      uint32_t a[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        load_a_t(a[i], Ks, LD, wm + 16 * i, kk);  // A = K^T: a0 / a1 keys 2t.., a2 / a3 keys 2t + 8..
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&a[i][q]));
          a[i][q] = q < 2 ? pack_bf16(x.x * kd[0], x.y * kd[1]) : pack_bf16(x.x * kd[2], x.y * kd[3]);
        }
      }
#pragma unroll
      for (int m = 0; m < NI; m += 2) {
        uint32_t bb[4];
        load_b_kn(bb, Vs, LD, kk, wn + 8 * m);
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          mma_bf16(S[i][m], a[i], bb[0], bb[1]);
          mma_bf16(S[i][m + 1], a[i], bb[2], bb[3]);
        }
      }
    }
    __syncthreads();  // every warp is done reading Ss
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
      for (int m = 0; m < NI; ++m) {
        const int row = wm + 16 * i + g, col = wn + 8 * m + 2 * t;
        *reinterpret_cast<uint32_t*>(Ss + row * LD + col) = pack_bf16(S[i][m][0], S[i][m][1]);
        *reinterpret_cast<uint32_t*>(Ss + (row + 8) * LD + col) = pack_bf16(S[i][m][2], S[i][m][3]);
      }
  }
}

template <int D, class TO>
cudaError_t launch_walk(const bf16* qkv, int64_t qs, TO* out, int64_t os, const LightningDevParams& p,
                        const LightningPlanDev& plan, const float* agg, cudaStream_t stream) {
  constexpr size_t smem = walk_smem_bytes<D>();
  const cudaError_t e = cudaFuncSetAttribute(walk_kernel<D, TO>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  walk_kernel<D, TO><<<dim3(plan.num_ranges, p.num_heads), kWalkThreads, smem, stream>>>(qkv, qs, out, os, p, plan, agg);
  return launch_status();
}
