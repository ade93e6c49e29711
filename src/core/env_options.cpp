// Owns the reading of the environment (see env_options.h): the only getenv calls of the engine.
#include "core/env_options.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <cstring>

namespace ssmserve {
namespace {

const char* get(const char* name) { return std::getenv(name); }

bool off(const char* name) {  // "0" turns a default-on switch off; anything else leaves it on
  const char* v = get(name);
  return v && std::strcmp(v, "0") == 0;
}

EnvOptions read_env();

}  // namespace

const std::vector<std::string>& gpu_switch_names() {
  static const std::vector<std::string> names = {
      "SSMSERVE_CUDA_GRAPHS", "SSMSERVE_PDL", "SSMSERVE_BATCH_INVARIANT", "SSMSERVE_DECODE_DATAFLOW",
      "SSMSERVE_DECODE_OVERLAP", "SSMSERVE_OVERLAP_PREFETCH", "SSMSERVE_SKINNY_MAX_M", "SSMSERVE_SSD_TF32",
      "SSMSERVE_SKINNY_TUNE", "SSMSERVE_SKINNY_LATE_TRIGGER", "SSMSERVE_SKINNY_PRELOAD", "SSMSERVE_SKINNY_RULES",
      "SSMSERVE_SKINNY_SPLIT_RULE",
      "SSMSERVE_SKINNY_PREFETCH_MB", "SSMSERVE_KERNEL_PROFILE", "SSMSERVE_LIGHTNING_KV_WG", "SSMSERVE_LIGHTNING_WALK",
      "SSMSERVE_DECODE_PREWAIT", "SSMSERVE_SAMPLE_BUCKETS", "SSMSERVE_LAYER_PROFILE", "SSMSERVE_PROFILE_REPLAY",
      "SSMSERVE_FUSE_PARALLEL_PROJ", "SSMSERVE_PARALLEL_MIXER_BRANCH", "SSMSERVE_GDN_WALK", "SSMSERVE_GDN_WY_GROUPED",
      "SSMSERVE_ATTN_DECODE_KERNEL", "SSMSERVE_ATTN_FILL_ITEMS", "SSMSERVE_MOE_PAIR_GEMV", "SSMSERVE_MOE_PAIR_TUNE",
      "SSMSERVE_MOE_SHARED_BRANCH", "SSMSERVE_MOE_FUSED_SHARED_ADD", "SSMSERVE_BRANCH_PDL", "SSMSERVE_ATTN_TC_STAGE",
      "SSMSERVE_ATTN_TC_WGMMA", "SSMSERVE_FUSE_SCALED_RESIDUAL", "SSMSERVE_MOE_PAIR_SORTED",
      "SSMSERVE_PREFILL_ROW_KERNELS", "SSMSERVE_MOE_GROUPED_WG", "SSMSERVE_ATTN_TC_WS",
      "SSMSERVE_MLP_ACT_EPILOGUE", "SSMSERVE_FUSE_CASTS", "SSMSERVE_MOE_PAIR_PRELOAD",
      "SSMSERVE_F32_GEMV_PRELOAD", "SSMSERVE_MOE_DOWN_COMBINE", "SSMSERVE_MAMBA2_DECODE_FUSED", "SSMSERVE_GDN_DECODE_FUSED",
      "SSMSERVE_MOE_INPUT_COPY", "SSMSERVE_MOE_SHARED_ADD_IN_NORM"
  };
  return names;
}

std::optional<std::string> EnvOptions::gpu_value(const std::string& name) const {
  const auto& names = gpu_switch_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw std::logic_error("GPU switch " + name + " is not in env_options.cpp's gpu_switch_names(): it is never read");
  auto it = gpu.find(name);
  return it == gpu.end() || it->second.empty() ? std::nullopt : std::optional<std::string>(it->second);
}

namespace {

EnvOptions read_env() {
  EnvOptions o;
  o.huge_pages = !off("SSMSERVE_HUGE_PAGES");
  o.device_sampling = !off("SSMSERVE_DEVICE_SAMPLING");
  if (const char* f = get("SSMSERVE_FAULT_STEP")) o.fault_step = std::atoll(f);
  o.omp_defaults = !(get("OMP_WAIT_POLICY") || get("GOMP_SPINCOUNT") || get("SSMSERVE_NO_OMP_DEFAULTS"));
  if (const char* v = get("SSMSERVE_NCCL_LIB")) o.nccl_lib = v;
  if (const char* v = get("VLLM_API_KEY")) o.vllm_api_key = v;
  if (const char* v = get("OPENAI_API_KEY")) o.openai_api_key = v;
  if (const char* v = get("HF_HUB_CACHE"); v && *v) o.hf_hub_cache = v;
  else if (const char* h = get("HF_HOME"); h && *h) o.hf_hub_cache = std::string(h) + "/hub";
  else if (const char* x = get("XDG_CACHE_HOME"); x && *x) o.hf_hub_cache = std::string(x) + "/huggingface/hub";
  else if (const char* home = get("HOME"); home && *home) o.hf_hub_cache = std::string(home) + "/.cache/huggingface/hub";
  o.tp_p2p_allreduce = !off("SSMSERVE_TP_P2P_ALLREDUCE");
  if (const char* v = get("SSMSERVE_CPU_ISA")) o.cpu_isa = v;
  for (const std::string& name : gpu_switch_names())
    if (const char* v = get(name.c_str())) o.gpu[name] = v;
  return o;
}

}  // namespace

const EnvOptions& env_options() {
  static const EnvOptions o = read_env();
  return o;
}

}  // namespace ssmserve
