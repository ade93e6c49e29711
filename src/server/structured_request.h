// Owns the request side of structured outputs in the OpenAI server (vLLM's protocol.py): `response_format`, the vLLM
// extra field `structured_outputs`, the legacy `guided_*` fields and the JSON schema a forced `tool_choice` ("required"
// or a named function) decodes under, all mapped onto SamplingParams::structured_outputs; every bad input is an
// ApiError 400 naming the field.
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "engine/sampling_params.h"

namespace ssmserve::server {

/// The structured-output constraint of a completions or chat body, or nullopt when it asks for none.
///
/// Fields read (vLLM's names; null values count as absent):
/// - `response_format`: {"type": "text"} (no constraint), {"type": "json_object"} (json_object),
///   {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}} (json = the schema's text),
///   {"type": "structural_tag", "format": {...}} or the legacy {"type": "structural_tag", "structures": [{"begin",
///   "schema", "end"}], "triggers": [...]} (structural_tag = the object's text, the legacy form rewritten as xgrammar's
///   "triggered_tags" format).
/// - `structured_outputs`: {json (object or string), regex, choice, grammar, json_object, structural_tag (object or
///   string), disable_any_whitespace, disable_additional_properties, disable_fallback (ignored)}.
/// - legacy: `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, `structural_tag`;
///   `guided_decoding_backend` (a string; ignored but for xgrammar's "disable-any-whitespace" option after a colon).
/// - `tool_schema`: the schema a forced tool_choice needs (tool_choice_json_schema), or null.
///
/// Exactly one constraint may be set. A `structured_outputs` without one only adds its options (whitespace,
/// additional properties) to the constraint another field sets (vLLM 0.11 fills response_format into the request's
/// structured_outputs); alone it is a 400. A forced tool choice takes the place of `response_format` (vLLM ignores the
/// latter then) but not of a constraint in `structured_outputs` / `guided_*` (a 400 naming tool_choice).
/// Throws ApiError 400 naming the field (`response_format.type`, `response_format.json_schema.schema`,
/// `structured_outputs.regex`, `guided_choice`, ...) for a wrong type, an empty value, an unknown kind or two
/// constraints at once. Whether a schema / regex / grammar compiles is check_structured_outputs' question.
/// `field`, when given, receives the field that set the constraint, as check_structured_outputs names it
/// ("response_format.json_schema.schema", "response_format", "structured_outputs.regex", "guided_json",
/// "structural_tag", "tool_choice"), or "" when there is none.
std::optional<StructuredOutputsParams> parse_structured_outputs(const nlohmann::ordered_json& body,
                                                                const nlohmann::ordered_json& tool_schema = nullptr,
                                                                std::string* field = nullptr);

/// The engine's check of a constraint (validate_structured_outputs: size, nesting, xgrammar's conversion; no
/// tokenizer), run on the HTTP request thread so the engine thread finds the constraint already validated (cached).
/// `field`: parse_structured_outputs' `field` for `params`. Throws ApiError 400 whose param is the field the client
/// used and whose message names it in place of the engine's `structured_outputs.<kind>`. For field "tool_choice",
/// `tools` and `function_name` are the request's (ChatRequest::tools, tool_choice_function: "" for "required") and the
/// error names the tool's parameters (`tools[i].function.parameters`, param "tools"; for "required", the first tool
/// whose schema fails alone, else `tools[*].function.parameters`).
void check_structured_outputs(const StructuredOutputsParams& params, const std::string& field,
                              const nlohmann::ordered_json& tools = nullptr, const std::string& function_name = "");

/// vLLM's JSON schema for a forced tool choice (ChatCompletionRequest._get_json_schema_from_tool), from the request's
/// validated `tools` ([{"type": "function", "function": {"name", "parameters"?}}], non-empty):
/// - `function_name` set (a named tool_choice): that function's parameters schema ({"type": "object", "properties":
///   {}} when it has none);
/// - `function_name` empty ("required"): {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [one
///   {"properties": {"name": {"type": "string", "enum": [name]}, "parameters": schema}, "required": ["name",
///   "parameters"]} per tool]}}, the tools' "$defs" moved to the top.
/// Throws ApiError 400 naming tool_choice when the named function is not among the tools, naming tools when two tools
/// define one "$defs" name differently.
nlohmann::ordered_json tool_choice_json_schema(const nlohmann::ordered_json& tools, const std::string& function_name);

}  // namespace ssmserve::server
