// Owns Checkpoint: finding a folder's safetensors files (single, index-sharded or globbed), mapping them, and
// serving validated tensor views by name with shape and dtype checks.
#include "model/checkpoint.h"

#include <algorithm>
#include <set>

#include <fmt/ranges.h>

#include "config/model_config.h"
#include "core/error.h"
#include "model/mapped_file.h"
#include "model/safetensors_header.h"

namespace ssmserve {
namespace fs = std::filesystem;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

/// Shard names from model.safetensors.index.json's weight_map, checked to stay inside `dir`.
std::map<std::string, std::string> read_weight_map(const fs::path& index_path) {
  const nlohmann::json idx = parse_hf_json(read_text_file(index_path, kMaxConfigFileBytes), index_path.string());
  SSM_CHECK(idx.is_object(), "{}: must be a JSON object (got {})", index_path.string(), json_excerpt(idx));
  const auto wm = idx.find("weight_map");
  SSM_CHECK(wm != idx.end() && wm->is_object(), "{}: missing object \"weight_map\"", index_path.string());
  std::map<std::string, std::string> out;
  for (const auto& [name, shard] : wm->items()) {
    SSM_CHECK(shard.is_string(), "{}: weight_map entry for tensor \"{}\" must be a file name (got {})",
              index_path.string(), text_excerpt(name), json_excerpt(shard));
    const fs::path p = shard.get<std::string>();
    const bool escapes = p.empty() || p.is_absolute() ||
                         std::any_of(p.begin(), p.end(), [](const fs::path& c) { return c == ".."; });
    SSM_CHECK(!escapes, "{}: weight_map entry for tensor \"{}\" names \"{}\", which is not a file inside the folder",
              index_path.string(), text_excerpt(name), text_excerpt(p.string()));
    out[name] = p.string();
  }
  SSM_CHECK(!out.empty(), "{}: \"weight_map\" is empty", index_path.string());
  return out;
}

}  // namespace

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

Checkpoint::Checkpoint() = default;
Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

Checkpoint Checkpoint::open(const fs::path& dir) {
  std::error_code ec;
  SSM_CHECK(fs::is_directory(dir, ec), "checkpoint folder {} does not exist or is not a directory", dir.string());
  Checkpoint ck;
  ck.dir_ = dir;

  const fs::path index_path = dir / "model.safetensors.index.json";
  if (path_entry_exists(index_path)) {  // even a dangling or looping symlink: read_text_file says which
    const auto weight_map = read_weight_map(index_path);
    std::set<std::string> shards;
    for (const auto& [name, shard] : weight_map) shards.insert(shard);
    for (const auto& shard : shards) {
      SSM_CHECK(path_entry_exists(dir / shard), "{}: shard {} listed in weight_map does not exist in {}",
                index_path.string(), text_excerpt(shard), dir.string());  // MappedFile rejects a non-regular one
      ck.add_file(dir / shard);
    }
    for (const auto& [name, shard] : weight_map) {
      const auto t = ck.tensors_.find(name);
      const std::string found = t != ck.tensors_.end()             ? t->second.file
                                : ck.unsupported_.count(name) != 0 ? ck.unsupported_.at(name).file
                                                                   : std::string();
      SSM_CHECK(found == (dir / shard).string(), "{}: weight_map puts tensor \"{}\" in {}, but {}",
                index_path.string(), name, shard,
                found.empty() ? std::string("no shard holds it") : "it is in " + found);
    }
    return ck;
  }
  if (path_entry_exists(dir / "model.safetensors")) {  // MappedFile names a dangling link, loop or non-file
    ck.add_file(dir / "model.safetensors");
    return ck;
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  SSM_CHECK(!ec, "cannot list checkpoint folder {}: {}", dir.string(), ec.message());
  SSM_CHECK(!files.empty(), "checkpoint folder {} has no model.safetensors, model.safetensors.index.json or "
            "*.safetensors file", dir.string());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) ck.add_file(f);
  return ck;
}

void Checkpoint::add_file(const fs::path& path) {
  auto mapped = std::make_unique<MappedFile>(path);
  const std::string file = path.string();
  const SafetensorsHeader h = parse_safetensors_header(mapped->data(), mapped->size(), file);
  for (const SafetensorsEntry& e : h.tensors) {
    const auto prev = tensors_.find(e.name);
    const auto prev_u = unsupported_.find(e.name);
    if (prev != tensors_.end() || prev_u != unsupported_.end())
      fail("tensor \"{}\" appears in both {} and {}", e.name,
           prev != tensors_.end() ? prev->second.file : prev_u->second.file, file);
    TensorRef t;
    t.name = e.name;
    t.file = file;
    t.dtype_name = e.dtype_name;
    t.shape = e.shape;
    t.nbytes = static_cast<size_t>(e.end - e.begin);
    t.data = mapped->data() + h.data_start + e.begin;
    if (!e.dtype) {  // raw bytes: 1-byte types need no alignment; wider ones are only named in errors
      unsupported_[e.name] = Unsupported{file, e.dtype_name, std::move(t)};
      continue;
    }
    t.dtype = *e.dtype;
    if (t.nbytes > 0 && reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) != 0) {
      // The format does not promise alignment; keep an aligned copy so kernels can read elements directly.
      auto& copy = realigned_.emplace_back(t.data, t.data + t.nbytes);
      t.data = copy.data();
    }
    tensors_.emplace(e.name, std::move(t));
  }
  files_.push_back(std::move(mapped));
}

bool Checkpoint::has(const std::string& name) const {
  return tensors_.count(name) != 0 || unsupported_.count(name) != 0;
}

const TensorRef& Checkpoint::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    if (const auto u = unsupported_.find(name); u != unsupported_.end())
      fail("{}: tensor \"{}\" has dtype {}, which ssmserve cannot load (supported: F32, BF16, F16{})", u->second.file,
           name, u->second.dtype,
           u->second.dtype.rfind("F8_", 0) == 0 ? "; F8_E4M3 only for the projection matrices of an FP8 checkpoint" : "");
    std::vector<std::string> files;
    for (const auto& f : files_) files.push_back(f->path().filename().string());
    fail("tensor \"{}\" (expected shape {}) is missing from checkpoint {} (files: {})", name,
         shape_str(expected_shape), dir_.string(), fmt::join(files, ", "));
  }
  const TensorRef& t = it->second;
  SSM_CHECK(t.shape == expected_shape, "{}: tensor \"{}\" has shape {} but the model config expects {}", t.file,
            name, shape_str(t.shape), shape_str(expected_shape));
  return t;
}

const TensorRef* Checkpoint::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorRef* Checkpoint::find_raw(const std::string& name) const {
  const auto it = unsupported_.find(name);
  return it == unsupported_.end() ? nullptr : &it->second.raw;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  for (const auto& [name, u] : unsupported_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace ssmserve
