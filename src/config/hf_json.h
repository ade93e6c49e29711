// Owns the hostile-input-safe reading of Hugging Face JSON files: file checks (missing, not regular, symlink loop,
// size cap), a nesting-depth pre-scan, the HF JSON dialect (Infinity/NaN), and bounded quoting of values in messages.
#pragma once
#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <string>
#include <limits>
#include <string_view>

namespace ssmserve {

/// Size cap for small JSON files (config.json, generation_config.json, model.safetensors.index.json).
inline constexpr std::size_t kMaxConfigFileBytes = std::size_t{64} << 20;  // 64 MiB
/// Size cap for tokenizer.json.
inline constexpr std::size_t kMaxTokenizerFileBytes = std::size_t{512} << 20;  // 512 MiB
/// Deepest array/object nesting accepted in any JSON ssmserve parses (real files nest fewer than 10 levels).
inline constexpr int kMaxJsonDepth = 256;

/// Reads a whole text file of at most `max_bytes` bytes. Throws Error naming the path when it is missing (or a
/// dangling symlink), a symlink loop, not a regular file (directory, device, fifo, socket), larger than
/// `max_bytes`, or unreadable. Never lets a std::filesystem exception escape.
std::string read_text_file(const std::filesystem::path& path, std::size_t max_bytes = kMaxConfigFileBytes);

/// Whether anything (file, directory, device, or symlink, even a dangling or looping one) exists at `path`,
/// without following symlinks and without throwing. Use it to decide whether an optional file is present, then
/// read_text_file to get a precise error about what is there.
bool path_entry_exists(const std::filesystem::path& path);

/// The deepest nesting of arrays / objects in JSON `text` (0 for a scalar), by an iterative scan that skips string
/// literals (no parse). Stops at the first bracket deeper than `stop_above`, storing its byte offset in `*where` when
/// given. Unbalanced closing brackets are ignored (left for a parser to report).
int json_nesting_depth(std::string_view text, int stop_above = std::numeric_limits<int>::max(), std::size_t* where = nullptr);

/// Throws Error (naming `what`) when JSON `text` nests arrays/objects deeper than `max_depth`. An iterative scan
/// that skips string literals; run it before any parser or recursive walk so deep input cannot exhaust the stack.
void check_json_depth(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);

/// The most keys of one object anywhere in JSON `text` (the ':' at an object's own level, string literals skipped), by
/// one iterative scan with no parse: nlohmann's order-keeping object inserts each key after a linear search, so an
/// object of n keys costs n^2 / 2 comparisons to parse (200,000 keys: 43 s), and a server bounds n before parsing.
/// Stops at the first object past `stop_above` keys, storing the byte offset of that key's ':' in `*where`.
std::size_t json_max_object_keys(std::string_view text, std::size_t stop_above = std::numeric_limits<std::size_t>::max(),
                                 std::size_t* where = nullptr);

/// A short rendering of `v` for an error message: at most about `max_chars` characters (ending in "..." when cut),
/// built without serializing more of `v` than needed; non-finite numbers show as Infinity, -Infinity or NaN.
std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars = 60);

/// `s` cut to at most `max_chars` characters (ending in "..." when cut), for quoting in messages.
std::string text_excerpt(std::string_view s, std::size_t max_chars = 60);

/// Parses Hugging Face JSON text, accepting the non-standard bare tokens `Infinity`, `-Infinity` and `NaN`
/// (outside strings) as well as transformers 5.x's `{"__float__": "Infinity"}` objects; both become JSON
/// numbers (+/-inf, nan stored as double). `what` names the source in error messages ("config.json").
/// Throws Error with the byte position on invalid JSON, and on nesting deeper than kMaxJsonDepth.
nlohmann::json parse_hf_json(std::string_view text, const std::string& what);

/// Reads a number that may be a plain number or a {"__float__": "..."} object. Throws Error naming `field`.
double json_float(const nlohmann::json& v, const std::string& field);

}  // namespace ssmserve
