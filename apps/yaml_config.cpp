// Owns the YAML --config file of the subcommands (see yaml_config.h): yaml-cpp parses, CLI11 applies the items to the
// options not given on the command line.
#include "apps/yaml_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <memory>
#ifdef SSMSERVE_HAVE_YAML_CPP
#include <yaml-cpp/yaml.h>
#endif

namespace ssmserve::cli {
namespace {

[[noreturn]] void bad_config(const std::string& file, const std::string& what) {
  throw CLI::ConfigError(fmt::format("--config {}: {}", file, what));
}

}  // namespace

#ifdef SSMSERVE_HAVE_YAML_CPP
namespace {

/// A YAML scalar as JSON: YAML 1.2's core schema for plain scalars (null, booleans, integers, floats), quoted ones as
/// strings.
nlohmann::json scalar_json(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() != "!") {  // plain (unquoted)
    if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    try {
      size_t used = 0;
      const long long i = std::stoll(s, &used);
      if (used == s.size()) return i;
    } catch (const std::exception&) {
    }
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size() && s.find_first_of("0123456789") != std::string::npos) return d;
    } catch (const std::exception&) {
    }
  }
  return s;
}

nlohmann::json to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = to_json(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& e : n) a.push_back(to_json(e));
      return a;
    }
    case YAML::NodeType::Scalar:
      return scalar_json(n);
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

/// A scalar as a flag's value: YAML's spellings of booleans as CLI11 reads them, everything else as written.
std::string scalar_value(const YAML::Node& n) {
  const nlohmann::json j = scalar_json(n);
  if (j.is_boolean()) return j.get<bool>() ? "true" : "false";
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
  YAML::Node doc;
  try {
    doc = YAML::Load(input);
  } catch (const YAML::Exception& e) {
    bad_config(file, fmt::format("not valid YAML (line {}, column {}: {})", e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  std::vector<CLI::ConfigItem> items;
  if (doc.IsNull()) return items;  // an empty file: no flags
  if (!doc.IsMap()) bad_config(file, "expected a mapping of flags to values (`max-model-len: 4096`), not a list or a scalar");
  for (const auto& kv : doc) {
    CLI::ConfigItem item;
    item.name = flag_name(file, kv.first);
    const YAML::Node& v = kv.second;
    if (v.IsNull() || (v.IsScalar() && scalar_json(v).is_null()))
      bad_config(file, fmt::format("\"{}\" has no value", kv.first.Scalar()));
    if (v.IsScalar()) {
      item.inputs = {scalar_value(v)};
    } else if (v.IsMap()) {
      item.inputs = {to_json(v).dump()};
    } else {  // a sequence
      for (const auto& e : v) {
        if (!e.IsScalar()) bad_config(file, fmt::format("\"{}\": a list of values must hold scalars only", kv.first.Scalar()));
        item.inputs.push_back(scalar_value(e));
      }
      if (item.inputs.empty()) bad_config(file, fmt::format("\"{}\" has no value (an empty list)", kv.first.Scalar()));
    }
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
  if (file_option_ != nullptr && !file_option_->results().empty()) file = file_option_->results().front();
  std::vector<CLI::ConfigItem> items = read_yaml_config(input, file);
  if (root_ == nullptr) return items;
  // The file holds the flags of the subcommand the command line chose (`ssmserve bench latency --config f`): each item
  // goes to that subcommand, but for the root's own flags (--log-level).
  std::vector<std::string> path;
  const CLI::App* sub = root_;
  while (!sub->get_subcommands().empty()) {
    sub = sub->get_subcommands().front();
    path.push_back(sub->get_name());
  }
  for (CLI::ConfigItem& item : items)
    if (sub->get_option_no_throw("--" + item.name) != nullptr || root_->get_option_no_throw("--" + item.name) == nullptr)
      item.parents = path;
  return items;
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

std::string config_error_message(const std::string& what, const std::string& command) {
  static const std::string prefix = "INI was not able to parse ";
  if (what.rfind(prefix, 0) != 0) return what;
  std::string key = what.substr(prefix.size());
  if (const auto dot = key.rfind('.'); dot != std::string::npos) key = key.substr(dot + 1);
  return fmt::format("--config: unknown option \"{}\" (not a flag of {})", key, command);
}

}  // namespace ssmserve::cli
