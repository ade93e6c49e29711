// Owns test helpers for building checkpoint folders on disk: temp dirs, raw file I/O, and writing or editing
// safetensors files (valid or deliberately corrupt). Header-only; include from any tests/unit/test_*.cpp.
#pragma once
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ssmserve::testing {

/// A fresh, uniquely named directory under the system temp dir, removed (recursively) on destruction.
class TempDir {
 public:
  /// Creates <tmp>/ssmserve-<tag>-<pid>-<random>.
  explicit TempDir(const std::string& tag = "test") {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("ssmserve-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  /// path() / name.
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// Writes `bytes` to `path` (binary, truncating). Throws std::runtime_error on failure.
inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

/// Reads the whole file at `path` (binary). Throws std::runtime_error on failure.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// One tensor to write: safetensors dtype name (any string, so unsupported/unknown dtypes can be written),
/// shape outermost first, and the raw little-endian bytes (not checked against shape x dtype).
struct FixtureTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// An F32 tensor holding `values` (row-major).
inline FixtureTensor f32_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  std::string b(values.size() * 4, '\0');
  if (!b.empty()) std::memcpy(b.data(), values.data(), b.size());
  return {name, "F32", std::move(shape), std::move(b)};
}

/// A BF16 tensor holding `values` rounded to bfloat16.
inline FixtureTensor bf16_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
  std::string b;
  for (const float v : values) {
    const uint16_t h = f32_to_bf16(v);
    b.push_back(static_cast<char>(h & 0xff));
    b.push_back(static_cast<char>(h >> 8));
  }
  return {name, "BF16", std::move(shape), std::move(b)};
}

/// An F16 tensor from raw IEEE half bit patterns.
inline FixtureTensor f16_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<uint16_t>& bits) {
  std::string b(bits.size() * 2, '\0');
  if (!b.empty()) std::memcpy(b.data(), bits.data(), b.size());
  return {name, "F16", std::move(shape), std::move(b)};
}

/// A tensor of `dtype` with the given shape whose bytes are all zero (element size given by the caller).
inline FixtureTensor zeros_tensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                                  size_t elem_size) {
  size_t n = 1;
  for (const int64_t d : shape) n *= static_cast<size_t>(d);
  return {name, dtype, std::move(shape), std::string(n * elem_size, '\0')};
}

/// An in-memory safetensors file: the JSON header (tensor table + optional "__metadata__") and the data section.
/// Edit `header` freely (shapes, dtypes, offsets) to build corrupt files; `serialize()` writes it back as is.
struct SafetensorsImage {
  nlohmann::json header = nlohmann::json::object();
  std::string data;

  /// Lays out `tensors` back to back in order, recording dtype/shape/data_offsets in the header.
  static SafetensorsImage build(const std::vector<FixtureTensor>& tensors,
                                const nlohmann::json& metadata = {{"format", "pt"}}) {
    SafetensorsImage img;
    if (!metadata.is_null()) img.header["__metadata__"] = metadata;
    for (const auto& t : tensors) {
      const size_t begin = img.data.size();
      img.data += t.bytes;
      img.header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, img.data.size()}}};
    }
    return img;
  }

  /// Parses an existing safetensors file (no validation beyond what is needed to split it).
  static SafetensorsImage load(const std::filesystem::path& path) {
    const std::string raw = read_file(path);
    if (raw.size() < 8) throw std::runtime_error("not a safetensors file: " + path.string());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(raw[i]);
    SafetensorsImage img;
    img.header = nlohmann::json::parse(raw.substr(8, n));
    img.data = raw.substr(8 + n);
    return img;
  }

  /// The header JSON padded with spaces to a multiple of 8 bytes (as the reference writer does).
  std::string header_text() const {
    std::string h = header.dump();
    while (h.size() % 8 != 0) h += ' ';
    return h;
  }

  /// The whole file: 8-byte little-endian length (or `length_override` if given), header, data.
  std::string serialize(std::optional<uint64_t> length_override = std::nullopt) const {
    const std::string h = header_text();
    return with_header_text(h, length_override.value_or(h.size()));
  }

  /// The file with an arbitrary header text (e.g. invalid JSON) and length prefix, followed by `data`.
  std::string with_header_text(const std::string& h, uint64_t length) const {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    return out + h + data;
  }

  /// Writes serialize() to `path`.
  void save(const std::filesystem::path& path) const { write_file(path, serialize()); }
};

/// Writes a safetensors file holding `tensors` (laid out back to back) to `path`.
inline void write_safetensors(const std::filesystem::path& path, const std::vector<FixtureTensor>& tensors,
                              const nlohmann::json& metadata = {{"format", "pt"}}) {
  SafetensorsImage::build(tensors, metadata).save(path);
}

}  // namespace ssmserve::testing
