// Owns finding a model named by its Hugging Face id (`org/name`, as vLLM takes it) in the local Hugging Face hub
// cache (huggingface_hub's layout: models--org--name/refs/<revision> holds a commit, snapshots/<commit>/ the files).
// ssmserve never downloads: an id that is not in the cache is an error saying how to fetch it.
#pragma once
#include <filesystem>
#include <string>

namespace ssmserve {

/// The folder `model` names: `model` itself when it is an existing folder (or does not look like a hub id); else,
/// for an id `org/name` (one '/', no leading '.', '/' or '~'), the cache's snapshot of `revision` (a branch or tag
/// under refs/, or a commit hash under snapshots/) in `hub_cache` (default: EnvOptions::hf_hub_cache).
/// Throws Error for an id with no such snapshot, naming the cache folder and `huggingface-cli download`.
std::filesystem::path resolve_model_path(const std::string& model, const std::string& revision = "main",
                                         const std::string& hub_cache = "");

}  // namespace ssmserve
