// Owns the scalar activation functions shared by the CPU kernels (SiLU, softplus), with the model math's
// exact conventions (vllm-ssm-design.md §5: softplus(x) = log(1 + e^x) for x <= 20, else x).
#pragma once
#include <cmath>

namespace ssmserve::cpu {

/// SiLU(x) = x * sigmoid(x).
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

/// softplus(x) = log1p(exp(x)) for x <= 20, x otherwise (PyTorch's threshold).
inline float softplus(float x) { return x <= 20.0f ? std::log1p(std::exp(x)) : x; }

}  // namespace ssmserve::cpu
