// Owns writing a model's dummy weights (--load-format dummy) as a Hugging Face checkpoint, so that transformers can
// run exactly the weights ssmserve generates: the goldens of architectures without a small trained checkpoint
// (tools/make_dummy_goldens.sh) come from these files, and the tests load the same weights with --load-format dummy.
#pragma once
#include <filesystem>

#include "config/model_config.h"

namespace ssmserve {

/// Loads cfg's architecture on the CPU with dummy weights and writes every tensor it generated, in bf16, to
/// `out_file` (safetensors; tensor names as the checkpoint's). When cfg.fp8 is set (config.json's quantization_config),
/// the projection matrices are written as an FP8 quantizer writes them instead: F8_E4M3 beside F32 scales per cfg.fp8's
/// blocks, named as its format names them (embeddings, LM head, norms, conv kernels, routers and DeltaNet's a / b
/// stay bf16). Throws Error as load_model does, or naming the file when it cannot be written.
void save_dummy_checkpoint(const ModelConfig& cfg, const std::filesystem::path& out_file);

}  // namespace ssmserve
