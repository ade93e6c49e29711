// Structured outputs in the OpenAI server: response_format, vLLM's structured_outputs and the legacy guided_* fields
// mapped onto SamplingParams::structured_outputs for both endpoints, bad inputs as 400s naming the field, the
// forced tool_choice schemas (vLLM's _get_json_schema_from_tool), their tool-call parsers (whole and streamed), and
// logprobs clamped to -9999 in the responses.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>
#include <nlohmann/json.hpp>

#include "engine/structured_output.h"
#include "server/protocol.h"
#include "server/serving.h"
#include "server/structured_request.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;

json chat_body(json extra) {
  json b = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

json completion_body(json extra) {
  json b = {{"prompt", "hi"}};
  for (const auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

/// Both endpoints' constraint for the same extra fields (they must agree).
std::optional<StructuredOutputsParams> both(const json& extra) {
  const auto c = parse_completion_request(completion_body(extra)).params.structured_outputs;
  const auto h = parse_chat_request(chat_body(extra)).params.structured_outputs;
  EXPECT_EQ(c, h) << extra.dump();
  return c;
}

/// The param of the ApiError 400 both endpoints throw for `extra` (and the message contains `needle`).
void expect_400(const json& extra, const std::string& param, const std::string& needle = "") {
  for (const bool chat : {false, true}) {
    try {
      if (chat) parse_chat_request(chat_body(extra));
      else parse_completion_request(completion_body(extra));
      ADD_FAILURE() << "no error for " << extra.dump() << (chat ? " (chat)" : " (completions)");
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, param) << extra.dump() << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

const json kSchema = {{"type", "object"},
                      {"properties", {{"name", {{"type", "string"}, {"maxLength", 6}}}, {"ok", {{"type", "boolean"}}}}},
                      {"required", json::array({"name", "ok"})}};

TEST(ServerStructuredOutputs, ResponseFormat) {
  EXPECT_FALSE(both({{"response_format", {{"type", "text"}}}}));
  EXPECT_FALSE(both(json::object()));
  auto p = both({{"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(p);
  EXPECT_TRUE(p->json_object);
  EXPECT_EQ(p->num_constraints(), 1);
  p = both({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", kSchema}, {"strict", true}}}}}});
  ASSERT_TRUE(p && p->json);
  EXPECT_EQ(json::parse(*p->json), kSchema);
  // The current structural tag form passes as sent; the legacy one becomes xgrammar's triggered_tags format.
  const json tag = {{"type", "structural_tag"}, {"format", {{"type", "const_string"}, {"value", "hi"}}}};
  p = both({{"response_format", tag}});
  ASSERT_TRUE(p && p->structural_tag);
  EXPECT_EQ(json::parse(*p->structural_tag), tag);
  const json legacy = {{"type", "structural_tag"},
                       {"structures", json::array({{{"begin", "<f>"}, {"schema", kSchema}, {"end", "</f>"}}})},
                       {"triggers", json::array({"<f"})}};
  p = both({{"response_format", legacy}});
  ASSERT_TRUE(p && p->structural_tag);
  const json converted = json::parse(*p->structural_tag);
  EXPECT_EQ(converted["format"]["type"], "triggered_tags");
  EXPECT_EQ(converted["format"]["triggers"], json::array({"<f"}));
  EXPECT_EQ(converted["format"]["tags"][0]["begin"], "<f>");
  EXPECT_EQ(converted["format"]["tags"][0]["content"]["json_schema"], kSchema);
}

TEST(ServerStructuredOutputs, StructuredOutputsAndLegacyFields) {
  auto p = both({{"structured_outputs", {{"choice", json::array({"yes", "no"})}}}});
  ASSERT_TRUE(p && p->choice);
  EXPECT_EQ(*p->choice, (std::vector<std::string>{"yes", "no"}));
  p = both({{"structured_outputs", {{"regex", "[a-z]+"}, {"disable_any_whitespace", true}}}});
  ASSERT_TRUE(p && p->regex);
  EXPECT_EQ(*p->regex, "[a-z]+");
  EXPECT_TRUE(p->disable_any_whitespace);
  p = both({{"structured_outputs", {{"json", kSchema.dump()}, {"disable_additional_properties", true}, {"regex", nullptr}}}});
  ASSERT_TRUE(p && p->json);
  EXPECT_EQ(json::parse(*p->json), kSchema);
  EXPECT_TRUE(p->disable_additional_properties);
  p = both({{"structured_outputs", {{"grammar", "root ::= \"a\""}}}});
  ASSERT_TRUE(p && p->grammar);
  p = both({{"structured_outputs", {{"json_object", true}}}});
  ASSERT_TRUE(p && p->json_object);
  // Options without a constraint apply to the one response_format sets (vLLM 0.11 fills it into structured_outputs).
  p = both({{"structured_outputs", {{"disable_any_whitespace", true}}}, {"response_format", {{"type", "json_object"}}}});
  ASSERT_TRUE(p && p->json_object);
  EXPECT_TRUE(p->disable_any_whitespace);
  // Legacy fields.
  p = both({{"guided_json", kSchema}});
  ASSERT_TRUE(p && p->json);
  p = both({{"guided_regex", "a|b"}, {"guided_decoding_backend", "xgrammar:disable-any-whitespace"}});
  ASSERT_TRUE(p && p->regex);
  EXPECT_TRUE(p->disable_any_whitespace);
  p = both({{"guided_choice", json::array({"a"})}, {"guided_decoding_backend", "outlines"}});
  ASSERT_TRUE(p && p->choice);
  EXPECT_FALSE(p->disable_any_whitespace);
  p = both({{"guided_grammar", "root ::= \"a\""}, {"guided_json", nullptr}});
  ASSERT_TRUE(p && p->grammar);
}

TEST(ServerStructuredOutputs, BadInputsNameTheField) {
  expect_400({{"response_format", "json"}}, "response_format");
  expect_400({{"response_format", {{"type", "yaml"}}}}, "response_format.type", "yaml");
  expect_400({{"response_format", {{"kind", "json_object"}}}}, "response_format.type");
  expect_400({{"response_format", {{"type", "json_schema"}}}}, "response_format.json_schema");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}}}}, "response_format.json_schema.schema");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", 3}}}}}},
             "response_format.json_schema.schema");
  expect_400({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", 1}, {"schema", kSchema}}}}}},
             "response_format.json_schema.name");
  expect_400({{"response_format", {{"type", "structural_tag"}, {"structures", 1}, {"triggers", json::array()}}}},
             "response_format");
  expect_400({{"structured_outputs", "json"}}, "structured_outputs");
  expect_400({{"structured_outputs", json::object()}}, "structured_outputs", "one constraint");
  expect_400({{"structured_outputs", {{"disable_any_whitespace", true}}}}, "structured_outputs");
  expect_400({{"structured_outputs", {{"regex", 5}}}}, "structured_outputs.regex");
  expect_400({{"structured_outputs", {{"regex", ""}}}}, "structured_outputs.regex");
  expect_400({{"structured_outputs", {{"choice", "a"}}}}, "structured_outputs.choice");
  expect_400({{"structured_outputs", {{"choice", json::array()}}}}, "structured_outputs.choice");
  expect_400({{"structured_outputs", {{"choice", json::array({"a", 1})}}}}, "structured_outputs.choice");
  expect_400({{"structured_outputs", {{"json", 5}}}}, "structured_outputs.json");
  expect_400({{"structured_outputs", {{"json", "{not json"}}}}, "structured_outputs.json", "not valid JSON");
  expect_400({{"structured_outputs", {{"json_object", "yes"}}}}, "structured_outputs.json_object");
  expect_400({{"structured_outputs", {{"grammar", json::array()}}}}, "structured_outputs.grammar");
  expect_400({{"structured_outputs", {{"regex", "a"}, {"disable_any_whitespace", 1}}}}, "structured_outputs.disable_any_whitespace");
  expect_400({{"structured_outputs", {{"regex", "a"}, {"whitespace_pattern", " "}}}}, "structured_outputs.whitespace_pattern");
  expect_400({{"structured_outputs", {{"regexp", "a"}}}}, "structured_outputs.regexp", "not a field");
  expect_400({{"guided_json", 1}}, "guided_json");
  expect_400({{"guided_choice", json::array()}}, "guided_choice");
  expect_400({{"guided_regex", json::array({"a"})}}, "guided_regex");
  expect_400({{"guided_whitespace_pattern", " "}, {"guided_json", kSchema}}, "guided_whitespace_pattern");
  expect_400({{"guided_decoding_backend", 1}, {"guided_json", kSchema}}, "guided_decoding_backend");
  // Two constraints at once (vLLM's message); the second field read is named.
  expect_400({{"structured_outputs", {{"regex", "a"}, {"choice", json::array({"a"})}}}}, "structured_outputs.choice",
             "only use one kind of structured outputs constraint");
  expect_400({{"structured_outputs", {{"regex", "a"}}}, {"guided_json", kSchema}}, "guided_json", "only use one kind");
  expect_400({{"guided_regex", "a"}, {"response_format", {{"type", "json_object"}}}}, "response_format", "only use one kind");
}

const json kTools = json::array(
    {{{"type", "function"},
      {"function", {{"name", "get_weather"},
                    {"parameters", {{"type", "object"}, {"properties", {{"city", {{"$ref", "#/$defs/city"}}}}},
                                    {"$defs", {{"city", {{"type", "string"}, {"maxLength", 8}}}}}}}}}},
     {{"type", "function"}, {"function", {{"name", "noop"}}}}});

TEST(ServerStructuredOutputs, ForcedToolChoiceSchemas) {
  // Named: that function's parameters (an empty object schema when it has none).
  ChatRequest r = parse_chat_request(chat_body({{"tools", kTools},
                                                {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}}));
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.tool_choice_function, "get_weather");
  ASSERT_TRUE(r.params.structured_outputs && r.params.structured_outputs->json);
  EXPECT_EQ(json::parse(*r.params.structured_outputs->json), kTools[0]["function"]["parameters"]);
  EXPECT_EQ(tool_choice_json_schema(kTools, "noop"), json({{"type", "object"}, {"properties", json::object()}}));
  // Required: a non-empty list of {name, parameters}, one anyOf branch per tool, $defs at the top.
  r = parse_chat_request(chat_body({{"tools", kTools}, {"tool_choice", "required"}}));
  EXPECT_EQ(r.tool_choice, "required");
  ASSERT_TRUE(r.params.structured_outputs && r.params.structured_outputs->json);
  const json s = json::parse(*r.params.structured_outputs->json);
  EXPECT_EQ(s["type"], "array");
  EXPECT_EQ(s["minItems"], 1);
  ASSERT_EQ(s["items"]["anyOf"].size(), 2u);
  EXPECT_EQ(s["items"]["anyOf"][0]["properties"]["name"]["enum"], json::array({"get_weather"}));
  EXPECT_FALSE(s["items"]["anyOf"][0]["properties"]["parameters"].contains("$defs"));
  EXPECT_EQ(s["$defs"]["city"]["maxLength"], 8);
  EXPECT_EQ(s["items"]["anyOf"][1]["properties"]["parameters"], json({{"type", "object"}, {"properties", json::object()}}));
  EXPECT_EQ(s["items"]["anyOf"][1]["required"], json::array({"name", "parameters"}));
  // "required" with tools [] is "none" (vLLM); response_format is left out under a forced choice (vLLM).
  r = parse_chat_request(chat_body({{"tools", json::array()}, {"tool_choice", "required"}}));
  EXPECT_EQ(r.tool_choice, "none");
  EXPECT_FALSE(r.params.structured_outputs);
  r = parse_chat_request(chat_body({{"tools", kTools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}));
  ASSERT_TRUE(r.params.structured_outputs);
  EXPECT_FALSE(r.params.structured_outputs->json_object);
  EXPECT_TRUE(r.params.structured_outputs->json);
  // Bad choices.
  for (const json& bad : {json({{"type", "function"}, {"function", {{"name", "nope"}}}}), json({{"type", "function"}}),
                          json({{"type", "function"}, {"function", {{"name", ""}}}}),
                          json({{"type", "other"}, {"function", {{"name", "noop"}}}})}) {
    try {
      parse_chat_request(chat_body({{"tools", kTools}, {"tool_choice", bad}}));
      ADD_FAILURE() << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "tool_choice") << bad.dump();
    }
  }
  try {  // a constraint of its own besides a forced tool choice
    parse_chat_request(chat_body({{"tools", kTools}, {"tool_choice", "required"}, {"guided_regex", "a"}}));
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tool_choice");
  }
  json clash = kTools;
  clash[1]["function"]["parameters"] = {{"type", "object"}, {"$defs", {{"city", {{"type", "integer"}}}}}};
  EXPECT_THROW(tool_choice_json_schema(clash, ""), ApiError);
}

/// The ApiError check_structured_outputs throws for the constraint the chat body with `extra` sets (none: a failure).
ApiError check_error(const json& extra) {
  const ChatRequest r = parse_chat_request(chat_body(extra));
  EXPECT_TRUE(r.params.structured_outputs) << extra.dump();
  try {
    check_structured_outputs(*r.params.structured_outputs, r.structured_outputs_field, r.tools, r.tool_choice_function);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << extra.dump();
  return ApiError(0, "");
}

TEST(ServerStructuredOutputs, EngineCheckNamesTheFieldTheClientUsed) {
  // parse_structured_outputs records the field; check_structured_outputs (the engine's validate_structured_outputs,
  // run on the request thread) answers a 400 whose param and message name it, not the engine's structured_outputs.*.
  std::string field = "stale";
  EXPECT_FALSE(parse_structured_outputs(chat_body(json::object()), nullptr, &field));
  EXPECT_EQ(field, "");
  const json rf_schema = {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", kSchema}}}};
  const std::vector<std::pair<json, std::string>> fields = {
      {{{"response_format", rf_schema}}, "response_format.json_schema.schema"},
      {{{"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"structured_outputs", {{"regex", "a+"}, {"disable_any_whitespace", true}}}}, "structured_outputs.regex"},
      {{{"response_format", rf_schema}, {"structured_outputs", {{"disable_any_whitespace", true}}}},
       "response_format.json_schema.schema"},
      {{{"guided_choice", {"a"}}}, "guided_choice"},
      {{{"guided_json", kSchema}, {"guided_decoding_backend", "xgrammar:disable-any-whitespace"}}, "guided_json"},
      {{{"tools", kTools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}}, "tool_choice"}};
  for (const auto& [extra, want] : fields) {
    EXPECT_EQ(parse_chat_request(chat_body(extra)).structured_outputs_field, want) << extra.dump();
    if (!extra.contains("tools")) EXPECT_EQ(parse_completion_request(completion_body(extra)).structured_outputs_field, want);
  }
  if (!StructuredOutputManager::available()) GTEST_SKIP() << "built without xgrammar";
  // Valid constraints pass (the forced tool choices' schemas included).
  for (const auto& [extra, want] : fields) {
    const ChatRequest r = parse_chat_request(chat_body(extra));
    EXPECT_NO_THROW(check_structured_outputs(*r.params.structured_outputs, r.structured_outputs_field, r.tools,
                                             r.tool_choice_function)) << extra.dump();
  }
  const json bad_schema = {{"type", "foo"}};
  const std::vector<std::tuple<json, std::string, std::string>> cases = {
      {{{"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", bad_schema}}}}}},
       "response_format.json_schema.schema", "response_format.json_schema.schema is not a valid or supported JSON schema: "},
      {{{"structured_outputs", {{"json", bad_schema}}}}, "structured_outputs.json", "structured_outputs.json is not a valid"},
      {{{"guided_json", bad_schema}}, "guided_json", "guided_json is not a valid or supported JSON schema: "},
      {{{"guided_regex", "("}}, "guided_regex", "guided_regex is not a valid or supported regular expression: "},
      {{{"structured_outputs", {{"regex", "("}}}}, "structured_outputs.regex", "structured_outputs.regex is not a valid"},
      {{{"guided_grammar", "root ::= nope"}}, "guided_grammar", "guided_grammar is not a valid or supported grammar: "}};
  for (const auto& [extra, param, prefix] : cases) {
    const ApiError e = check_error(extra);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
  }
  // What xgrammar's conversion accepts and only its compiler refuses (found by a new-user test: a 200 with
  // finish_reason "abort"): negative count keywords, at any depth, named by their path; and enums / choice lists past
  // kMaxStructuredOutputChoices (minutes to compile). A property merely named like a keyword is a schema, not a count.
  json big_enum = json::array();
  for (size_t i = 0; i <= kMaxStructuredOutputChoices; ++i) big_enum.push_back("v" + std::to_string(i));
  json many_choices = big_enum;
  std::vector<std::tuple<json, std::string, std::string>> counts = {
      {{{"guided_json", {{"type", "string"}, {"minLength", -5}}}}, "guided_json", "minLength must be a non-negative"},
      {{{"guided_json", {{"type", "object"}, {"properties", {{"tags", {{"type", "array"}, {"minItems", -1}}}}}}}},
       "guided_json", "properties.tags.minItems must be a non-negative integer (got -1)"},
      {{{"guided_json", {{"type", "string"}, {"maxLength", 2.5}}}}, "guided_json", "maxLength must be a non-negative"},
      {{{"guided_json", {{"anyOf", json::array({json{{"type", "object"}, {"minProperties", -2}}})}}}}, "guided_json",
       "anyOf[0].minProperties"},
      {{{"guided_json", {{"enum", big_enum}}}}, "guided_json", "enum has 10001 values; at most 10000"},
      {{{"guided_choice", many_choices}}, "guided_choice", "10001 choices; at most 10000"}};
  // The same inside a structural tag: its formats' JSON schemas at any nesting, and its own lists.
  json or_of_many = json::array();
  for (size_t i = 0; i <= kMaxStructuredOutputChoices; ++i)
    or_of_many.push_back({{"type", "const_string"}, {"value", "v" + std::to_string(i)}});
  const json tag_schema = {{"type", "structural_tag"},
                           {"format", {{"type", "sequence"},
                                       {"elements", json::array({json{{"type", "const_string"}, {"value", "x"}},
                                                                 json{{"type", "json_schema"},
                                                                      {"json_schema", {{"type", "array"}, {"minItems", -1}}}}})}}}};
  const json tag_or = {{"type", "structural_tag"}, {"format", {{"type", "or"}, {"elements", or_of_many}}}};
  counts.push_back({{{"structured_outputs", {{"structural_tag", tag_schema.dump()}}}}, "structured_outputs.structural_tag",
                    "format.elements[1].json_schema.minItems must be a non-negative integer (got -1)"});
  counts.push_back({{{"structured_outputs", {{"structural_tag", tag_or.dump()}}}}, "structured_outputs.structural_tag",
                    "format.elements has 10001 entries; at most 10000"});
  for (const auto& [extra, param, needle] : counts) {
    const ApiError e = check_error(extra);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  const json keyword_names = {{"type", "object"},
                              {"properties", {{"maxItems", {{"type", "integer"}}}, {"enum", {{"type", "string"}}}}},
                              {"$defs", {{"minLength", {{"type", "string"}, {"minLength", 0}}}}}};
  // Data keywords that look like schemas are not walked: dependentRequired's property names, an example's keys.
  json data_like = keyword_names;
  data_like["dependentRequired"] = {{"maxItems", json::array({"enum"})}};
  data_like["examples"] = json::array({json{{"minLength", "abc"}}});
  data_like["dependencies"] = {{"enum", json::array({"maxItems"})}};
  for (const json& schema : {keyword_names, data_like}) {
    const ChatRequest named = parse_chat_request(chat_body({{"guided_json", schema}}));
    EXPECT_NO_THROW(check_structured_outputs(*named.params.structured_outputs, named.structured_outputs_field,
                                             named.tools, named.tool_choice_function)) << schema.dump();
  }
  // A forced tool choice: the tool whose parameters fail (named, or "required": found by checking each alone).
  json tools = kTools;
  tools.push_back({{"type", "function"}, {"function", {{"name", "broken"}, {"parameters", bad_schema}}}});
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "broken"}}}}}) {
    const ApiError e = check_error({{"tools", tools}, {"tool_choice", choice}});
    EXPECT_EQ(e.param, "tools") << e.what();
    EXPECT_EQ(std::string(e.what()).rfind("tools[2].function.parameters is not a valid or supported JSON schema: ", 0), 0u)
        << e.what();
  }
}

/// A request body with an object of more than kMaxRequestObjectKeys keys (logit_bias, a schema, an unknown field) is a
/// 400 before any parse (a new-user test measured 43 s to parse 200,000 keys: the order-keeping objects compare each
/// new key with every earlier one); one at the bound parses.
TEST(ServerStructuredOutputs, RequestBodyObjectsAreBoundedBeforeParsing) {
  auto body_with = [](std::size_t keys) {
    std::string b = R"({"prompt": "hi", "x": {)";
    for (std::size_t i = 0; i < keys; ++i) b += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";
    return b + "}}";
  };
  EXPECT_EQ(parse_body(body_with(kMaxRequestObjectKeys))["x"].size(), kMaxRequestObjectKeys);
  // A schema sent as JSON text (one string to the body's scan) has the same bound when it is parsed.
  std::string schema_text = R"({"type": "object", "properties": {)";
  for (std::size_t i = 0; i <= kMaxRequestObjectKeys; ++i)
    schema_text += (i ? ",\"p" : "\"p") + std::to_string(i) + "\": {}";
  schema_text += "}}";
  expect_400({{"guided_json", schema_text}}, "guided_json", "an object of more than 10000 keys");
  try {
    (void)parse_body(body_with(kMaxRequestObjectKeys + 1));
    ADD_FAILURE() << "no error for an object of " << kMaxRequestObjectKeys + 1 << " keys";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("an object of more than 10000 keys"), std::string::npos) << e.what();
  }
}

RequestOutput delta(const std::string& text, bool finished, FinishReason reason = FinishReason::Stop) {
  RequestOutput o;
  o.request_id = "r";
  o.outputs.resize(1);
  o.outputs[0].text = text;
  o.outputs[0].token_ids.assign(1, 5);
  o.outputs[0].finish_reason = finished ? reason : FinishReason::None;
  o.delta_text = text;
  o.delta_token_ids.assign(1, 5);
  o.finished = finished;
  return o;
}

/// The message (non-streaming) or the merged deltas (streaming) of a forced tool choice over `pieces`.
struct Reply {
  json content;
  std::vector<json> calls;
  json finish;
};

Reply run(const std::optional<std::string>& forced, const std::vector<std::string>& pieces, bool stream,
          FinishReason reason = FinishReason::Stop, bool parallel_tool_calls = true) {
  auto job = std::make_shared<GenerationJob>();
  job->chat = true;
  job->stream = stream;
  job->forced_tool = forced;
  job->parallel_tool_calls = parallel_tool_calls;
  job->request_ids = {"r"};
  job->prompts.resize(1);
  ResponseBuilder rb(job);
  std::vector<json> chunks;
  for (size_t i = 0; i < pieces.size(); ++i)
    for (auto& c : rb.on_output(0, delta(pieces[i], i + 1 == pieces.size(), reason))) chunks.push_back(std::move(c));
  Reply r;
  if (!stream) {
    const json f = rb.final_response()["choices"][0];
    r.content = f["message"]["content"];
    for (const auto& c : f["message"]["tool_calls"]) r.calls.push_back(c);
    r.finish = f["finish_reason"];
    return r;
  }
  std::string content;
  for (const auto& c : chunks) {
    const json& d = c["choices"][0]["delta"];
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (const auto& t : d["tool_calls"]) {
        const size_t i = t["index"].get<size_t>();
        if (t.contains("id")) {
          EXPECT_EQ(i, r.calls.size());
          r.calls.push_back(t);
        } else {
          EXPECT_LT(i, r.calls.size());
          r.calls[i]["function"]["arguments"] =
              r.calls[i]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      }
    if (!c["choices"][0]["finish_reason"].is_null()) r.finish = c["choices"][0]["finish_reason"];
  }
  r.content = content;
  return r;
}

TEST(ServerStructuredOutputs, ForcedToolCallsWholeAndStreamed) {
  for (const bool stream : {false, true}) {
    // Named: the whole output is the arguments; finish_reason stays "stop" (vLLM).
    Reply r = run(std::string("get_weather"), {"{\"ci", "ty\": \"Oslo\"}"}, stream);
    ASSERT_EQ(r.calls.size(), 1u) << stream;
    EXPECT_EQ(r.calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(r.calls[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
    EXPECT_EQ(r.calls[0]["type"], "function");
    EXPECT_EQ(r.content, "");
    EXPECT_EQ(r.finish, "stop");
    // Required: each list item one call, arguments as Python's json.dumps; finish_reason "tool_calls".
    r = run(std::string(), {"[{\"name\": \"get_weather\", \"para", "meters\": {\"city\":\"a}{[\\\"\"}}, {\"name\":\"noop\",",
                            "\"parameters\":{}}]"}, stream);
    ASSERT_EQ(r.calls.size(), 2u) << stream;
    EXPECT_EQ(r.calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(r.calls[0]["function"]["arguments"], "{\"city\": \"a}{[\\\"\"}");
    EXPECT_EQ(r.calls[1]["function"]["name"], "noop");
    EXPECT_EQ(r.calls[1]["function"]["arguments"], "{}");
    EXPECT_EQ(r.content, "");
    EXPECT_EQ(r.finish, "tool_calls");
    // Required, cut short by max_tokens: the complete items are calls, the finish reason stays "length"; without a
    // complete item there are no calls and content "" (the partial JSON is not content, whole or streamed).
    r = run(std::string(), {"[{\"name\": \"noop\", \"parameters\": {}}, {\"name\": \"get_w"}, stream, FinishReason::Length);
    ASSERT_EQ(r.calls.size(), 1u) << stream;
    EXPECT_EQ(r.calls[0]["function"]["name"], "noop");
    EXPECT_EQ(r.content, "");
    EXPECT_EQ(r.finish, "length");
    for (const auto& pieces : std::vector<std::vector<std::string>>{{"[{\"name\": \"get_w"}, {"[", "{\"na", "me\""}, {""}}) {
      r = run(std::string(), pieces, stream, FinishReason::Length);
      EXPECT_TRUE(r.calls.empty()) << stream;
      EXPECT_EQ(r.content, "") << stream << " " << pieces.front();
      EXPECT_EQ(r.finish, "length");
    }
  }
}

TEST(ServerStructuredOutputs, ParallelToolCallsFalseKeepsTheFirstCall) {
  // Parsed as vLLM: a bool, null = true; chat only (completions ignore it, as vLLM's CompletionRequest has no such field).
  EXPECT_TRUE(parse_chat_request(chat_body(json::object())).parallel_tool_calls);
  EXPECT_TRUE(parse_chat_request(chat_body({{"parallel_tool_calls", nullptr}})).parallel_tool_calls);
  EXPECT_FALSE(parse_chat_request(chat_body({{"parallel_tool_calls", false}})).parallel_tool_calls);
  // pydantic's lax mode: "false" and 0 are false.
  EXPECT_FALSE(parse_chat_request(chat_body({{"parallel_tool_calls", "false"}})).parallel_tool_calls);
  EXPECT_FALSE(parse_chat_request(chat_body({{"parallel_tool_calls", 0}})).parallel_tool_calls);
  for (const json& bad : {json("nope"), json(2), json::array()}) {
    try {
      parse_chat_request(chat_body({{"parallel_tool_calls", bad}}));
      ADD_FAILURE() << bad.dump();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "parallel_tool_calls");
    }
  }
  // false: tool_calls[:1] whole, and no deltas of calls with index > 0 streamed (vLLM's maybe_filter_parallel_tool_calls).
  const std::vector<std::string> pieces = {"[{\"name\": \"noop\", \"parameters\": {}}, {\"name\": \"get_", "weather\", "
                                           "\"parameters\": {\"city\": \"x\"}}, {\"name\": \"noop\", \"parameters\": {}}]"};
  for (const bool stream : {false, true}) {
    Reply all = run(std::string(), pieces, stream);
    EXPECT_EQ(all.calls.size(), 3u);
    Reply one = run(std::string(), pieces, stream, FinishReason::Stop, /*parallel_tool_calls=*/false);
    ASSERT_EQ(one.calls.size(), 1u) << stream;
    EXPECT_EQ(one.calls[0]["function"], all.calls[0]["function"]);
    EXPECT_EQ(one.content, "");
    EXPECT_EQ(one.finish, "tool_calls");
  }
}

TEST(ServerStructuredOutputs, MaskedLogprobsAreClampedInEveryResponse) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const bool chat : {false, true}) {
    for (const bool stream : {false, true}) {
      auto job = std::make_shared<GenerationJob>();
      job->chat = chat;
      job->stream = stream;
      job->logprobs = 3;
      job->request_ids = {"r"};
      job->prompts.push_back({"p", {1, 2}});
      ResponseBuilder rb(job);
      RequestOutput o = delta("x", true);
      o.outputs[0].logprobs = {{{5, 0.0f}, {6, -kInf}, {7, -kInf}}};
      std::vector<json> chunks = rb.on_output(0, std::move(o));
      const json lp = stream ? chunks.at(0)["choices"][0]["logprobs"] : rb.final_response()["choices"][0]["logprobs"];
      const std::string text = lp.dump();
      EXPECT_EQ(text.find("null"), std::string::npos) << text;
      EXPECT_NE(text.find("-9999.0"), std::string::npos) << text;
      if (!stream) {  // the spliced body too
        EXPECT_EQ(nlohmann::json::parse(rb.final_body())["choices"][0]["logprobs"], lp);
      }
    }
  }
  EXPECT_EQ(json_logprob(-kInf), -9999.0f);
  EXPECT_EQ(json_logprob(-1.5f), -1.5f);
}

}  // namespace
}  // namespace ssmserve::server
