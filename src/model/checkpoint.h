// Owns reading a Hugging Face checkpoint folder: memory-mapped *.safetensors files (single or sharded through
// model.safetensors.index.json) with every header validated before any tensor byte is touched.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ssmserve {

/// A read-only view of one tensor inside a memory-mapped safetensors file. `data` stays valid while the
/// owning Checkpoint lives. Shape is outermost dimension first, as in the file.
struct TensorRef {
  std::string name;             ///< tensor name, e.g. "backbone.layers.0.mixer.in_proj.weight"
  std::string file;             ///< file name it came from (for error messages)
  DType dtype = DType::F32;
  std::string dtype_name;       ///< the safetensors dtype ("F32", "BF16", "F8_E4M3", ...)
  std::vector<int64_t> shape;   ///< outermost first
  const std::byte* data = nullptr;
  size_t nbytes = 0;            ///< = numel * dtype_size(dtype), checked against the header offsets
  int64_t numel() const;
};

class MappedFile;

/// An opened checkpoint folder. Construction maps every safetensors file and validates each header:
/// JSON well-formed, header length within the file, dtype one of F32/BF16/F16, offsets in range, ordered,
/// non-overlapping and matching shape x dtype size. Unknown dtypes are rejected only when the tensor is read.
class Checkpoint {
 public:
  /// Opens `dir` (model.safetensors, or the shards listed by model.safetensors.index.json, or every
  /// *.safetensors in the folder). Throws Error naming the file (and tensor) on any defect.
  static Checkpoint open(const std::filesystem::path& dir);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  ~Checkpoint();

  bool has(const std::string& name) const;

  /// Returns the tensor, checking its shape equals `expected_shape` (outermost first) and its dtype is one of
  /// F32/BF16/F16. Throws Error naming the tensor and file on a missing tensor, wrong shape or dtype.
  const TensorRef& get(const std::string& name, const std::vector<int64_t>& expected_shape) const;

  /// The tensor of a supported dtype without a shape check (tools, conversions), or nullptr if absent.
  const TensorRef* find(const std::string& name) const;

  /// A tensor of a dtype ssmserve does not compute with, as its raw bytes (`dtype_name` the safetensors name, e.g.
  /// "F8_E4M3", whose weights model/fp8_weights.h dequantizes; `dtype` unset), or nullptr when absent or of a
  /// supported dtype (then get() / find() serve it).
  const TensorRef* find_raw(const std::string& name) const;

  /// All tensor names, sorted (including tensors of unsupported dtypes, which has() reports and get() rejects).
  std::vector<std::string> names() const;

  /// The folder it was opened from.
  const std::filesystem::path& dir() const { return dir_; }

 private:
  /// A tensor whose dtype ssmserve cannot compute with (I64, F64, F8_*, ...); an error only when get() asks for it.
  struct Unsupported {
    std::string file;
    std::string dtype;
    TensorRef raw;  ///< the bytes as stored (find_raw)
  };

  Checkpoint();
  /// Maps and validates one safetensors file and registers its tensors. Throws Error on any defect.
  void add_file(const std::filesystem::path& path);

  std::filesystem::path dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorRef> tensors_;
  std::map<std::string, Unsupported> unsupported_;
  std::vector<std::vector<std::byte>> realigned_;  ///< copies of tensors whose mapped data is misaligned
};

}  // namespace ssmserve
