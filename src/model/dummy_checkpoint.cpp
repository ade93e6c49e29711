// Owns save_dummy_checkpoint (see dummy_checkpoint.h).
#include "model/dummy_checkpoint.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/decoder/decoder_lm.h"

namespace ssmserve {

void save_dummy_checkpoint(const ModelConfig& cfg, const std::filesystem::path& out_file) {
  auto record = std::make_shared<DummyRecord>();
  WeightSource src = WeightSource::dummy_recorded(record);
  (void)load_decoder_from(cfg, architecture_spec(cfg), src, nullptr);
  // safetensors: u64 header length, JSON header {name: {dtype, shape, data_offsets}}, the tensors back to back.
  nlohmann::json header = {{"__metadata__", {{"format", "pt"}}}};
  size_t offset = 0;
  for (const auto& [name, t] : record->tensors) {
    const size_t bytes = t.second.size() * 2;
    header[name] = {{"dtype", "BF16"}, {"shape", t.first}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(out_file, std::ios::binary);
  SSM_CHECK(out.good(), "{}: cannot open for writing", out_file.string());
  const uint64_t n = h.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const auto& [name, t] : record->tensors)
    out.write(reinterpret_cast<const char*>(t.second.data()), static_cast<std::streamsize>(t.second.size() * 2));
  SSM_CHECK(out.good(), "{}: write failed", out_file.string());
}

}  // namespace ssmserve
