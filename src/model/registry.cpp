// Owns the architecture registry: `architectures[0]` of config.json -> the loader of that model.
#include <algorithm>
#include <functional>
#include <map>
#include <mutex>

#include <spdlog/spdlog.h>

#include "core/error.h"
#include "kernels/cpu/isa/cpu_isa.h"
#include "model/archs/hybrids.h"
#include "model/archs/mamba.h"
#include "model/archs/mamba2.h"
#include "model/archs/minimax.h"
#include "model/archs/qwen.h"
#include "model/causal_lm.h"
#include "model/decoder/decoder_lm.h"
#include "model/tensor_parallel.h"

namespace ssmserve {
namespace {

/// The architectures: `architectures[0]` -> its mapping onto the decoder stack (one line each; every architecture
/// runs on DecoderLM, and splits over tensor-parallel ranks as its modules do).
const std::map<std::string, ArchitectureSpecFn>& registry() {
  static const std::map<std::string, ArchitectureSpecFn> r = {
      {"MambaForCausalLM", &mamba_spec},
      {"Mamba2ForCausalLM", &mamba2_spec},
      {"MiniMaxForCausalLM", &minimax_spec},
      {"GraniteMoeHybridForCausalLM", &granitemoehybrid_spec},
      {"BambaForCausalLM", &bamba_spec},
      {"NemotronHForCausalLM", &nemotron_h_spec},
      {"JambaForCausalLM", &jamba_spec},
      {"FalconH1ForCausalLM", &falcon_h1_spec},
      {"Qwen3_5ForConditionalGeneration", &qwen3_5_spec},
      {"Qwen3_5MoeForConditionalGeneration", &qwen3_5_spec},
      {"Qwen3_5ForCausalLM", &qwen3_5_spec},
      {"Qwen3_5MoeForCausalLM", &qwen3_5_spec},
      {"Qwen3NextForCausalLM", &qwen3_next_spec},
  };
  return r;
}

}  // namespace

std::vector<std::string> tensor_parallel_architectures() {
  std::vector<std::string> names;
  for (const auto& [k, v] : registry()) names.push_back(k);
  return names;
}

std::unique_ptr<CausalLM> load_model_shard(const ModelConfig& config, LoadFormat format, const dist::TpRank& tp) {
  const auto& r = registry();
  auto it = r.find(config.architecture);
  if (it == r.end()) {
    std::string known;
    for (const auto& [k, v] : r) known += (known.empty() ? "" : ", ") + k;
    fail("--tensor-parallel-size {}: architecture \"{}\" does not support tensor parallelism yet (supported: {})", tp.world,
         config.architecture, known);
  }
  return load_decoder(config, it->second(config), format, tp);
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const auto& [k, v] : registry()) names.push_back(k);
  return names;
}

DecoderSpec architecture_spec(const ModelConfig& config) {
  const auto& r = registry();
  auto it = r.find(config.architecture);
  if (it == r.end()) {
    std::string known;
    for (const auto& [k, v] : r) known += (known.empty() ? "" : ", ") + k;
    fail("{}: architecture \"{}\" is not supported (supported: {})", (config.dir / "config.json").string(),
         config.architecture, known);
  }
  return it->second(config);
}

std::unique_ptr<CausalLM> load_model(const ModelConfig& config, LoadFormat format) {
  return load_decoder(config, architecture_spec(config), format);
}

std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, LoadFormat format) {
  return load_model(ModelConfig::load(dir), format);
}

namespace {

struct DeviceBackend {
  std::function<bool()> available;
  std::map<std::string, DeviceModelLoader> loaders;  // architecture -> loader
  std::map<std::string, DeviceTpModelLoader> tp_loaders;  // architecture -> tensor-parallel loader
};

std::map<std::string, DeviceBackend>& device_backends() {
  static std::map<std::string, DeviceBackend> d;
  return d;
}

}  // namespace

void register_device_model(const std::string& device, const std::string& architecture, DeviceModelLoader loader,
                           std::function<bool()> available) {
  DeviceBackend& b = device_backends()[device];
  b.available = std::move(available);
  b.loaders[architecture] = std::move(loader);
}

void register_device_tp_model(const std::string& device, const std::string& architecture, DeviceTpModelLoader loader) {
  device_backends()[device].tp_loaders[architecture] = std::move(loader);
}

std::string resolve_device(const std::string& device, const ModelConfig& config) {
  if (device == "cpu") return device;
  const auto& d = device_backends();
  if (device == "auto") {
    for (const auto& [name, b] : d)
      if (b.loaders.count(config.architecture) && b.available && b.available()) return name;
    return "cpu";
  }
  auto it = d.find(device);
  if (it == d.end()) {
    std::string known = "cpu, auto";
    for (const auto& [name, b] : d) known += ", " + name;
    SSM_CHECK(device != "cuda", "--device cuda: this build of ssmserve has no CUDA backend (choose from: {})", known);
    fail("--device {}: unknown device (choose from: {})", device, known);
  }
  SSM_CHECK(it->second.loaders.count(config.architecture), "--device {}: architecture \"{}\" does not run there yet",
            device, config.architecture);
  return device;
}

std::unique_ptr<CausalLM> load_model(const std::filesystem::path& dir, LoadFormat format, const std::string& device,
                                     int tensor_parallel_size, std::optional<DType> dtype, bool enforce_eager) {
  ModelConfig config = ModelConfig::load(dir);
  config.dtype = dtype;
  config.enforce_eager = enforce_eager;
  const std::string dev = resolve_device(device == "auto" && tensor_parallel_size > 1 ? "cpu" : device, config);
  if (dev == "cpu") {
    // The CPU kernels' instruction-set variant, chosen here (before any kernel runs inside an OpenMP region, where
    // a bad SSMSERVE_CPU_ISA could not throw) and named once in the log.
    static std::once_flag isa_noted;
    const std::string isa = cpu::cpu_isa_summary();
    std::call_once(isa_noted, [&] { spdlog::info("CPU kernels: {}", isa); });
    static std::once_flag noted;
    if (dtype == DType::BF16)
      std::call_once(noted, [] {
        spdlog::warn("--dtype bfloat16: the CPU backend computes in fp32 (bf16 checkpoint weights are read as stored, "
                     "fp32 ones stay fp32); results are those of --dtype float32");
      });
    return load_model(config, format, tensor_parallel_size);
  }
  if (tensor_parallel_size != 1) {
    const auto& tpl = device_backends().at(dev).tp_loaders;
    auto it = tpl.find(config.architecture);
    SSM_CHECK(it != tpl.end(), "--device {}: --tensor-parallel-size {} is not supported there for \"{}\" (use 1)", dev,
              tensor_parallel_size, config.architecture);
    return it->second(config, format, tensor_parallel_size);
  }
  return device_backends().at(dev).loaders.at(config.architecture)(config, format);
}

}  // namespace ssmserve
