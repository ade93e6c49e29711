// Owns the hub-cache lookup of model ids (see hf_hub_cache.h).
#include "config/hf_hub_cache.h"

#include <cctype>
#include <fstream>

#include "core/env_options.h"
#include "core/error.h"

namespace ssmserve {
namespace {

/// huggingface_hub's repo id: two names of [A-Za-z0-9_.-] joined by one '/', neither starting with '.' or '-'.
bool looks_like_repo_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() || s.find('/', slash + 1) != std::string::npos)
    return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i == slash) continue;
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-')) return false;
  }
  auto ok_start = [](char c) { return c != '.' && c != '-'; };
  return ok_start(s[0]) && ok_start(s[slash + 1]);
}

std::string first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

}  // namespace

std::filesystem::path resolve_model_path(const std::string& model, const std::string& revision,
                                         const std::string& hub_cache) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(model, ec) || !looks_like_repo_id(model)) return model;
  const std::string cache = hub_cache.empty() ? env_options().hf_hub_cache : hub_cache;
  const std::string id = model.substr(0, model.find('/')) + "--" + model.substr(model.find('/') + 1);
  const fs::path repo = fs::path(cache) / ("models--" + id);
  const std::string rev = revision.empty() ? "main" : revision;
  if (!cache.empty() && fs::is_directory(repo, ec)) {
    std::string commit = rev;
    if (rev.find('/') == std::string::npos && rev != "." && rev != ".." && fs::is_regular_file(repo / "refs" / rev, ec))
      commit = first_line(repo / "refs" / rev);
    const fs::path snapshot = repo / "snapshots" / commit;
    if (!commit.empty() && commit.find('/') == std::string::npos && commit != "." && commit != ".." &&
        fs::is_directory(snapshot, ec))
      return snapshot;
    fail("model {}: the Hugging Face cache has {} but no snapshot of revision \"{}\" (ssmserve does not download: "
         "`huggingface-cli download {} --revision {}` fetches it)", model, repo.string(), rev, model, rev);
  }
  fail("model {} is not a local folder, and not in the Hugging Face cache{} (ssmserve does not download models: "
       "fetch it with `huggingface-cli download {}`, or pass the checkpoint folder)", model,
       cache.empty() ? std::string(" (no HF_HUB_CACHE, HF_HOME or HOME set)") : " (" + cache + ")", model);
}

}  // namespace ssmserve
