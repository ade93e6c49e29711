// Owns RMSNorm on the CPU (Zhang & Sennrich 2019; HF MambaRMSNorm): y = x / sqrt(mean(x^2) + eps) * weight.
#pragma once
#include <cstdint>

namespace ssmserve::cpu {

/// x: [T, H] fp32, weight: [H] fp32, y: [T, H] fp32 (may alias x). Statistics in fp32 as HF's float32 path.
void rms_norm(const float* x, const float* weight, float eps, int64_t T, int64_t H, float* y);

/// In place over strided rows: x: [T, H] fp32 with row stride `stride` (>= H), weight: [H]. Same arithmetic as rms_norm.
void rms_norm_strided(float* x, int64_t stride, const float* weight, float eps, int64_t T, int64_t H);

}  // namespace ssmserve::cpu
