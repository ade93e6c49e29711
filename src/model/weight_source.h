// Owns where a model's parameters come from: a checkpoint (validated name, shape and dtype) or dummy random
// values generated from the config alone (`--load-format dummy`, for benchmarks at real shapes).
#pragma once
#include <map>
#include <mutex>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "model/checkpoint.h"
#include "model/weight.h"

namespace ssmserve {

/// How a dummy parameter is filled. Ignored for checkpoint loads.
struct DummyInit {
  enum Kind { Uniform, Constant, LogArange } kind = Uniform;
  float value = 0.02f;  ///< Uniform: half-width; Constant: the value; LogArange: unused (row i col j = log(j+1))
  static DummyInit uniform(float half_width) { return {Uniform, half_width}; }
  static DummyInit constant(float v) { return {Constant, v}; }
  static DummyInit log_arange() { return {LogArange, 0.0f}; }
};

/// Dummy tensors as generated (bf16 bits; vectors rounded through bf16 as they are), by name: what
/// save_dummy_checkpoint (model/dummy_checkpoint.h) writes so that transformers can run the same weights.
struct DummyRecord {
  std::mutex mu;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<uint16_t>>> tensors;  ///< name -> (shape, bf16)
};

/// Hands out parameters by name with their expected shape (outermost first).
class WeightSource {
 public:
  /// Reads from an opened checkpoint.
  static WeightSource from_checkpoint(std::shared_ptr<const Checkpoint> ckpt);
  /// Generates deterministic random BF16 matrices (and fp32 vectors) from `seed` and the tensor name.
  static WeightSource dummy(uint64_t seed = 0);
  /// The same, also recording every generated tensor into *record.
  static WeightSource dummy_recorded(std::shared_ptr<DummyRecord> record, uint64_t seed = 0);
  /// The checkpoint in `dir` (kept open in *ckpt, which must outlive the mapped weights), or dummy values when
  /// `dummy`. Throws Error as Checkpoint::open.
  static WeightSource open(const std::filesystem::path& dir, bool dummy, std::shared_ptr<const Checkpoint>* ckpt);
  /// The same for `cfg`'s checkpoint (cfg.dir), reading FP8 matrices when cfg.fp8 is set (set_fp8) and GPTQ / AWQ
  /// ones when cfg.int_quant is (set_int_quantization), dequantized to F32 with --dtype float32, else BF16.
  static WeightSource open(const ModelConfig& cfg, bool dummy, std::shared_ptr<const Checkpoint>* ckpt);
  /// From now on matrix() / vector() read F8_E4M3 tensors with their weight_scale_inv as `quant` describes,
  /// dequantized into `out` (F32 or BF16; model/fp8_weights.h).
  void set_fp8(const Fp8Quantization& quant, DType out);
  /// From now on matrix() / vector() read a Linear X.weight that the checkpoint stores as X.qweight (with X.scales,
  /// X.qzeros, X.g_idx) as `quant` describes, dequantized into `out` (F32 or BF16; model/int_weights.h); has()
  /// reports X.weight for it.
  void set_int_quantization(const IntQuantization& quant, DType out);

  /// Checkpoint tensors holding NaN / Inf values load, with a warning naming the tensor (the sampler later rejects
  /// the NaN logits).
  /// A matrix parameter (kept in its stored dtype; F16 becomes F32; FP8 / GPTQ / AWQ dequantized, see set_fp8 and
  /// set_int_quantization). Throws Error if missing / wrong shape, or a quantized matrix without its quantization
  /// config or its scales.
  Weight matrix(const std::string& name, const std::vector<int64_t>& shape, DummyInit init);
  /// A small parameter converted to fp32, flattened. Throws Error if missing / wrong shape.
  std::vector<float> vector(const std::string& name, const std::vector<int64_t>& shape, DummyInit init);
  /// True when the checkpoint has the tensor (always false for dummy sources).
  bool has(const std::string& name) const;
  bool is_dummy() const { return ckpt_ == nullptr; }
  /// Marks every checkpoint tensor whose name starts with `prefix` as known (parts of a checkpoint the model does not
  /// run, e.g. a vision tower), so unused_tensors() leaves them out.
  void ignore_prefix(const std::string& prefix);
  /// Checkpoint tensors that no matrix() / vector() / has() call named, sorted. After a model has loaded, these
  /// are weights it ignores: a config that does not match its checkpoint (num_hidden_layers below the stored
  /// layers, use_conv_bias false with stored conv biases, ...). Empty for dummy sources.
  std::vector<std::string> unused_tensors() const;
  /// Logs one warning naming how many checkpoint tensors the model left unused and the first few (as transformers
  /// warns "Some weights of the model checkpoint were not used"); nothing when all were used.
  void warn_unused_tensors() const;

 private:
  /// The FP8 matrix `name` dequantized (set_fp8), or nullopt when the checkpoint holds it in a supported dtype.
  /// Throws Error when it is FP8 and set_fp8 was not called, or its scales are missing or mis-shaped.
  std::optional<Weight> fp8_matrix(const std::string& name, const std::vector<int64_t>& shape);
  /// The GPTQ / AWQ matrix `name` ("X.weight" stored as X.qweight, ...) dequantized (set_int_quantization), or nullopt
  /// when the checkpoint has no X.qweight. Throws Error when set_int_quantization was not called or a tensor is
  /// missing or mis-shaped.
  std::optional<Weight> int_matrix(const std::string& name, const std::vector<int64_t>& shape);
  /// "X" for "X.weight" when the checkpoint stores X.qweight, else "".
  std::string int_base(const std::string& name) const;

  std::shared_ptr<const Checkpoint> ckpt_;
  std::optional<Fp8Quantization> fp8_;
  DType fp8_out_ = DType::BF16;
  std::optional<IntQuantization> int_quant_;
  DType int_out_ = DType::BF16;
  /// Names asked for; layers load in parallel (model/parallel_layers.h), hence the lock.
  struct UsedNames {
    std::mutex mu;
    std::set<std::string> names;
    void insert(const std::string& name);
  };
  std::shared_ptr<UsedNames> used_ = std::make_shared<UsedNames>();
  uint64_t seed_ = 0;
  std::shared_ptr<DummyRecord> record_;
};

}  // namespace ssmserve
