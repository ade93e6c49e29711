// Owns the structured-output request mapping (see structured_request.h).
#include "server/structured_request.h"

#include <fmt/format.h>

#include <string>
#include <vector>

#include "config/hf_json.h"
#include "core/error.h"
#include "engine/structured_output.h"
#include "server/api_error.h"
#include "server/protocol.h"
#include "server/request_fields.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;

/// A non-empty string.
std::string as_text(const json& v, const std::string& name) {
  if (!v.is_string()) bad_request(name, fmt::format("{} must be a string (got {})", name, json_type_name(v)));
  std::string s = v.get<std::string>();
  if (s.empty()) bad_request(name, name + " must not be empty");
  return s;
}

bool as_flag(const json& v, const std::string& name) {
  if (!v.is_boolean()) bad_request(name, fmt::format("{} must be a boolean (got {})", name, json_type_name(v)));
  return v.get<bool>();
}

/// JSON given as text (a schema or tag sent as a string), parsed to check it: depth-checked first, as the body was.
json parse_text(const std::string& text, const std::string& name, const char* what) {
  try {
    check_json_depth(text, name);
  } catch (const Error& e) {
    bad_request(name, e.what());
  }
  // The body's bound on keys per object, for text the body's scan saw as one string (a quadratic parse otherwise).
  if (std::size_t at = 0; json_max_object_keys(text, kMaxRequestObjectKeys, &at) > kMaxRequestObjectKeys)
    bad_request(name, fmt::format("{} has an object of more than {} keys (at byte {})", name, kMaxRequestObjectKeys, at));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) bad_request(name, fmt::format("{} is not valid JSON ({} as text)", name, what));
  return j;
}

/// A JSON schema sent as an object or as its JSON text: the text the engine compiles.
std::string schema_text(const json& v, const std::string& name) {
  if (v.is_object()) return v.dump();
  if (v.is_string()) {
    std::string s = as_text(v, name);
    if (!parse_text(s, name, "a JSON schema").is_object()) bad_request(name, name + " must be a JSON schema (an object)");
    return s;
  }
  bad_request(name, fmt::format("{} must be a JSON schema: an object or its JSON text (got {})", name, json_type_name(v)));
}

/// vLLM's choice: a non-empty list of non-empty strings.
std::vector<std::string> as_choice(const json& v, const std::string& name) {
  if (!v.is_array()) bad_request(name, fmt::format("{} must be a list of strings (got {})", name, json_type_name(v)));
  if (v.empty()) bad_request(name, name + " must list at least one string");
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) bad_request(name, fmt::format("{}[{}] must be a string (got {})", name, i, json_type_name(v[i])));
    if (v[i].get<std::string>().empty()) bad_request(name, fmt::format("{}[{}] must not be empty", name, i));
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

/// xgrammar's structural tag text: the object as sent ({"type": "structural_tag", "format": {...}}), or for vLLM's
/// legacy form ({"structures": [{"begin", "schema", "end"}], "triggers": [string]}) the "triggered_tags" format that
/// xgrammar's StructuralTag.from_legacy_structural_tag builds (the C++ compiler reads only the current form).
std::string structural_tag_text(const json& tag, const std::string& name) {
  const json t = tag.is_string() ? parse_text(as_text(tag, name), name, "a structural tag") : tag;
  if (!t.is_object())
    bad_request(name, fmt::format("{} must be a structural tag (an object) or its JSON text (got {})", name, json_type_name(t)));
  if (!t.contains("structures")) return t.dump();
  const json& structures = t["structures"];
  const json* triggers = t.contains("triggers") ? &t["triggers"] : nullptr;
  if (!structures.is_array() || !triggers || !triggers->is_array())
    bad_request(name, name + ": a structural tag with \"structures\" needs \"structures\" (a list of {\"begin\", "
                             "\"schema\", \"end\"}) and \"triggers\" (a list of strings)");
  for (size_t i = 0; i < triggers->size(); ++i)
    if (!(*triggers)[i].is_string()) bad_request(name, fmt::format("{}.triggers[{}] must be a string", name, i));
  json tags = json::array();
  for (size_t i = 0; i < structures.size(); ++i) {
    const json& s = structures[i];
    const bool ok = s.is_object() && s.contains("begin") && s["begin"].is_string() && s.contains("end") &&
                    s["end"].is_string() && s.contains("schema") && (s["schema"].is_object() || s["schema"].is_string());
    if (!ok)
      bad_request(name, fmt::format("{}.structures[{}] must be {{\"begin\": string, \"schema\": a JSON schema, \"end\": string}}",
                                    name, i));
    const std::string item = fmt::format("{}.structures[{}].schema", name, i);
    json schema = json::parse(schema_text(s["schema"], item));
    json content = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
    tags.push_back({{"type", "tag"}, {"begin", s["begin"]}, {"content", std::move(content)}, {"end", s["end"]}});
  }
  json format = {{"type", "triggered_tags"}, {"triggers", *triggers}, {"tags", std::move(tags)}};
  return json{{"type", "structural_tag"}, {"format", std::move(format)}}.dump();
}

/// The constraints found in a body: the params (constraint + options) and each field that set a constraint.
struct Collected {
  StructuredOutputsParams p;
  std::vector<std::string> fields;
  std::string source;  // the field whose value is the constraint's text (parse_structured_outputs' `field`)
  bool structured_outputs_given = false;
};

/// vLLM's extra field `structured_outputs` (its StructuredOutputsParams).
void read_structured_outputs(const json& so, Collected& c) {
  if (!so.is_object())
    bad_request("structured_outputs", fmt::format("structured_outputs must be an object (got {})", json_type_name(so)));
  c.structured_outputs_given = true;
  for (const auto& [key, v] : so.items()) {
    const std::string name = "structured_outputs." + key;
    if (v.is_null()) continue;
    const size_t constraints = c.fields.size();
    if (key == "json") {
      c.p.json = schema_text(v, name), c.fields.push_back(name);
    } else if (key == "regex") {
      c.p.regex = as_text(v, name), c.fields.push_back(name);
    } else if (key == "choice") {
      c.p.choice = as_choice(v, name), c.fields.push_back(name);
    } else if (key == "grammar") {
      c.p.grammar = as_text(v, name), c.fields.push_back(name);
    } else if (key == "json_object") {
      if (as_flag(v, name)) c.p.json_object = true, c.fields.push_back(name);
    } else if (key == "structural_tag") {
      c.p.structural_tag = structural_tag_text(v, name), c.fields.push_back(name);
    } else if (key == "disable_any_whitespace") {
      c.p.disable_any_whitespace = as_flag(v, name);
    } else if (key == "disable_additional_properties") {
      c.p.disable_additional_properties = as_flag(v, name);
    } else if (key == "disable_fallback") {
      as_flag(v, name);  // one backend (xgrammar): nothing to fall back to
    } else if (key == "whitespace_pattern") {
      bad_request(name, name + " is not supported (xgrammar has no whitespace pattern); send "
                               "structured_outputs.disable_any_whitespace true for compact JSON (\", \" and \": \" "
                               "separators, no other whitespace)");
    } else {
      bad_request(name, fmt::format("{} is not a field of structured_outputs (json, regex, choice, grammar, json_object, "
                                    "structural_tag, disable_any_whitespace, disable_additional_properties, "
                                    "disable_fallback)", name));
    }
    if (c.fields.size() > constraints) c.source = name;
  }
}

/// The guided_* fields of vLLM before 0.12 (and chat's top-level structural_tag).
void read_legacy(const json& b, Collected& c) {
  if (const json* v = present_field(b, "guided_json")) c.p.json = schema_text(*v, "guided_json"), c.fields.push_back("guided_json");
  if (const json* v = present_field(b, "guided_regex")) c.p.regex = as_text(*v, "guided_regex"), c.fields.push_back("guided_regex");
  if (const json* v = present_field(b, "guided_choice")) c.p.choice = as_choice(*v, "guided_choice"), c.fields.push_back("guided_choice");
  if (const json* v = present_field(b, "guided_grammar"))
    c.p.grammar = as_text(*v, "guided_grammar"), c.fields.push_back("guided_grammar");
  if (const json* v = present_field(b, "structural_tag"))
    c.p.structural_tag = structural_tag_text(*v, "structural_tag"), c.fields.push_back("structural_tag");
  if (present_field(b, "guided_whitespace_pattern"))
    bad_request("guided_whitespace_pattern", "guided_whitespace_pattern is not supported (xgrammar has no whitespace "
                                             "pattern); send structured_outputs.disable_any_whitespace true for compact JSON "
                                             "(\", \" and \": \" separators, no other whitespace)");
  if (!c.fields.empty() && c.fields.back().rfind("structured_outputs.", 0) != 0) c.source = c.fields.back();
  if (const json* v = present_field(b, "guided_decoding_backend")) {
    // "backend:option,option" (vLLM 0.8): the backend is always xgrammar here; its whitespace option is kept.
    if (!v->is_string())
      bad_request("guided_decoding_backend", fmt::format("guided_decoding_backend must be a string (got {})", json_type_name(*v)));
    const std::string s = v->get<std::string>();
    const size_t colon = s.find(':');
    for (size_t pos = colon == std::string::npos ? s.size() : colon + 1; pos < s.size();) {
      const size_t end = std::min(s.find(',', pos), s.size());
      const std::string opt = s.substr(pos, end - pos);
      if (opt == "disable-any-whitespace") c.p.disable_any_whitespace = true;
      if (opt == "disable-additional-properties") c.p.disable_additional_properties = true;
      pos = end + 1;
    }
  }
}

/// OpenAI's response_format.
void read_response_format(const json& rf, Collected& c) {
  if (!rf.is_object())
    bad_request("response_format", fmt::format("response_format must be an object {{\"type\": ...}} (got {})", json_type_name(rf)));
  const json* type = present_field(rf, "type");
  if (!type || !type->is_string())
    bad_request("response_format.type", "response_format.type must be \"text\", \"json_object\", \"json_schema\" or "
                                        "\"structural_tag\"");
  const std::string t = type->get<std::string>();
  if (t == "text") return;
  if (t == "json_object") {
    c.p.json_object = true;
  } else if (t == "json_schema") {
    const json* js = present_field(rf, "json_schema");
    if (!js || !js->is_object())
      bad_request("response_format.json_schema", "response_format {\"type\": \"json_schema\"} needs \"json_schema\": "
                                                 "{\"name\": string, \"schema\": a JSON schema}");
    if (const json* n = present_field(*js, "name"); n && !n->is_string())
      bad_request("response_format.json_schema.name", "response_format.json_schema.name must be a string");
    if (const json* s = present_field(*js, "strict")) as_flag(*s, "response_format.json_schema.strict");
    const json* schema = present_field(*js, "schema");
    if (!schema)
      bad_request("response_format.json_schema.schema",
                  "response_format.json_schema.schema is required: the JSON schema the output follows");
    c.p.json = schema_text(*schema, "response_format.json_schema.schema");
    c.source = "response_format.json_schema.schema";
  } else if (t == "structural_tag") {
    c.p.structural_tag = structural_tag_text(rf, "response_format");
  } else {
    bad_request("response_format.type", fmt::format("response_format.type must be \"text\", \"json_object\", "
                                                    "\"json_schema\" or \"structural_tag\" (got \"{}\")", t));
  }
  if (t != "json_schema") c.source = "response_format";
  c.fields.push_back("response_format");
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

/// A tool's parameters schema; vLLM: an empty object schema when the tool has none (or {}).
json parameters_of(const json& fn) {
  const json* p = present_field(fn, "parameters");
  return p && !p->empty() ? *p : json{{"type", "object"}, {"properties", json::object()}};
}

}  // namespace

std::optional<StructuredOutputsParams> parse_structured_outputs(const json& b, const json& tool_schema, std::string* field) {
  if (field) field->clear();
  // 1. Every field that can set a constraint, in one collection.
  Collected c;
  if (const json* v = present_field(b, "structured_outputs")) read_structured_outputs(*v, c);
  read_legacy(b, c);
  if (const json* v = present_field(b, "response_format")) {
    if (tool_schema.is_null()) {
      read_response_format(*v, c);
    } else {  // vLLM: a forced tool choice wins over response_format (checked, then left out)
      Collected ignored;
      read_response_format(*v, ignored);
    }
  }
  // 2. A forced tool choice's schema, alone.
  if (!tool_schema.is_null()) {
    if (!c.fields.empty())
      bad_request("tool_choice", fmt::format("You can only either use constraints for structured outputs or tools, not "
                                             "both: tool_choice \"required\" or a named function decodes the calls under "
                                             "a JSON schema, and {} sets another constraint", c.fields.front()));
    c.p.json = tool_schema.dump();
    c.fields.push_back("tool_choice");
    c.source = "tool_choice";
  }
  // 3. Exactly one constraint.
  if (c.fields.size() > 1)
    bad_request(c.fields[1], fmt::format("You can only use one kind of structured outputs constraint but multiple are "
                                         "specified: {}", join(c.fields)));
  if (c.fields.empty()) {
    if (c.structured_outputs_given)
      bad_request("structured_outputs", "structured_outputs must set one constraint (json, regex, choice, grammar, "
                                        "json_object or structural_tag); its options alone apply only to a constraint "
                                        "that response_format or tool_choice sets");
    return std::nullopt;
  }
  if (field) *field = c.source;
  return c.p;
}

namespace {

/// validate_structured_outputs' message with its leading "structured_outputs.<kind>" (the engine's name for the
/// constraint) replaced by `name`.
std::string renamed(const std::string& message, const StructuredOutputsParams& p, const std::string& name) {
  const std::string engine_name = std::string("structured_outputs.") + p.kind();
  if (message.rfind(engine_name, 0) != 0) return message;
  return name + message.substr(engine_name.size());
}

}  // namespace

void check_structured_outputs(const StructuredOutputsParams& p, const std::string& field, const json& tools,
                              const std::string& function_name) {
  try {
    validate_structured_outputs(p);
    return;
  } catch (const Error& e) {
    if (field != "tool_choice" || !tools.is_array()) {
      const std::string name = field.empty() ? std::string("structured_outputs.") + p.kind() : field;
      bad_request(name, renamed(e.what(), p, name));
    }
    // A forced tool choice: the schema is built from the tools' parameters; name the tool at fault.
    for (size_t i = 0; i < tools.size(); ++i) {
      const json& fn = tools[i]["function"];
      if (!function_name.empty() && fn["name"] != function_name) continue;
      const std::string name = fmt::format("tools[{}].function.parameters", i);
      if (!function_name.empty()) bad_request("tools", renamed(e.what(), p, name));
      StructuredOutputsParams one = p;  // "required": each tool's schema alone (only on this error path)
      one.json = parameters_of(fn).dump();
      try {
        validate_structured_outputs(one);
      } catch (const Error& e1) {
        bad_request("tools", renamed(e1.what(), one, name));
      }
    }
    bad_request("tools", renamed(e.what(), p, "tools[*].function.parameters (the schema of tool_choice \"required\")"));
  }
}

json tool_choice_json_schema(const json& tools, const std::string& function_name) {
  if (!function_name.empty()) {
    for (const auto& t : tools)
      if (t["function"]["name"] == function_name) return parameters_of(t["function"]);
    bad_request("tool_choice", fmt::format("The tool specified in `tool_choice` ({}) does not match any of the specified "
                                           "`tools`", function_name));
  }
  json any_of = json::array(), defs = json::object();
  for (const auto& t : tools) {
    const json& fn = t["function"];
    json params = parameters_of(fn);
    if (params.contains("$defs")) {  // vLLM: every tool's $defs at the top, where the schema's $refs find them
      if (!params["$defs"].is_object())
        bad_request("tools", fmt::format("tool {}: parameters.$defs must be an object", fn["name"].get<std::string>()));
      for (const auto& [name, def] : params["$defs"].items()) {
        if (defs.contains(name) && defs[name] != def)
          bad_request("tools", fmt::format("Tool definition '{}' has multiple schemas, which is not supported.", name));
        defs[name] = def;
      }
      params.erase("$defs");
    }
    json name = {{"type", "string"}, {"enum", json::array({fn["name"]})}};
    json properties = {{"name", std::move(name)}, {"parameters", std::move(params)}};
    any_of.push_back({{"properties", std::move(properties)}, {"required", json::array({"name", "parameters"})}});
  }
  json schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"type", "object"}, {"anyOf", std::move(any_of)}}}};
  if (!defs.empty()) schema["$defs"] = std::move(defs);
  return schema;
}

}  // namespace ssmserve::server
