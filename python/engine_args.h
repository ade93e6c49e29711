// Owns the Python LLM(...) / AsyncLLM engine arguments: each keyword's type check and the EngineConfig field it sets,
// and engine error messages respelt for Python (the keyword, mamba_block_size, where the CLI names --mamba-block-size).
#pragma once
#include <pybind11/pybind11.h>

#include <functional>
#include <map>
#include <string>
#include <string_view>

#include "engine/engine_config.h"

namespace ssmserve::python {

/// Engine option name (EngineOptionName::name) -> the keyword the caller spelt it with (num_threads for threads, ...).
using GivenKeywords = std::map<std::string, std::string, std::less<>>;

/// The EngineConfig of LLM(model, **kw); `given` receives the keyword of each option named. None for any argument is
/// the engine's default. Throws TypeError naming the keyword for an unknown name or a wrong type (int options take a
/// Python int or an __index__ object, not a bool, float or str; float options an int or float, not a bool;
/// enable_prefix_caching a bool; the rest a str); ValueError (py::value_error, or ssmserve::Error respelt by
/// python_message) naming it for a value out of range (an int beyond 32 bits, a bad load_format).
EngineConfig make_config(const std::string& model, const pybind11::kwargs& kw, GivenKeywords& given);

/// An engine error's message as the Python API spells it: every engine option's CLI flag it names
/// (engine/engine_options.h) becomes the LLM(...) keyword, as `given` spelt it, else the option's name;
/// "--no-enable-prefix-caching" becomes "enable_prefix_caching=False".
std::string python_message(std::string_view msg, const GivenKeywords& given = {});

/// Throws std::logic_error when a keyword's option has no CLI spelling in kEngineOptionNames (a programming error:
/// its engine errors could not be respelt). Called once at module import.
void check_engine_args();

}  // namespace ssmserve::python
