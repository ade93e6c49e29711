// Owns GPTQ / AWQ weight dequantization (see int_weights.h).
#include "model/int_weights.h"

#include <fmt/ranges.h>

#include <cstring>
#include <vector>

#include "core/error.h"

namespace ssmserve {
namespace {

/// The tensor's I32 words (copied: the mapped bytes need not be 4-byte aligned).
std::vector<uint32_t> words_of(const TensorRef& t, const std::vector<int64_t>& shape, const char* what) {
  SSM_CHECK(t.dtype_name == "I32", "{}: tensor \"{}\" has dtype {}; {} of a quantized matrix are I32 words", t.file, t.name,
            t.dtype_name, what);
  SSM_CHECK(t.shape == shape, "{}: tensor \"{}\" has shape [{}], but the model needs [{}] ({})", t.file, t.name,
            fmt::join(t.shape, ", "), fmt::join(shape, ", "), what);
  std::vector<uint32_t> w(static_cast<size_t>(t.numel()));
  std::memcpy(w.data(), t.data, w.size() * 4);
  return w;
}

/// The position (in bits / bits units) of column `c % pack` inside its word: AWQ's interleaved order or the plain one.
int slot_of(int64_t c, int pack, bool awq_order) {
  static constexpr int kAwq[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column 8j + i is at nibble kAwq[i] (AutoAWQ's packer)
  const int i = static_cast<int>(c % pack);
  return awq_order ? kAwq[i] : i;
}

}  // namespace

std::array<std::string, 4> int_tensor_names(const std::string& base, IntQuantization::Layout layout) {
  if (layout == IntQuantization::Layout::PackQuantized)
    return {base + ".weight_packed", base + ".weight_scale", base + ".weight_zero_point", base + ".weight_g_idx"};
  return {base + ".qweight", base + ".scales", base + ".qzeros", base + ".g_idx"};
}

Weight dequantize_int(const IntQuantizedTensors& t, const IntQuantization& quant, int64_t n, int64_t k, DType out) {
  using Layout = IntQuantization::Layout;
  SSM_CHECK(t.qweight != nullptr && t.scales != nullptr, "dequantize_int: qweight and scales are required");
  SSM_CHECK(out == DType::F32 || out == DType::BF16, "dequantize_int: the output dtype must be F32 or BF16");
  const TensorRef& qw = *t.qweight;
  const int bits = quant.bits, pack = 32 / bits;
  const uint32_t mask = (1u << bits) - 1;
  const Layout layout = quant.layout;
  const bool codes_along_n = layout == Layout::Awq;        // AWQ packs the output columns; the others the input rows
  const bool scales_n_major = layout == Layout::PackQuantized;  // [N, groups] instead of [groups, N]
  const int64_t group = quant.group_size > 0 ? quant.group_size : k;
  const int64_t groups = (k + group - 1) / group;
  // The packed dimension must hold whole words.
  const int64_t packed = codes_along_n ? n : k;
  SSM_CHECK(packed % pack == 0, "{}: {} matrix \"{}\" has {} {} rows, not a multiple of the {} codes of a word", qw.file,
            quant.method, qw.name, packed, codes_along_n ? "output" : "input", pack);
  const std::vector<int64_t> code_shape = layout == Layout::Gptq ? std::vector<int64_t>{k / pack, n}
                                          : layout == Layout::Awq ? std::vector<int64_t>{k, n / pack}
                                                                  : std::vector<int64_t>{n, k / pack};
  const std::vector<uint32_t> q = words_of(qw, code_shape, "the packed codes");
  SSM_CHECK(t.scales->dtype_name == "F16" || t.scales->dtype_name == "BF16" || t.scales->dtype_name == "F32",
            "{}: tensor \"{}\" has dtype {}; scales are F16, BF16 or F32", t.scales->file, t.scales->name, t.scales->dtype_name);
  // With act order (g_idx) the rows of a group need not be adjacent; there are as many groups.
  const int64_t num_groups = groups;
  const std::vector<int64_t> scale_shape = scales_n_major ? std::vector<int64_t>{n, num_groups} : std::vector<int64_t>{num_groups, n};
  SSM_CHECK(t.scales->shape == scale_shape, "{}: tensor \"{}\" has shape [{}], but {} matrix \"{}\" [{} out, {} in] with "
            "group_size {} needs [{}]", t.scales->file, t.scales->name, fmt::join(t.scales->shape, ", "), quant.method, qw.name,
            n, k, quant.group_size > 0 ? quant.group_size : -1, fmt::join(scale_shape, ", "));
  std::vector<float> stored(static_cast<size_t>(num_groups * n)), scale(stored.size());
  to_f32(t.scales->dtype, t.scales->data, stored.data(), stored.size());
  for (int64_t g = 0; g < num_groups; ++g)  // scale[g * n + r]
    for (int64_t r = 0; r < n; ++r)
      scale[static_cast<size_t>(g * n + r)] = stored[static_cast<size_t>(scales_n_major ? r * num_groups + g : g * n + r)];
  // zero[g * n + r], as integers: stored + 1 for GPTQ v1 (exllama / vLLM: no wrap, a stored 15 is 16); without zero
  // points the middle code 2^(bits - 1) (AWQ without zero_point, symmetric pack-quantized: codes are value + it).
  std::vector<int32_t> zero(static_cast<size_t>(num_groups * n), 1 << (bits - 1));
  if (t.qzeros != nullptr) {
    SSM_CHECK(n % pack == 0, "{}: {} matrix \"{}\" has {} output rows, not a multiple of the {} zero points of a word",
              qw.file, quant.method, qw.name, n, pack);
    const std::vector<uint32_t> z =
        words_of(*t.qzeros, scales_n_major ? std::vector<int64_t>{n / pack, num_groups} : std::vector<int64_t>{num_groups, n / pack},
                 "the packed zero points");
    for (int64_t g = 0; g < num_groups; ++g)
      for (int64_t r = 0; r < n; ++r) {
        const uint32_t word = z[static_cast<size_t>(scales_n_major ? (r / pack) * num_groups + g : g * (n / pack) + r / pack)];
        const int32_t v = static_cast<int32_t>((word >> (bits * slot_of(r, pack, layout == Layout::Awq))) & mask);
        zero[static_cast<size_t>(g * n + r)] = v + (quant.zero_stored_minus_one ? 1 : 0);
      }
  }
  std::vector<int32_t> group_of(static_cast<size_t>(k));
  if (t.g_idx != nullptr) {
    const std::vector<uint32_t> gi = words_of(*t.g_idx, {k}, "each input row's group (g_idx)");
    for (int64_t c = 0; c < k; ++c) {
      const int32_t g = static_cast<int32_t>(gi[static_cast<size_t>(c)]);
      SSM_CHECK(g >= 0 && g < num_groups, "{}: tensor \"{}\" gives input row {} group {}, outside the {} groups of its "
                "scales", t.g_idx->file, t.g_idx->name, c, g, num_groups);
      group_of[static_cast<size_t>(c)] = g;
    }
  } else {
    for (int64_t c = 0; c < k; ++c) group_of[static_cast<size_t>(c)] = static_cast<int32_t>(c / group);
  }
  Weight w = Weight::allocate(out, n, k);
#pragma omp parallel for schedule(static) if (n * k > (int64_t{1} << 16))
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      // The code of (input c, output r).
      uint32_t word;
      int slot;
      if (layout == Layout::Gptq) word = q[static_cast<size_t>((c / pack) * n + r)], slot = static_cast<int>(c % pack);
      else if (layout == Layout::Awq) word = q[static_cast<size_t>(c * (n / pack) + r / pack)], slot = slot_of(r, pack, true);
      else word = q[static_cast<size_t>(r * (k / pack) + c / pack)], slot = static_cast<int>(c % pack);
      const int32_t code = static_cast<int32_t>((word >> (bits * slot)) & mask);
      const size_t gz = static_cast<size_t>(group_of[static_cast<size_t>(c)] * n + r);
      const float v = scale[gz] * static_cast<float>(code - zero[gz]);
      if (out == DType::F32) reinterpret_cast<float*>(w.owned->data())[r * k + c] = v;
      else reinterpret_cast<uint16_t*>(w.owned->data())[r * k + c] = f32_to_bf16(v);
    }
  }
  return w;
}

}  // namespace ssmserve
