// Owns the one place the engine reads its environment: every SSMSERVE_* switch (docs/environment.md) read once into
// EnvOptions, which the engine, the server, the CPU allocator, the CPU kernels' dispatch and the GPU backend's
// options (CudaModelOptions) take their values from. No other file calls getenv.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ssmserve {

/// The environment's switches, read once at first use.
struct EnvOptions {
  bool huge_pages = true;        ///< SSMSERVE_HUGE_PAGES=0: CPU weights / pool on 4 KiB pages
  bool device_sampling = true;   ///< SSMSERVE_DEVICE_SAMPLING=0: sample on the host from downloaded logits
  int64_t fault_step = -1;       ///< SSMSERVE_FAULT_STEP=N: the server engine's N-th step fails (error-path tests)
  /// False when OMP_WAIT_POLICY, GOMP_SPINCOUNT or SSMSERVE_NO_OMP_DEFAULTS is set: keep libgomp's own spin policy.
  bool omp_defaults = true;
  std::string nccl_lib;          ///< SSMSERVE_NCCL_LIB: the libnccl to load first
  std::string vllm_api_key;      ///< VLLM_API_KEY: `serve`'s API key when --api-key is not given (as vLLM)
  std::string openai_api_key;    ///< OPENAI_API_KEY: the key `bench serve` sends (as vLLM's bench, the openai client)
  /// The Hugging Face hub cache, as huggingface_hub finds it: HF_HUB_CACHE, else $HF_HOME/hub, else
  /// $XDG_CACHE_HOME/huggingface/hub, else $HOME/.cache/huggingface/hub ("" without any of them).
  std::string hf_hub_cache;
  bool tp_p2p_allreduce = true;  ///< SSMSERVE_TP_P2P_ALLREDUCE=0: NCCL for every GPU all-reduce
  /// SSMSERVE_CPU_ISA: the CPU kernels' instruction-set variant (auto, scalar, avx2, avx512, native), as set;
  /// parsed and validated by kernels/cpu/isa/cpu_isa.cpp.
  std::string cpu_isa;
  /// The GPU backend's switches as set (name -> value; SSMSERVE_CUDA_GRAPHS, SSMSERVE_SKINNY_TUNE, ...), parsed and
  /// validated by CudaModelOptions::from_env.
  std::map<std::string, std::string> gpu;

  /// The value of `name` in `gpu`, if set and non-empty. Errors: std::logic_error when `name` is not one of
  /// gpu_switch_names() (read_env would never have read it: a switch added to the backend but not to the list).
  std::optional<std::string> gpu_value(const std::string& name) const;
};

/// Every GPU backend switch read_env collects into EnvOptions::gpu (each documented in docs/environment.md).
const std::vector<std::string>& gpu_switch_names();

/// The process's switches (read from the environment on the first call; later changes to the environment are not
/// seen).
const EnvOptions& env_options();

}  // namespace ssmserve
