// Owns the GPU backend's loaders and registration (see cuda_mamba.h) and the options' environment reader.
#include <cstdlib>
#include <string>

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
  CudaModelOptions o;
  auto flag = [](const char* name, bool& v) {
    if (const char* e = std::getenv(name); e && *e) {
      const std::string s(e);
      SSM_CHECK(s == "0" || s == "1", "{}={}: expected 0 or 1", name, s);
      v = s == "1";
    }
  };
  flag("SSMSERVE_CUDA_GRAPHS", o.cuda_graphs);
  flag("SSMSERVE_PDL", o.pdl);
  flag("SSMSERVE_BATCH_INVARIANT", o.batch_invariant);
  flag("SSMSERVE_DECODE_DATAFLOW", o.dataflow_decode);
  flag("SSMSERVE_SSD_TF32", o.ssd_tf32);
  auto int_in = [](const char* name, auto& v, long long hi) {
    if (const char* e = std::getenv(name); e && *e) {
      char* end = nullptr;
      const long long x = std::strtoll(e, &end, 10);
      SSM_CHECK(end && *end == 0 && x >= 0 && x <= hi, "{}={}: expected an integer in [0, {}]", name, e, hi);
      v = static_cast<std::remove_reference_t<decltype(v)>>(x);
    }
  };
  int_in("SSMSERVE_OVERLAP_PREFETCH", o.overlap_prefetch, 2);
  int_in("SSMSERVE_DECODE_OVERLAP", o.decode_overlap, 31);
  int_in("SSMSERVE_SKINNY_MAX_M", o.skinny_max_m, 1 << 20);
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
        [](const ModelConfig& c, LoadFormat f) { return load_cuda_decoder(c, architecture_spec(c), f, CudaModelOptions::from_env()); },
        [] { return gpu_available(); });
  register_cuda_tensor_parallel();
}

}  // namespace ssmserve::cuda
