// Owns the GPU backend's loaders and registration (see cuda_mamba.h) and the options' environment reader.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/env_options.h"
#include "core/error.h"
#include "device/device.h"
#include "model/archs/mamba.h"
#include "model/archs/mamba2.h"
#include "model/archs/minimax.h"
#include "runtime/cuda_decoder.h"
#include "runtime/cuda_mamba.h"
#include "runtime/cuda_minimax.h"
#include "runtime/runner_common.h"

namespace ssmserve::cuda {

std::unique_ptr<CausalLM> load_mamba_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt, const dist::TpRank& tp) {
  return load_cuda_decoder(cfg, mamba_spec(cfg), format, opt, tp);
}

std::unique_ptr<CausalLM> load_mamba2_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt, const dist::TpRank& tp) {
  return load_cuda_decoder(cfg, mamba2_spec(cfg), format, opt, tp);
}

std::unique_ptr<CausalLM> load_minimax_cuda(const ModelConfig& cfg, LoadFormat format, CudaModelOptions opt) {
  return load_cuda_decoder(cfg, minimax_spec(cfg), format, opt);
}

CudaModelOptions CudaModelOptions::from_env() {
  const EnvOptions& env = env_options();
  CudaModelOptions o;
  auto flag = [&](const char* name, bool& v) {
    if (const auto e = env.gpu_value(name)) {
      SSM_CHECK(*e == "0" || *e == "1", "{}={}: expected 0 or 1", name, *e);
      v = *e == "1";
    }
  };
  auto int_in = [&](const char* name, auto& v, long long lo, long long hi) {
    if (const auto e = env.gpu_value(name)) {
      char* end = nullptr;
      const long long x = std::strtoll(e->c_str(), &end, 10);
      SSM_CHECK(end && *end == 0 && x >= lo && x <= hi, "{}={}: expected an integer in [{}, {}]", name, *e, lo, hi);
      v = static_cast<std::remove_reference_t<decltype(v)>>(x);
    }
  };
  flag("SSMSERVE_CUDA_GRAPHS", o.cuda_graphs);
  flag("SSMSERVE_PDL", o.pdl);
  flag("SSMSERVE_BATCH_INVARIANT", o.batch_invariant);
  flag("SSMSERVE_DECODE_DATAFLOW", o.dataflow_decode);
  flag("SSMSERVE_SSD_TF32", o.ssd_tf32);
  flag("SSMSERVE_LAYER_PROFILE", o.layer_profile);
  int_in("SSMSERVE_PROFILE_REPLAY", o.profile_replay, 0, 1 << 30);
  flag("SSMSERVE_FUSE_PARALLEL_PROJ", o.fuse_parallel_projections);
  flag("SSMSERVE_PARALLEL_MIXER_BRANCH", o.parallel_mixer_branch);
  flag("SSMSERVE_MOE_SHARED_BRANCH", o.moe_shared_branch);
  int_in("SSMSERVE_MOE_FUSED_SHARED_ADD", o.moe_fused_shared_add, 0, 2);
  flag("SSMSERVE_ATTN_TC_STAGE", o.attn_tc_stage);
  flag("SSMSERVE_ATTN_TC_WGMMA", o.attn_tc_wgmma);
  flag("SSMSERVE_BRANCH_PDL", o.branch_pdl);
  flag("SSMSERVE_FUSE_SCALED_RESIDUAL", o.fuse_scaled_residual);
  flag("SSMSERVE_MLP_ACT_EPILOGUE", o.mlp_act_epilogue);
  flag("SSMSERVE_FUSE_CASTS", o.fuse_casts);
  flag("SSMSERVE_MOE_INPUT_COPY", o.moe_input_copy);
  flag("SSMSERVE_GDN_DECODE_FUSED", o.gdn_decode_fused);
  int_in("SSMSERVE_MOE_SHARED_ADD_IN_NORM", o.moe_shared_add_in_norm, 0, 2);
  int_in("SSMSERVE_OVERLAP_PREFETCH", o.overlap_prefetch, 0, 2);
  int_in("SSMSERVE_DECODE_OVERLAP", o.decode_overlap, 0, 31);
  int_in("SSMSERVE_SKINNY_MAX_M", o.skinny_max_m, 0, 1 << 20);
  // Kernel paths (comparisons and benchmarks).
  KernelTuning& k = o.kernels;
  if (const auto e = env.gpu_value("SSMSERVE_SKINNY_TUNE")) {  // "unroll,pipelined,reg_cap,cta_splits"
    int u = 0, p = 0, c = 0, cta = 0;
    SSM_CHECK(std::sscanf(e->c_str(), "%d,%d,%d,%d", &u, &p, &c, &cta) == 4,
              "SSMSERVE_SKINNY_TUNE={}: expected unroll,pipelined,reg_cap,cta_splits", *e);
    SkinnyTuning t;
    t.unroll = u, t.pipelined = p != 0, t.reg_cap = c != 0, t.cta_splits = cta;
    k.skinny_tune = t;
  }
  flag("SSMSERVE_SKINNY_LATE_TRIGGER", k.skinny_late_trigger);
  flag("SSMSERVE_SKINNY_PRELOAD", k.skinny_preload);
  flag("SSMSERVE_SKINNY_RULES", k.skinny_rules);
  int_in("SSMSERVE_SKINNY_SPLIT_RULE", k.skinny_split_rule, 0, 1);
  if (env.gpu_value("SSMSERVE_SKINNY_PREFETCH_MB")) {
    int64_t mb = 0;
    int_in("SSMSERVE_SKINNY_PREFETCH_MB", mb, 0, 48);
    k.skinny_prefetch_bytes = mb << 20;
  }
  flag("SSMSERVE_KERNEL_PROFILE", k.kernel_profile);
  flag("SSMSERVE_LIGHTNING_KV_WG", k.lightning_kv_wg);
  int_in("SSMSERVE_LIGHTNING_WALK", k.lightning_walk, 0, 2);
  flag("SSMSERVE_DECODE_PREWAIT", k.decode_prewait);
  flag("SSMSERVE_SAMPLE_BUCKETS", k.sample_buckets);
  int_in("SSMSERVE_GDN_WALK", k.gdn_walk, 0, 2);
  flag("SSMSERVE_GDN_WY_GROUPED", k.gdn_wy_grouped);
  flag("SSMSERVE_ATTN_DECODE_KERNEL", k.attn_decode_kernel);
  int_in("SSMSERVE_ATTN_FILL_ITEMS", k.attn_fill_items, 64, 8192);
  flag("SSMSERVE_MOE_PAIR_GEMV", k.moe_pair_gemv);
  flag("SSMSERVE_MOE_PAIR_SORTED", k.moe_pair_sorted);
  flag("SSMSERVE_MOE_PAIR_PRELOAD", k.moe_pair_preload);
  flag("SSMSERVE_F32_GEMV_PRELOAD", k.f32_gemv_preload);
  int_in("SSMSERVE_MOE_DOWN_COMBINE", k.moe_down_combine, 0, 2);
  flag("SSMSERVE_MAMBA2_DECODE_FUSED", k.mamba2_decode_fused);
  flag("SSMSERVE_PREFILL_ROW_KERNELS", k.prefill_row_kernels);
  int_in("SSMSERVE_MOE_GROUPED_WG", k.moe_grouped_wg, 0, 3);
  int_in("SSMSERVE_ATTN_TC_WS", k.attn_tc_ws, 0, 2);
  if (const auto e = env.gpu_value("SSMSERVE_MOE_PAIR_TUNE")) {  // "rows,warps[,one_wave]" (0: by the rule)
    int r = -1, wp = -1, ow = 0;
    const int n = std::sscanf(e->c_str(), "%d,%d,%d", &r, &wp, &ow);
    SSM_CHECK((n == 2 || n == 3) && (r == 0 || r == 1 || r == 2 || r == 4) && (wp == 0 || wp == 4 || wp == 8) &&
                  (ow == 0 || ow == 1),
              "SSMSERVE_MOE_PAIR_TUNE={}: expected rows,warps[,one_wave] with rows 0, 1, 2 or 4, warps 0, 4 or 8, "
              "one_wave 0 or 1", *e);
    k.moe_pair_rows = r, k.moe_pair_warps = wp, k.moe_pair_one_wave = ow == 1;
  }
  return o;
}

CudaModelOptions CudaModelOptions::for_model(const ModelConfig& cfg) {
  CudaModelOptions o = from_env();
  if (cfg.dtype) {
    SSM_CHECK(*cfg.dtype == DType::BF16 || *cfg.dtype == DType::F32,
              "--dtype: the GPU runs bfloat16 or float32 weights (got {})", dtype_name(*cfg.dtype));
    o.weight_dtype = *cfg.dtype;
  }
  if (cfg.enforce_eager) o.cuda_graphs = false;  // vLLM's --enforce-eager
  return o;
}

void configure_gemm(GemmHandle& g, const CudaModelOptions& o) {
  g.set_skinny_max_m(o.skinny_max_m);
  g.set_batch_invariant(o.batch_invariant);
  g.set_pdl(o.pdl);
}

void register_cuda_backend() {
  for (const std::string& arch : supported_architectures())
    register_device_model(
        "cuda", arch,
        [](const ModelConfig& c, LoadFormat f) { return load_cuda_decoder(c, architecture_spec(c), f, CudaModelOptions::for_model(c)); },
        [] { return gpu_available(); });
  register_cuda_tensor_parallel();
}

}  // namespace ssmserve::cuda
