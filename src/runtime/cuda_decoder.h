// Owns the GPU runner of every architecture: a DecoderSpec (model/decoder/decoder_spec.h) with each sublayer's module
// from the GPU module registry (runtime/cuda_module.h), in the one step frame of runner_common.h (metadata upload,
// embedding, sublayers, final norm, LM head, device greedy / sampling, multi-step decode, CUDA graphs for decode-only
// steps, tensor parallelism), the states in the device mirror of the pool at the CPU decoder's layout
// (model/decoder/state_layout.h), so block ids and block tables address the same states on both.
#pragma once
#include <memory>

#include "dist/communicator.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_spec.h"
#include "runtime/cuda_options.h"

namespace ssmserve::cuda {

/// Loads the model `spec` describes onto the current GPU (checkpoint or dummy weights: the CPU decoder's names, shapes
/// and dummy values), or rank tp.rank's shard of it (each module slices its own weights; embedding replicated, LM head
/// vocab-parallel, row-parallel projections all-reduced through tp.comm). Throws Error when no GPU is usable, on any
/// checkpoint / config defect, for a layer type, shape or option the GPU does not run (naming it), or a
/// tensor-parallel size a module cannot split.
std::unique_ptr<CausalLM> load_cuda_decoder(const ModelConfig& cfg, const DecoderSpec& spec, LoadFormat format,
                                            CudaModelOptions opt = {}, const dist::TpRank& tp = {});

}  // namespace ssmserve::cuda
