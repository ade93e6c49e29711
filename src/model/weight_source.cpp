// Owns checkpoint-backed and dummy parameter sources (see weight_source.h).
#include "model/weight_source.h"

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"
#include "model/fp8_weights.h"
#include "model/int_weights.h"

namespace ssmserve {
namespace {

uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Value i of a dummy tensor with key `seed`: splitmix64 of (seed, i) mapped to [0, 1). Counter-based, so any
// element can be computed alone: the fill below runs in parallel and its values do not depend on the thread count.
inline float unit_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // top 24 bits: exact in float
}

// Fills n values: value(i) for the init kind, row length `cols` (for LogArange). Parallel over i (a 2.8B
// parameter model fills in seconds on a many-core host instead of ~40 s).
template <typename Store>
void fill(const DummyInit& init, uint64_t seed, int64_t n, int64_t cols, Store store) {
#pragma omp parallel for schedule(static) if (n > (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) {
    float v = 0.0f;
    switch (init.kind) {
      case DummyInit::Uniform: v = init.value * (2.0f * unit_uniform(seed, static_cast<uint64_t>(i)) - 1.0f); break;
      case DummyInit::Constant: v = init.value; break;
      case DummyInit::LogArange: v = std::log(static_cast<float>(i % cols + 1)); break;
    }
    store(i, v);
  }
}

// Count of the elements of p[0..n) whose exponent bits are all ones (NaN or Inf), and the index of the first.
template <typename Bits>
int64_t count_non_finite(const std::byte* p, int64_t n, Bits exponent, int64_t& first) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    Bits v;
    std::memcpy(&v, p + i * sizeof(Bits), sizeof(Bits));
    count += (v & exponent) == exponent;
  }
  for (int64_t i = 0; count > 0 && i < n; ++i) {
    Bits v;
    std::memcpy(&v, p + i * sizeof(Bits), sizeof(Bits));
    if ((v & exponent) == exponent) {
      first = i;
      break;
    }
  }
  return count;
}

// A checkpoint tensor holding NaN / Inf values loads (as in transformers), but every output that reads it turns
// NaN and the sampler rejects those logits without knowing why: the warning names the tensor.
void warn_if_not_finite(const TensorRef& t) {
  int64_t first = 0, count = 0;
  switch (t.dtype) {
    case DType::F32: count = count_non_finite<uint32_t>(t.data, t.numel(), 0x7f800000u, first); break;
    case DType::BF16: count = count_non_finite<uint16_t>(t.data, t.numel(), 0x7f80u, first); break;
    case DType::F16: count = count_non_finite<uint16_t>(t.data, t.numel(), 0x7c00u, first); break;
    default: return;
  }
  if (count == 0) return;
  // Once per tensor and process: tensor-parallel ranks read the same tensor (their slices of it) each.
  static std::mutex mu;
  static std::set<std::pair<std::string, std::string>> warned;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!warned.emplace(t.file, t.name).second) return;
  }
  spdlog::warn("{}: tensor \"{}\" holds {} NaN / Inf value(s) (first at flat index {}): outputs that read it will likely be NaN",
                 t.file, t.name, count, first);
}

}  // namespace

void WeightSource::UsedNames::insert(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu);
  names.insert(name);
}

WeightSource WeightSource::from_checkpoint(std::shared_ptr<const Checkpoint> ckpt) {
  WeightSource s;
  s.ckpt_ = std::move(ckpt);
  return s;
}

WeightSource WeightSource::open(const std::filesystem::path& dir, bool dummy, std::shared_ptr<const Checkpoint>* ckpt) {
  if (dummy) return WeightSource::dummy();
  *ckpt = std::make_shared<const Checkpoint>(Checkpoint::open(dir));
  return from_checkpoint(*ckpt);
}

WeightSource WeightSource::open(const ModelConfig& cfg, bool dummy, std::shared_ptr<const Checkpoint>* ckpt) {
  WeightSource s = open(cfg.dir, dummy, ckpt);
  if (cfg.fp8) s.set_fp8(*cfg.fp8, cfg.dtype == DType::F32 ? DType::F32 : DType::BF16);
  if (cfg.int_quant) s.set_int_quantization(*cfg.int_quant, cfg.dtype == DType::F32 ? DType::F32 : DType::BF16);
  return s;
}

void WeightSource::set_int_quantization(const IntQuantization& quant, DType out) {
  SSM_CHECK(out == DType::F32 || out == DType::BF16, "GPTQ / AWQ weights dequantize to F32 or BF16, not {}", dtype_name(out));
  int_quant_ = quant;
  int_out_ = out;
}

std::string WeightSource::int_base(const std::string& name) const {
  static const std::string suffix = ".weight";
  if (!ckpt_ || name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return "";
  std::string base = name.substr(0, name.size() - suffix.size());
  return ckpt_->has(base + ".qweight") || ckpt_->has(base + ".weight_packed") ? base : "";
}

std::optional<Weight> WeightSource::int_matrix(const std::string& name, const std::vector<int64_t>& shape) {
  const std::string base = int_base(name);
  if (base.empty()) return std::nullopt;
  SSM_CHECK(int_quant_.has_value(), "checkpoint {}: tensor \"{}\" is a GPTQ / AWQ / pack-quantized matrix, but config.json "
            "has no quantization_config describing it{} (quant_method \"gptq\", \"awq\" or \"compressed-tensors\" "
            "pack-quantized)", ckpt_->dir().string(), ckpt_->has(base + ".qweight") ? base + ".qweight" : base + ".weight_packed",
            fp8_ ? fmt::format(" (its quant_method is \"{}\", FP8)", fp8_->method) : std::string());
  const auto names = int_tensor_names(base, int_quant_->layout);
  const std::string& qweight = names[0];
  SSM_CHECK(shape.size() == 2, "checkpoint {}: \"{}\" is stored quantized (\"{}\"), but the model reads it as a [{}] tensor; "
            "only 2-D matrices load from GPTQ / AWQ codes", ckpt_->dir().string(), name, qweight, fmt::join(shape, ", "));
  const auto raw = [&](const std::string& n, bool required) -> const TensorRef* {
    used_->insert(n);
    if (const TensorRef* t = ckpt_->find_raw(n)) return t;
    if (const TensorRef* t = ckpt_->find(n)) return t;  // a supported dtype: dequantize_int names it as wrong
    SSM_CHECK(!required, "checkpoint {}: GPTQ / AWQ matrix \"{}\" has no tensor \"{}\"", ckpt_->dir().string(), qweight, n);
    return nullptr;
  };
  const IntQuantization quant = int_quant_->for_module(base);  // GPTQModel's per-module overrides
  IntQuantizedTensors t;
  t.qweight = raw(qweight, true);
  t.scales = raw(names[1], true);
  t.qzeros = raw(names[2], quant.has_zeros);
  SSM_CHECK(quant.has_zeros || t.qzeros == nullptr, "checkpoint {}: tensor \"{}\" holds zero points, but config.json's "
            "quantization_config says there are none (AWQ zero_point false, or symmetric compressed-tensors weights)",
            ckpt_->dir().string(), names[2]);
  t.g_idx = quant.layout == IntQuantization::Layout::Awq ? nullptr : raw(names[3], false);
  SSM_CHECK(!quant.desc_act || t.g_idx != nullptr, "checkpoint {}: matrix \"{}\" has no \"{}\", which act order "
            "(quantization_config desc_act / actorder) needs", ckpt_->dir().string(), qweight, names[3]);
  if (quant.layout == IntQuantization::Layout::PackQuantized) {  // weight_shape: the [N, K] it was packed from
    if (const TensorRef* s = raw(base + ".weight_shape", false)) {
      SSM_CHECK(s->shape == std::vector<int64_t>{2} && (s->dtype_name == "I64" || s->dtype_name == "I32"),
                "{}: tensor \"{}\" has dtype {} and shape [{}]; a weight_shape is I64 (or I32) [2]", s->file, s->name,
                s->dtype_name.empty() ? std::string(dtype_name(s->dtype)) : s->dtype_name, fmt::join(s->shape, ", "));
      std::vector<int64_t> dims(2);
      for (size_t i = 0; i < 2; ++i) {
        if (s->dtype_name == "I64") {
          std::memcpy(&dims[i], s->data + 8 * i, 8);
        } else {
          int32_t v = 0;
          std::memcpy(&v, s->data + 4 * i, 4);
          dims[i] = v;
        }
      }
      SSM_CHECK(dims == shape, "{}: tensor \"{}\" says the matrix is [{}], but the model needs [{}]", s->file, s->name,
                fmt::join(dims, ", "), fmt::join(shape, ", "));
    }
  }
  warn_if_not_finite(*t.scales);
  return dequantize_int(t, quant, shape[0], shape[1], int_out_);
}

void WeightSource::set_fp8(const Fp8Quantization& quant, DType out) {
  SSM_CHECK(out == DType::F32 || out == DType::BF16, "FP8 weights dequantize to F32 or BF16, not {}", dtype_name(out));
  fp8_ = quant;
  fp8_out_ = out;
}

std::optional<Weight> WeightSource::fp8_matrix(const std::string& name, const std::vector<int64_t>& shape) {
  const TensorRef* raw = ckpt_->find_raw(name);
  if (raw == nullptr || raw->dtype_name != "F8_E4M3") return std::nullopt;  // absent or another dtype: get() names it
  SSM_CHECK(fp8_.has_value(), "{}: tensor \"{}\" is FP8 (F8_E4M3), but config.json has no quantization_config "
            "describing its scales (quant_method \"fp8\", \"compressed-tensors\" or \"modelopt\")", raw->file, name);
  SSM_CHECK(raw->shape == shape, "{}: tensor \"{}\" has shape [{}] but the model config expects [{}]", raw->file, name,
            fmt::join(raw->shape, ", "), fmt::join(shape, ", "));
  const std::string scale = fp8_scale_name(name, *fp8_);
  std::string found = scale;
  if (!ckpt_->has(scale) && !fp8_->alt_scale_suffix.empty() && ckpt_->has(name + fp8_->alt_scale_suffix))
    found = name + fp8_->alt_scale_suffix;
  used_->insert(found);
  if (const TensorRef* bad = ckpt_->find_raw(found))
    fail("{}: scale tensor \"{}\" has dtype {}; scales are F32, BF16 or F16", bad->file, found, bad->dtype_name);
  const TensorRef* s = ckpt_->find(found);
  SSM_CHECK(s != nullptr, "FP8 tensor \"{}\" has no scale tensor \"{}\"{} (F32 / BF16 / F16) in checkpoint {}", name, scale,
            fp8_->alt_scale_suffix.empty() ? std::string() : fmt::format(" or \"{}\"", name + fp8_->alt_scale_suffix),
            ckpt_->dir().string());
  warn_if_not_finite(*s);  // a non-finite scale, named as itself before the matrix it spoils
  Weight w = dequantize_fp8(*raw, *s, *fp8_, fp8_out_);
  // NaN / Inf from a NaN code (0x7f), a non-finite scale or an overflowing product: named as a stored tensor is.
  TensorRef view = *raw;
  view.dtype = w.dtype, view.dtype_name = std::string(dtype_name(w.dtype));
  view.data = static_cast<const std::byte*>(w.data), view.nbytes = static_cast<size_t>(w.rows * w.cols) * dtype_size(w.dtype);
  warn_if_not_finite(view);
  return w;
}

WeightSource WeightSource::dummy(uint64_t seed) {
  WeightSource s;
  s.seed_ = seed;
  return s;
}

WeightSource WeightSource::dummy_recorded(std::shared_ptr<DummyRecord> record, uint64_t seed) {
  WeightSource s = dummy(seed);
  s.record_ = std::move(record);
  return s;
}

bool WeightSource::has(const std::string& name) const {
  used_->insert(name);
  return ckpt_ && (ckpt_->has(name) || !int_base(name).empty());
}

void WeightSource::ignore_prefix(const std::string& prefix) {
  if (!ckpt_) return;
  for (const auto& n : ckpt_->names())
    if (n.compare(0, prefix.size(), prefix) == 0) used_->insert(n);
}

std::vector<std::string> WeightSource::unused_tensors() const {
  std::vector<std::string> out;
  if (!ckpt_) return out;
  std::lock_guard<std::mutex> lock(used_->mu);
  // An FP8 checkpoint's activation and KV-cache scales (input_scale, k_scale, ...): activations and the KV cache are
  // not quantized (config/quantization_config.h), so they are known and left unread.
  static const std::string fp8_extras[] = {".input_scale", ".output_scale", ".k_scale", ".v_scale"};
  const auto fp8_extra = [&](const std::string& n) {
    return fp8_ && std::any_of(std::begin(fp8_extras), std::end(fp8_extras), [&](const std::string& e) {
             return n.size() > e.size() && n.compare(n.size() - e.size(), e.size(), e) == 0;
           });
  };
  for (const auto& n : ckpt_->names())
    if (!used_->names.count(n) && !fp8_extra(n)) out.push_back(n);
  std::sort(out.begin(), out.end());
  return out;
}

void WeightSource::warn_unused_tensors() const {
  const auto unused = unused_tensors();
  if (unused.empty()) return;
  std::string first;
  for (size_t i = 0; i < unused.size() && i < 3; ++i) first += (i ? ", \"" : "\"") + unused[i] + "\"";
  spdlog::warn("{}: {} checkpoint tensor(s) are not used by the model as config.json describes it ({}{}): check "
               "num_hidden_layers and the architecture's options against the checkpoint",
               ckpt_->dir().string(), unused.size(), first, unused.size() > 3 ? ", ..." : "");
}

Weight WeightSource::matrix(const std::string& name, const std::vector<int64_t>& shape, DummyInit init) {
  used_->insert(name);
  if (ckpt_) {
    if (std::optional<Weight> w = int_matrix(name, shape)) return std::move(*w);
    if (std::optional<Weight> w = fp8_matrix(name, shape)) return std::move(*w);
    const TensorRef& t = ckpt_->get(name, shape);
    warn_if_not_finite(t);
    return weight_from_tensor(t);
  }
  int64_t cols = 1;
  for (size_t i = 1; i < shape.size(); ++i) cols *= shape[i];
  Weight w = Weight::allocate(DType::BF16, shape.at(0), cols);
  auto* dst = reinterpret_cast<uint16_t*>(w.owned->data());
  fill(init, name_seed(seed_, name), numel(shape), cols, [&](int64_t i, float v) { dst[i] = f32_to_bf16(v); });
  if (record_) {
    std::lock_guard<std::mutex> lock(record_->mu);
    record_->tensors[name] = {shape, std::vector<uint16_t>(dst, dst + numel(shape))};
  }
  return w;
}

std::vector<float> WeightSource::vector(const std::string& name, const std::vector<int64_t>& shape, DummyInit init) {
  used_->insert(name);
  if (ckpt_) {
    if (shape.size() >= 2)  // a small matrix the quantizer converted (a conv weight is [C, 1, W]: FP8 only if it did)
      if (std::optional<Weight> w = shape.size() == 2 && !int_base(name).empty() ? int_matrix(name, shape) : fp8_matrix(name, shape)) {
        std::vector<float> out(static_cast<size_t>(w->rows * w->cols));
        for (int64_t r = 0; r < w->rows; ++r) w->row_to_f32(r, out.data() + r * w->cols);
        return out;
      }
    const TensorRef& t = ckpt_->get(name, shape);
    warn_if_not_finite(t);
    return tensor_to_f32(t);
  }
  std::vector<float> out(static_cast<size_t>(numel(shape)));
  const int64_t cols = shape.size() > 1 ? numel(shape) / shape[0] : numel(shape);
  // Round through bf16 so dummy vectors look like a bf16 checkpoint's.
  fill(init, name_seed(seed_, name), numel(shape), cols, [&](int64_t i, float v) { out[i] = bf16_to_f32(f32_to_bf16(v)); });
  if (record_) {
    std::vector<uint16_t> bits(out.size());
    for (size_t i = 0; i < out.size(); ++i) bits[i] = f32_to_bf16(out[i]);
    std::lock_guard<std::mutex> lock(record_->mu);
    record_->tensors[name] = {shape, std::move(bits)};
  }
  return out;
}

}  // namespace ssmserve
