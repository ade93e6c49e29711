// Owns DecoderLM loading: any DecoderSpec (model/decoder/decoder_spec.h) as a CausalLM on the CPU. The decoder
// runs embedding -> per layer [mixer sublayer, FFN sublayer] -> final RMSNorm -> LM head over the packed batch; each
// sublayer is RMSNorm -> module (model/decoder/module.h) -> residual rule. It places every module's per-request
// state in the one block pool (docs/architecture.md, "State layout"):
//  - models of recurrent layers only, all with the same state sizes (Mamba-1, Mamba-2): one pool layer per
//    recurrent layer, the page holding that layer's conv window and SSM state;
//  - otherwise (hybrids): one pool layer whose page holds every recurrent layer's conv window (in the conv part) and
//    state (in the SSM part) at offsets in layer order; a KV block of the softmax layers is a whole page (TP 1) or
//    a rank's part of the SSM region (TP > 1), its block size chosen so that its page is about a state page
//    (vLLM's page-size unification, computed for the unsharded model so every rank cuts the same blocks).
#pragma once
#include <memory>

#include "dist/communicator.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_spec.h"
#include "model/weight_source.h"

namespace ssmserve {

/// Loads the model `spec` describes from cfg.dir's checkpoint (or dummy weights), or rank tp.rank's tensor-parallel
/// shard of it (each module slices its own weights; embedding and LM head are vocab-parallel, dist/vocab_parallel.h;
/// the shard's forward is a collective over tp.comm and only ranks passing non-null logits get them). Throws Error
/// on any checkpoint / config defect, an unregistered module kind, dummy weights that would not fit in memory, or a
/// tensor-parallel size a module cannot split.
std::unique_ptr<CausalLM> load_decoder(const ModelConfig& cfg, const DecoderSpec& spec, LoadFormat format,
                                       const dist::TpRank& tp = {});

/// The same from an opened weight source (ckpt: the checkpoint it maps, kept alive by the model; null for dummy
/// sources). Same errors.
std::unique_ptr<CausalLM> load_decoder_from(const ModelConfig& cfg, const DecoderSpec& spec, WeightSource& src,
                                            std::shared_ptr<const Checkpoint> ckpt, const dist::TpRank& tp = {});

}  // namespace ssmserve
