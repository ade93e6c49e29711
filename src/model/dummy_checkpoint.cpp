// Owns save_dummy_checkpoint (see dummy_checkpoint.h).
#include "model/dummy_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/decoder/decoder_lm.h"
#include "model/fp8_weights.h"

namespace ssmserve {

namespace {

/// Whether a quantizer converts this tensor to FP8: matrices of the projections (at least 2 dims), not the embeddings,
/// LM head, norms, conv kernels, routers, shared-expert gates or DeltaNet's small a / b projections (the
/// modules_to_not_convert of Qwen's FP8 releases).
bool fp8_quantized(const std::string& name, const std::vector<int64_t>& shape) {
  static const char* const kept[] = {"embed", "lm_head", "norm", "conv1d", ".gate.weight", "shared_expert_gate",
                                     "in_proj_a.", "in_proj_b.", "in_proj_ba."};
  if (shape.size() < 2) return false;
  for (const char* k : kept)
    if (name.find(k) != std::string::npos) return false;
  return true;
}

/// A tensor for the file: dtype name, shape and bytes.
struct FileTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

/// `bf16` [..., N, K] quantized as transformers' FineGrainedFP8 / DeepSeek's weight_quant do: per block of
/// quant.block_n x block_k (one block when 0), scale = amax / 448 (1 for an all-zero block), q = e4m3(w / scale),
/// the scale (F32, named fp8_scale_name). Returns {q, scale}.
std::pair<FileTensor, FileTensor> quantize_fp8(const std::vector<int64_t>& shape, const std::vector<uint16_t>& bf16,
                                               const Fp8Quantization& quant) {
  const int64_t K = shape.back(), N = shape[shape.size() - 2];
  const int64_t mats = static_cast<int64_t>(bf16.size()) / (N * K);
  const int64_t bn = quant.block_n ? quant.block_n : N, bk = quant.block_k ? quant.block_k : K;
  const int64_t gn = (N + bn - 1) / bn, gk = (K + bk - 1) / bk;
  FileTensor q{"F8_E4M3", shape, std::vector<uint8_t>(bf16.size())};
  std::vector<float> scale(static_cast<size_t>(mats * gn * gk));
  for (int64_t m = 0; m < mats; ++m)
    for (int64_t bi = 0; bi < gn; ++bi)
      for (int64_t bj = 0; bj < gk; ++bj) {
        const int64_t r1 = std::min(N, (bi + 1) * bn), c1 = std::min(K, (bj + 1) * bk);
        float amax = 0.0f;
        for (int64_t r = bi * bn; r < r1; ++r)
          for (int64_t c = bj * bk; c < c1; ++c) amax = std::max(amax, std::fabs(bf16_to_f32(bf16[(m * N + r) * K + c])));
        const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
        scale[(m * gn + bi) * gk + bj] = s;
        for (int64_t r = bi * bn; r < r1; ++r)
          for (int64_t c = bj * bk; c < c1; ++c) {
            const int64_t i = (m * N + r) * K + c;
            q.bytes[i] = f32_to_fp8_e4m3(bf16_to_f32(bf16[i]) / s);
          }
      }
  // The scale grid as each format stores it: [..., gn, gk] for blocks and channels ([N, 1]), one value as [1].
  std::vector<int64_t> grid = fp8_scale_shape(shape, quant);
  if (quant.block_n == 0 && quant.block_k == 0 && shape.size() == 2) grid = {1};
  FileTensor st{"F32", grid, std::vector<uint8_t>(scale.size() * 4)};
  std::memcpy(st.bytes.data(), scale.data(), st.bytes.size());
  return {std::move(q), std::move(st)};
}

}  // namespace

void save_dummy_checkpoint(const ModelConfig& cfg, const std::filesystem::path& out_file) {
  auto record = std::make_shared<DummyRecord>();
  WeightSource src = WeightSource::dummy_recorded(record);
  ModelConfig plain = cfg;
  plain.fp8.reset();  // the dummy weights themselves are bf16
  (void)load_decoder_from(plain, architecture_spec(plain), src, nullptr);
  std::map<std::string, FileTensor> tensors;
  for (const auto& [name, t] : record->tensors) {
    if (cfg.fp8 && fp8_quantized(name, t.first)) {
      auto [q, scale] = quantize_fp8(t.first, t.second, *cfg.fp8);
      tensors[name] = std::move(q);
      tensors[fp8_scale_name(name, *cfg.fp8)] = std::move(scale);
      continue;
    }
    FileTensor& f = tensors[name];
    f.dtype = "BF16", f.shape = t.first;
    f.bytes.resize(t.second.size() * 2);
    std::memcpy(f.bytes.data(), t.second.data(), f.bytes.size());
  }
  // safetensors: u64 header length, JSON header {name: {dtype, shape, data_offsets}}, the tensors back to back.
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(out_file, std::ios::binary);
  SSM_CHECK(out.good(), "{}: cannot open for writing", out_file.string());
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
  SSM_CHECK(out.good(), "{}: write failed", out_file.string());
}

}  // namespace ssmserve
