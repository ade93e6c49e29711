// Owns rotary position embeddings on the CPU (Su et al. 2021) in the "neox" / rotate_half layout that
// transformers' apply_rotary_pos_emb uses: pairs (i, i + rotary_dim/2), frequencies
// inv_freq[i] = 1 / theta^(2i / rotary_dim), angle = position * inv_freq[i], all in fp32 like HF's default RoPE.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace ssmserve::cpu {

/// inv_freq: [rotary_dim / 2] = 1 / theta^(2i / rotary_dim) in fp32 (HF's compute_default_rope_parameters).
/// Throws Error when rotary_dim is odd or < 2, or theta <= 0.
std::vector<float> rope_inv_freq(double theta, int rotary_dim);

/// Rotates the first rotary_dim dims of every head in place: x: [T, num_heads * head_dim] fp32 with row stride
/// x_stride; positions: [T]. x1 = x[:half], x2 = x[half:rotary_dim]: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin.
void apply_rope(float* x, int64_t x_stride, int64_t T, int num_heads, int head_dim, std::span<const int32_t> positions,
                std::span<const float> inv_freq);

}  // namespace ssmserve::cpu
