// Owns the validation of safetensors headers: length prefix, JSON table, dtypes, shapes and byte ranges.
#include "model/safetensors_header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

#include "config/hf_json.h"
#include "core/error.h"

namespace ssmserve {
namespace {

using nlohmann::json;

/// A JSON value shortened for an error message (never serializes more than it shows).
std::string show(const json& v) { return json_excerpt(v); }

/// Reads a non-negative integer that fits in int64 from `v`, or throws naming file, tensor and field.
uint64_t read_index(const json& v, const std::string& file, const std::string& name, const char* field) {
  if (!v.is_number_unsigned() || v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    fail("{}: tensor \"{}\": {} must hold non-negative integers below 2^63 (got {})", file, name, field, show(v));
  return v.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const json& e, size_t data_size, const std::string& file) {
  SSM_CHECK(e.is_object(), "{}: tensor \"{}\": header entry must be an object (got {})", file, name, show(e));
  SafetensorsEntry t;
  t.name = name;
  const auto dt = e.find("dtype");
  SSM_CHECK(dt != e.end() && dt->is_string(), "{}: tensor \"{}\": missing or non-string \"dtype\"", file, name);
  t.dtype_name = dt->get<std::string>();
  if (t.dtype_name == "F32") t.dtype = DType::F32;
  else if (t.dtype_name == "BF16") t.dtype = DType::BF16;
  else if (t.dtype_name == "F16") t.dtype = DType::F16;

  const auto sh = e.find("shape");
  SSM_CHECK(sh != e.end() && sh->is_array(), "{}: tensor \"{}\": missing or non-array \"shape\"", file, name);
  int64_t numel = 1;
  for (const json& d : *sh) {
    const auto dim = static_cast<int64_t>(read_index(d, file, name, "shape"));
    t.shape.push_back(dim);
    if (__builtin_mul_overflow(numel, dim, &numel))
      fail("{}: tensor \"{}\": shape {} has more elements than fit in 64 bits", file, name, show(*sh));
  }
  t.numel = numel;

  const auto off = e.find("data_offsets");
  SSM_CHECK(off != e.end() && off->is_array() && off->size() == 2,
            "{}: tensor \"{}\": \"data_offsets\" must be an array [begin, end]", file, name);
  t.begin = read_index((*off)[0], file, name, "data_offsets");
  t.end = read_index((*off)[1], file, name, "data_offsets");
  SSM_CHECK(t.begin <= t.end, "{}: tensor \"{}\": data_offsets [{}, {}] end before begin", file, name, t.begin,
            t.end);
  SSM_CHECK(t.end <= data_size,
            "{}: tensor \"{}\": data_offsets [{}, {}] extend past the {} data bytes in the file (truncated file?)",
            file, name, t.begin, t.end, data_size);

  if (const size_t es = safetensors_dtype_size(t.dtype_name); es != 0) {
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(es), &nbytes))
      fail("{}: tensor \"{}\": shape {} x {} overflows the byte size", file, name, show(*sh), t.dtype_name);
    SSM_CHECK(nbytes == t.end - t.begin,
              "{}: tensor \"{}\": data_offsets [{}, {}] span {} bytes but shape {} of {} needs {} bytes", file,
              name, t.begin, t.end, t.end - t.begin, show(*sh), t.dtype_name, nbytes);
  }
  return t;
}

}  // namespace

size_t safetensors_dtype_size(const std::string& n) {
  static const std::pair<std::string_view, size_t> kSizes[] = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"F32", 4}, {"I32", 4}, {"U32", 4}, {"BF16", 2}, {"F16", 2},
      {"I16", 2}, {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"F8_E8M0", 1}, {"C64", 8}};
  for (const auto& [name, size] : kSizes)
    if (n == name) return size;
  return 0;
}

SafetensorsHeader parse_safetensors_header(const std::byte* bytes, size_t size, const std::string& file) {
  SSM_CHECK(size >= 8, "{}: file is {} bytes, too short for the 8-byte safetensors header length", file, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);  // little-endian
  SSM_CHECK(n > 0, "{}: safetensors header length is 0", file);
  SSM_CHECK(n <= size - 8, "{}: safetensors header length {} exceeds the {} bytes after the length prefix "
            "(truncated or not a safetensors file)", file, n, size - 8);
  SSM_CHECK(n <= kMaxSafetensorsHeader, "{}: safetensors header length {} exceeds the {} byte limit", file, n,
            kMaxSafetensorsHeader);

  SafetensorsHeader h;
  h.data_start = 8 + static_cast<size_t>(n);
  h.data_size = size - h.data_start;

  const auto* text = reinterpret_cast<const char*>(bytes + 8);
  check_json_depth(std::string_view(text, static_cast<size_t>(n)), file + ": safetensors header");
  std::set<std::string> seen;
  std::string duplicate;
  const json::parser_callback_t track_keys = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json root;
  try {
    root = json::parse(text, text + n, track_keys);
  } catch (const json::parse_error& e) {
    fail("{}: safetensors header is not valid JSON (byte {} of the header): {}", file, e.byte, e.what());
  }
  SSM_CHECK(root.is_object(), "{}: safetensors header must be a JSON object (got {})", file, show(root));
  SSM_CHECK(duplicate.empty(), "{}: tensor \"{}\" appears twice in the safetensors header", file, duplicate);

  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      SSM_CHECK(entry.is_object() || entry.is_null(), "{}: \"__metadata__\" must be an object", file);
      if (entry.is_object()) h.metadata = entry;
      continue;
    }
    h.tensors.push_back(parse_entry(name, entry, h.data_size, file));
  }

  // No two non-empty byte ranges may overlap.
  std::vector<const SafetensorsEntry*> order;
  for (const auto& t : h.tensors)
    if (t.end > t.begin) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i)
    SSM_CHECK(order[i]->begin >= order[i - 1]->end,
              "{}: tensors \"{}\" [{}, {}] and \"{}\" [{}, {}] have overlapping data_offsets", file,
              order[i - 1]->name, order[i - 1]->begin, order[i - 1]->end, order[i]->name, order[i]->begin,
              order[i]->end);
  return h;
}

}  // namespace ssmserve
