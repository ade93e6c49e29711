// Owns parsing and validating one safetensors file's header (length prefix + JSON tensor table) before any
// tensor byte is read.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ssmserve {

/// One tensor entry of a safetensors header, validated against the file.
struct SafetensorsEntry {
  std::string name;             ///< key in the header
  std::string dtype_name;       ///< dtype string as written in the file ("BF16", "I64", ...)
  std::optional<DType> dtype;   ///< set for F32/BF16/F16; empty for dtypes ssmserve cannot compute with
  std::vector<int64_t> shape;   ///< outermost first; every dim >= 0 and the product fits in int64
  int64_t numel = 0;            ///< product of shape (1 for a scalar)
  uint64_t begin = 0;           ///< data_offsets[0], relative to the start of the data section
  uint64_t end = 0;             ///< data_offsets[1]; begin <= end <= data_size
};

/// A parsed safetensors header: where the data section is and what it holds.
struct SafetensorsHeader {
  size_t data_start = 0;                   ///< 8 + header length: file offset of the data section
  size_t data_size = 0;                    ///< bytes after the header
  std::vector<SafetensorsEntry> tensors;   ///< in header (key) order
  nlohmann::json metadata = nlohmann::json::object();  ///< "__metadata__" (empty object if absent)
};

/// Largest header accepted (the reference implementation's limit).
inline constexpr uint64_t kMaxSafetensorsHeader = 100'000'000;

/// Parses the header of the safetensors image `bytes[0, size)`. `file` names the file in messages.
/// Checks: at least 8 bytes; 0 < header length <= min(size - 8, kMaxSafetensorsHeader); header is a JSON object
/// without duplicate keys; every tensor has a string dtype, a shape of non-negative integers whose product
/// (times the element size) does not overflow, and data_offsets [begin, end] with begin <= end <= data size;
/// end - begin equals numel x element size for every dtype of known size; no two tensors' byte ranges overlap.
/// Throws Error naming the file (and tensor) on the first defect found.
SafetensorsHeader parse_safetensors_header(const std::byte* bytes, size_t size, const std::string& file);

/// Element size in bytes of a safetensors dtype name, or 0 if unknown or smaller than a byte (F4, F6_*).
size_t safetensors_dtype_size(const std::string& dtype_name);

}  // namespace ssmserve
