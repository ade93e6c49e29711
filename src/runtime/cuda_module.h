// Owns the interface every GPU decoder module implements (the CUDA side of model/decoder/module.h: one per mixer or
// FFN kind, the same weights, names and state layout as the CPU module) and the GPU module registry. A new layer type
// on the GPU is one file implementing CudaModule plus one line in cuda_module_registry.cpp.
#pragma once
#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cuda/decode_ops.h"
#include "model/decoder/module.h"
#include "runtime/cuda_options.h"
#include "runtime/layer_profile.h"
#include "runtime/runner_common.h"
#include "runtime/tp_runner.h"

namespace ssmserve::cuda {

struct StepPlans;  // runtime/step_plans.h
struct CudaBranch;  // runtime/cuda_branch.h

/// Device scratch shared by the modules of one runner: slot -> grow-only buffer. Layers run one after another on one
/// stream, so any module may use any slot within a step; reserve() sizes every slot before the step (a captured step
/// must not allocate). Slots 0..7 hold activations; the named ones below hold workspaces, one buffer for all layers
/// (a layer's workspace is dead once its forward is enqueued), so a model's workspace memory does not grow with its
/// layer count (one per layer was 23 x 1.3 GB of MoE workspace for Nemotron-3-Nano at 8k-token prefill chunks).
/// Work on the second branch (CudaBranch: a MoE layer's shared expert) uses slots 0, 3, kMoeSharedIn and
/// kMoeSharedOut only, while the first branch's routed experts use kMoeRouter and kMoeWorkspace. A parallel mixer on
/// the second branch (CudaModelOptions::parallel_mixer_branch) has a pool of its own (the runner's second ScratchPool);
/// it reads its columns of this pool's kParallelProj, which the main stream does not write until the join.
class ScratchPool {
 public:
  static constexpr int kSlots = 15;
  static constexpr int kMixerWorkspace = 8;  ///< split-KV attention, lightning blocks, Mamba-1 scan, SSD chunks
  static constexpr int kMoeWorkspace = 9;    ///< sparse_moe (routing, sorted rows, expert activations and outputs)
  static constexpr int kMoeSharedIn = 10;    ///< the shared expert's input rows in the GEMM dtype
  static constexpr int kMoeSharedOut = 11;   ///< the shared expert's output rows
  static constexpr int kParallelProj = 12;   ///< a parallel mixer pair's stacked input projection (runner-owned)
  static constexpr int kParallelOut = 13;    ///< a parallel pair's first output, added with the second's (runner-owned)
  static constexpr int kMoeRouter = 14;      ///< a MoE layer's router logits [T, experts] fp32
  Scratch& operator[](int slot) { return s_.at(static_cast<size_t>(slot)); }
  /// Every slot's device pointer (DecodeGraphs signatures).
  void pointers(std::vector<const void*>& out) const {
    for (const Scratch& s : s_) out.push_back(s.buf.data());
  }

 private:
  std::array<Scratch, kSlots> s_;
};

/// What a module's forward sees of the step.
struct CudaStep {
  const ForwardBatch& batch;
  const StepMeta& meta;      ///< the batch's arrays on the device
  const StepPlans* plans;    ///< per-step plans of the lightning / attention layers (null when the model has none)
  int64_t T = 0;             ///< tokens (decode rows incl. padding, then prefill tokens)
  cudaStream_t stream = nullptr;
  /// The stream's last work is a wait on another stream's event (CudaBranch::fork): the module launches its first
  /// kernel plainly (no PDL: its dependency is the event, not a kernel before it on this stream), the rest as usual.
  bool forked = false;
  /// The normed rows in the weight dtype [T, hidden] as well, when an fp32-input module asked for them
  /// (CudaModule::wants_input_copy) and the runner's norm wrote them in its launch (the bits of cast_rows); else null.
  const void* x_copy = nullptr;
};

/// Resources a runner shares with its modules.
struct CudaRunnerContext {
  CudaModelOptions opt;
  GemmHandle* gemm = nullptr;
  RunnerTp* tp = nullptr;
  ScratchPool* scratch = nullptr;
  cudaStream_t stream = nullptr;
  LayerProfile* profile = nullptr;  ///< SSMSERVE_LAYER_PROFILE=1: modules time their parts (ProfileSpan), else null
  /// The runner's second stream for work that may overlap the first (CudaModelOptions::moe_shared_branch), or null:
  /// run everything on `stream`.
  CudaBranch* branch = nullptr;
  /// y [M, w.rows] fp32 (row stride y_stride) = x [M, w.cols] (the weight dtype, row stride x_stride) w^T; y2:
  /// optional bf16 copy with y's row stride.
  void gemm_run(const void* x, int64_t M, int64_t x_stride, const DevWeight& w, float* y, int64_t y_stride,
                void* y2 = nullptr) const {
    ProfileSpan span(profile, "gemm", stream);
    gemm->run({M, w.rows, w.cols, x, x_stride, w.buf.data(), w.cols, w.dtype, y, y_stride, DType::F32}, stream, y2, y_stride);
  }
};

/// The input a module reads: its sublayer's normed rows in the GEMM dtype, in fp32, or both.
enum class ModuleInput { GemmDtype, F32 };

/// One decoder module on the GPU. forward maps the normed rows to the module's output rows [T, hidden] fp32; the
/// runner adds the residual. Everything it enqueues goes on the step's stream and may be captured in a CUDA graph:
/// no allocation and no host synchronization inside forward.
class CudaModule {
 public:
  virtual ~CudaModule() = default;
  /// What this module keeps per request (the CPU module's declaration: block ids address the same bytes).
  virtual ModuleStateSpec state_spec() const { return {}; }
  /// Whether forward writes the step's "all"-mode state stores (StepMeta::stores: the conv window and recurrent state
  /// after each store offset of a prefill row into the store's block; prefix caching, docs/architecture.md §3a). A
  /// module without a recurrent state has nothing to store; a recurrent one overrides this once its kernels store.
  /// The runner stores prefill states (CausalLM::stores_prefill_states) only when every module does.
  virtual bool stores_prefill_states() const { return !state_spec().recurrent(); }
  /// Which form of the normed input forward reads.
  virtual ModuleInput input() const { return ModuleInput::GemmDtype; }
  /// An fp32-input module that also reads its rows in the weight dtype (a MoE layer's shared expert): the runner's norm
  /// then writes that copy in the same launch when it can (CudaStep::x_copy), instead of a cast inside the module.
  virtual bool wants_input_copy() const { return false; }
  /// The runner lets the module leave rows of its output to the next sublayer's residual norm (set where that norm adds
  /// this output and CudaModelOptions::moe_shared_add_in_norm is on): a MoE layer's shared-expert add, one launch
  /// fewer.
  virtual void set_add_to_next(bool on) { (void)on; }
  /// After forward: the rows forward left to the next norm, which adds them to this output first (add_rms_norm_rows'
  /// NormAddend: the bits of the add's own launch), or none (rows null); cleared by the call.
  virtual NormAddend take_pending_add() { return {}; }
  /// Sizes the scratch slots (and own workspaces) forward uses for T tokens and this step's plans (before the step,
  /// outside any capture: a captured step must not allocate).
  virtual void reserve(int64_t T, const StepPlans* plans) = 0;
  /// Device pointers of the module's own buffers that a captured step bakes in (DecodeGraphs signatures).
  virtual void pointers(std::vector<const void*>& out) const { (void)out; }
  /// Bytes of scratch per token (the state budget's workspace estimate).
  virtual double scratch_bytes_per_token() const = 0;
  /// Bytes of a workspace that grows with the step's contexts rather than its tokens, at most (the state budget
  /// reserves it): the attention's tensor-core partials and staged keys. 0 by default.
  virtual double context_workspace_bytes() const { return 0.0; }
  /// x: [T, hidden] normed rows in the weight dtype (input() == GemmDtype) or fp32 (F32); out: [T, hidden] fp32.
  virtual void forward(const CudaStep& step, const ModuleState& state, const void* x, float* out) = 0;

  /// The module's input projection: the first GEMM of forward, the only reader of its input (ModuleInput::GemmDtype),
  /// weight [rows, hidden]; null when it has none. The runner may stack it with a parallel sibling's (Falcon-H1's
  /// Mamba-2 in_proj and attention q / k / v on the same normed rows) and run the two as one GEMM, then call
  /// forward_projected. Modules that return one override drop_input_projection and forward_projected.
  virtual const DevWeight* input_projection() const { return nullptr; }
  /// Frees the module's copy of input_projection() (the runner keeps the stacked one; forward is unusable after).
  virtual void drop_input_projection() {}
  /// forward after the input projection: proj [T, input_projection()->rows] fp32, row stride proj_stride (a column range
  /// of the stacked GEMM's output; the module may overwrite it); out: [T, hidden] fp32. Throws Error when the module
  /// has no input projection.
  virtual void forward_projected(const CudaStep& step, const ModuleState& state, float* proj, int64_t proj_stride, float* out);
};

/// Everything a GPU module factory reads: the CPU module's arguments (weights by the same names and dummy
/// initializers) and the runner's resources.
struct CudaModuleArgs {
  const ModuleArgs& host;
  const CudaRunnerContext& ctx;
};

/// Builds one layer's GPU module. Throws Error as the CPU factory does, and for shapes or options the GPU kernels do
/// not cover (naming them).
using CudaModuleFactory = std::unique_ptr<CudaModule> (*)(const CudaModuleArgs& args);

/// Whole-stack decode path a mixer kind may offer (Mamba-1's dataflow kernel): for models whose layers are all this
/// mixer with pre-norm residuals and no FFN. Enqueues the whole stack for a decode-only step, leaving the last
/// layer's output in `out` un-added (the LM head's norm adds it), and returns true; false, doing nothing, when it does
/// not take the step.
using CudaStackDecodeFn = bool (*)(std::span<CudaModule* const> layers, std::span<const float* const> norms, float eps,
                                   const CudaStep& step, std::span<const ModuleState> states, float* hidden, float* out);

struct CudaModuleType {
  std::string_view kind;  ///< the CPU registry's kind
  CudaModuleFactory make = nullptr;
  CudaStackDecodeFn stack_decode = nullptr;
};

/// The module kinds the GPU runs (cuda_module_registry.cpp).
std::span<const CudaModuleType> cuda_module_types();
/// The entry of `kind`. Throws Error naming --device cuda and the kinds it runs when it has none.
const CudaModuleType& cuda_module_type(std::string_view kind);

}  // namespace ssmserve::cuda
