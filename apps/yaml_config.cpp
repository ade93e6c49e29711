// Owns the YAML --config file of the subcommands (see yaml_config.h): yaml-cpp parses, CLI11 applies the items to the
// options not given on the command line.
#include "apps/yaml_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#ifdef SSMSERVE_HAVE_YAML_CPP
#include <yaml-cpp/yaml.h>
#endif

namespace ssmserve::cli {
namespace {

[[noreturn]] void bad_config(const std::string& file, const std::string& what) {
  throw CLI::ConfigError(fmt::format("--config {}: {}", file, what));
}

/// Whether a scalar's text is a YAML 1.1 boolean as PyYAML reads it (true / false, yes / no, on / off, in lower, title
/// or upper case).
bool is_yaml_bool(const std::string& v) {
  for (const char* w : {"true", "false", "yes", "no", "on", "off"}) {
    std::string title = w, upper = w;
    title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(title[0])));
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (v == w || v == title || v == upper) return true;
  }
  return false;
}

}  // namespace

#ifdef SSMSERVE_HAVE_YAML_CPP
namespace {

/// A plain scalar's integer in the spellings vLLM's YAML reader (PyYAML, YAML 1.1) takes: decimal, 0x hex, 0o or
/// leading-zero octal, 0b binary, with "_" separators, an optional sign. nullopt for anything else.
std::optional<long long> yaml_int(std::string s) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') neg = s[0] == '-', s.erase(0, 1);
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) base = 16, s.erase(0, 2);
  else if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'O')) base = 8, s.erase(0, 2);
  else if (s.size() > 2 && s[0] == '0' && (s[1] == 'b' || s[1] == 'B')) base = 2, s.erase(0, 2);
  else if (s.size() > 1 && s[0] == '0') base = 8;
  if (s.empty()) return std::nullopt;
  long long v = 0;
  for (char c : s) {
    const int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
                  : std::isxdigit(static_cast<unsigned char>(c)) ? std::tolower(static_cast<unsigned char>(c)) - 'a' + 10
                                                                : 99;
    if (d >= base || v > (std::numeric_limits<long long>::max() - d) / base) return std::nullopt;
    v = v * base + d;
  }
  return neg ? -v : v;
}

/// A YAML scalar as JSON: for plain scalars null, booleans, integers (yaml_int) and floats (".inf", ".nan" too);
/// quoted ones as strings.
nlohmann::json scalar_json(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() != "!") {  // plain (unquoted)
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    if (const auto i = yaml_int(s)) return *i;
    for (const char* inf : {".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"})
      if (s == inf) return std::numeric_limits<double>::infinity();
    for (const char* inf : {"-.inf", "-.Inf", "-.INF"})
      if (s == inf) return -std::numeric_limits<double>::infinity();
    if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size() && s.find_first_of("0123456789") != std::string::npos) return d;
    } catch (const std::exception&) {
    }
  }
  return s;
}

/// A YAML node as JSON. `budget`: nodes left to visit; aliases are followed, so a file of nested aliases (or one
/// referring to itself) could expand without end: past 100,000 nodes or 64 levels it is an error naming the file.
nlohmann::json to_json(const std::string& file, const YAML::Node& n, int depth, long long& budget) {
  if (--budget < 0 || depth > 64)
    bad_config(file, "a value is nested too deeply or expands to too many nodes (aliases of aliases?)");
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) {
        if (!kv.first.IsScalar()) bad_config(file, "a mapping's keys must be scalars, not lists or mappings");
        o[kv.first.Scalar()] = to_json(file, kv.second, depth + 1, budget);
      }
      return o;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : n) a.push_back(to_json(file, e, depth + 1, budget));
      return a;
    }
    case YAML::NodeType::Scalar: {
      nlohmann::json j = scalar_json(n);
      if (j.is_number_float() && !std::isfinite(j.get<double>())) return n.Scalar();  // JSON has no inf / nan
      return j;
    }
    default:
      return nullptr;
  }
}

/// A key as a long flag's name: "--max_model_len" -> "max-model-len".
std::string flag_name(const std::string& file, const YAML::Node& key) {
  if (!key.IsScalar()) bad_config(file, "a key must be a flag's name, not a list or mapping");
  std::string k = key.Scalar();
  if (k.rfind("--", 0) == 0) k = k.substr(2);
  for (char& c : k) {
    if (c == '_') c = '-';
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-')
      bad_config(file, fmt::format("\"{}\" is not a flag's name", key.Scalar()));
  }
  if (k.empty() || k[0] == '-') bad_config(file, fmt::format("\"{}\" is not a flag's name", key.Scalar()));
  return k;
}

/// A scalar as a flag's value: YAML's spellings of booleans as CLI11 reads them, integers in decimal (0x10, 010,
/// 1_000 as vLLM's YAML reader takes them), infinities as "inf", everything else as written.
std::string scalar_value(const YAML::Node& n) {
  const nlohmann::json j = scalar_json(n);
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
  if (j.is_number_integer()) return std::to_string(j.get<long long>());
  if (j.is_number_float() && !std::isfinite(j.get<double>()))
    return std::isnan(j.get<double>()) ? "nan" : j.get<double>() > 0 ? "inf" : "-inf";
  return n.Scalar();
}

}  // namespace

std::string YamlConfig::to_config(const CLI::App* app, bool default_also, bool /*write_description*/,
                                  std::string /*prefix*/) const {
  std::string out;
  for (const CLI::Option* o : app->get_options()) {
    const std::string name = o->get_single_name();
    if (o->get_lnames().empty() || !o->get_configurable()) continue;
    std::vector<std::string> values = o->results();
    if (values.empty() && default_also && !o->get_default_str().empty()) values = {o->get_default_str()};
    if (values.empty()) continue;
    YAML::Emitter e;
    e << YAML::BeginMap << YAML::Key << o->get_lnames().front() << YAML::Value;
    if (values.size() == 1) e << values.front();
    else e << YAML::Flow << values;
    e << YAML::EndMap;
    out += std::string(e.c_str()) + "\n";
  }
  return out;
}

std::vector<CLI::ConfigItem> read_yaml_config(std::istream& input, const std::string& file) {
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(input);
  } catch (const YAML::Exception& e) {
    bad_config(file, fmt::format("not valid YAML (line {}, column {}: {})", e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  std::vector<CLI::ConfigItem> items;
  if (docs.size() > 1) bad_config(file, fmt::format("holds {} YAML documents; a config file is one mapping", docs.size()));
  if (docs.empty() || docs[0].IsNull()) return items;  // an empty file: no flags
  const YAML::Node& doc = docs[0];
  if (!doc.IsMap()) bad_config(file, "expected a mapping of flags to values (`max-model-len: 4096`), not a list or a scalar");
  long long budget = 100000;
  for (const auto& kv : doc) {
    CLI::ConfigItem item;
    item.name = flag_name(file, kv.first);
    const YAML::Node& v = kv.second;
    if (v.IsNull() || (v.IsScalar() && scalar_json(v).is_null()))
      bad_config(file, fmt::format("\"{}\" has no value", kv.first.Scalar()));
    if (v.IsScalar()) {
      item.inputs = {scalar_value(v)};
    } else if (v.IsMap()) {
      item.inputs = {to_json(file, v, 1, budget).dump()};
    } else {  // a sequence
      for (const auto& e : v) {
        if (!e.IsScalar()) bad_config(file, fmt::format("\"{}\": a list of values must hold scalars only", kv.first.Scalar()));
        item.inputs.push_back(scalar_value(e));
      }
      if (item.inputs.empty()) bad_config(file, fmt::format("\"{}\" has no value (an empty list)", kv.first.Scalar()));
    }
    // A flag given twice (or as max-tokens and max_tokens): the last one wins, as on the command line.
    std::erase_if(items, [&](const CLI::ConfigItem& it) { return it.name == item.name; });
    items.push_back(std::move(item));
  }
  return items;
}

#else
std::string YamlConfig::to_config(const CLI::App*, bool, bool, std::string) const { return ""; }

std::vector<CLI::ConfigItem> read_yaml_config(std::istream&, const std::string& file) {
  bad_config(file, "this build has no YAML reader (install libyaml-cpp-dev, as scripts/install-deps.sh does, and rebuild)");
}
#endif

std::vector<CLI::ConfigItem> YamlConfig::from_config(std::istream& input) const {
  std::string file = "file";
  if (file_option_ != nullptr && !file_option_->results().empty()) file = file_option_->results().back();
  if (file_option_ != nullptr && file_option_->count() > 1)  // vLLM: "More than one config file specified!"
    throw CLI::ConfigError(fmt::format("--config is given {} times; give one config file", file_option_->count()));
  std::vector<CLI::ConfigItem> items = read_yaml_config(input, file);
  if (root_ == nullptr) return items;
  // The file holds the flags of the subcommand the command line chose (`ssmserve bench latency --config f`): each item
  // goes to that subcommand, but for the root's own flags (--log-level). No subcommand chosen: CLI11 says one is
  // required.
  std::vector<std::string> path;
  const CLI::App* sub = root_;
  while (!sub->get_subcommands().empty()) {
    sub = sub->get_subcommands().front();
    path.push_back(sub->get_name());
  }
  if (!sub->get_subcommands({}).empty()) return {};
  std::vector<CLI::ConfigItem> out;
  for (CLI::ConfigItem& item : items) {
    const CLI::Option* op = sub->get_option_no_throw("--" + item.name);
    if (op != nullptr || root_->get_option_no_throw("--" + item.name) == nullptr) item.parents = path;
    if (op == nullptr) op = root_->get_option_no_throw("--" + item.name);
    // `serve MODEL --config f` with a model in the file: the command line's model wins.
    if (item.name == "model")
      if (const CLI::Option* tag = sub->get_option_no_throw("model_tag"); tag != nullptr && tag->count() > 0) continue;
    if (op != nullptr && op->get_items_expected_max() == 1 && item.inputs.size() > 1)
      bad_config(file, fmt::format("\"{}\" takes one value, not a list of {}", item.name, item.inputs.size()));
    // A switch takes a YAML boolean (PyYAML's spellings), as vLLM adds the flag for true and nothing for false;
    // another value (`json: 2`) would reach vLLM's parser as a stray argument.
    if (op != nullptr && op->get_expected_max() == 0)
      for (const std::string& v : item.inputs)
        if (!is_yaml_bool(v))
          bad_config(file, fmt::format("\"{}\" is a switch: give true or false, not \"{}\"", item.name, v));
    out.push_back(std::move(item));
  }
  return out;
}

void add_config_file_option(CLI::App& root) {
  CLI::Option* o = root.set_config("--config", "",
                                   "A YAML file of the command's flags (vLLM's): `max-model-len: 4096`, "
                                   "`enable-prefix-caching: false`, `speculative-config: {method: ngram, "
                                   "num_speculative_tokens: 4}`; flags given on the command line win");
  o->check(CLI::ExistingFile);
  root.allow_config_extras(CLI::config_extras_mode::error);  // an unknown key is an error, not ignored
  root.config_formatter(std::make_shared<YamlConfig>(o, &root));
}

std::string note_config_origin(const std::string& msg, const std::vector<std::string>& args, const std::string& file) {
  if (file.empty() || msg.rfind("--", 0) != 0) return msg;
  const size_t colon = msg.find(':');
  if (colon == std::string::npos) return msg;
  const std::string flag = msg.substr(0, colon);  // "--max-model-len"
  if (flag.find_first_of(" ,") != std::string::npos) return msg;
  for (const std::string& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return msg;  // given on the command line
  return msg + " (from --config " + file + ")";
}

std::string config_error_message(const std::string& what, const std::string& command, const std::string& file) {
  static const std::string unknown = "INI was not able to parse ", not_allowed = ": This option is not allowed in a configuration file";
  const std::string at = file.empty() ? "--config" : "--config " + file;
  const auto last_name = [](std::string key) {
    if (const auto dot = key.rfind('.'); dot != std::string::npos) key = key.substr(dot + 1);
    return key;
  };
  if (what.rfind(unknown, 0) == 0)
    return fmt::format("{}: unknown option \"{}\" (not a flag of {})", at, last_name(what.substr(unknown.size())), command);
  if (what.size() > not_allowed.size() && what.compare(what.size() - not_allowed.size(), not_allowed.size(), not_allowed) == 0)
    return fmt::format("{}: \"{}\" cannot be given in a config file", at, last_name(what.substr(0, what.size() - not_allowed.size())));
  return what;
}

}  // namespace ssmserve::cli
