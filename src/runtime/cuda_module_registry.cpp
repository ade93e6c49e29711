// Owns the GPU module registry: one line per layer type the GPU runs (docs/architecture.md, "Adding a mixer / an
// FFN").
#include <array>

#include "core/error.h"
#include "runtime/modules/cuda_modules.h"

namespace ssmserve::cuda {

void CudaModule::forward_projected(const CudaStep&, const ModuleState&, float*, int64_t, float*) {
  fail("CudaModule::forward_projected: this module has no input projection");
}

std::span<const CudaModuleType> cuda_module_types() {
  static const std::array<CudaModuleType, 7> kModules = {{
      {"mamba1", &make_cuda_mamba1, cuda_mamba1_stack_decode()},
      {"mamba2", &make_cuda_mamba2, nullptr},
      {"lightning", &make_cuda_lightning, nullptr},
      {"gated_delta", &make_cuda_gated_delta, nullptr},
      {"attention", &make_cuda_attention, nullptr},
      {"mlp", &make_cuda_mlp, nullptr},
      {"moe", &make_cuda_moe, nullptr},
  }};
  return kModules;
}

const CudaModuleType& cuda_module_type(std::string_view kind) {
  std::string known;
  for (const CudaModuleType& t : cuda_module_types()) {
    if (t.kind == kind) return t;
    known += (known.empty() ? "" : ", ") + std::string(t.kind);
  }
  fail("--device cuda: layer type \"{}\" does not run on the GPU yet (it runs: {}; use --device cpu)", kind, known);
}

}  // namespace ssmserve::cuda
