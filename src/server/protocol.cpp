// Owns the OpenAI request parsing (see protocol.h).
#include "server/protocol.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <string_view>

#include "config/hf_json.h"
#include "core/error.h"
#include "chat/chat_template.h"
#include "server/request_fields.h"
#include "server/structured_request.h"

namespace ssmserve::server {
namespace {

using json = nlohmann::ordered_json;

const char* type_name(const json& v) { return json_type_name(v); }

/// The value of `key` when present and not null.
const json* field(const json& body, const char* key) { return present_field(body, key); }

/// s without leading / trailing ASCII whitespace.
std::string_view trimmed(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

/// An integer in [lo, hi] as pydantic's lax mode reads one (vLLM's request models): JSON integers, floats with an
/// integral value, true / false as 1 / 0, and strings of an optional sign and decimal digits (surrounding whitespace
/// ignored).
long long as_int(const json& v, const std::string& name, long long lo, long long hi) {
  long long x = 0;
  const auto bad = [&] { bad_request(name, fmt::format("{} must be an integer (got {})", name, type_name(v))); };
  if (v.is_number_unsigned()) {
    const auto u = v.get<unsigned long long>();
    if (u > static_cast<unsigned long long>(std::numeric_limits<long long>::max())) bad_request(name, name + " is too large");
    x = static_cast<long long>(u);
  } else if (v.is_number_integer()) {
    x = v.get<long long>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::floor(v.get<double>()) == v.get<double>() &&
             std::fabs(v.get<double>()) < 9e18) {
    x = static_cast<long long>(v.get<double>());
  } else if (v.is_boolean()) {
    x = v.get<bool>() ? 1 : 0;
  } else if (v.is_string()) {
    const std::string_view t = trimmed(v.get_ref<const std::string&>());
    const size_t digits = !t.empty() && (t[0] == '+' || t[0] == '-') ? 1 : 0;
    if (t.size() == digits || !std::all_of(t.begin() + digits, t.end(), [](char c) { return c >= '0' && c <= '9'; })) bad();
    const std::string_view d = t[0] == '+' ? t.substr(1) : t;  // from_chars takes '-' only
    const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), x);
    if (ec == std::errc::result_out_of_range) bad_request(name, name + " is too large");
    if (ec != std::errc() || end != d.data() + d.size()) bad();
  } else {
    bad();
  }
  if (x < lo || x > hi) bad_request(name, fmt::format("{} must be in [{}, {}] (got {})", name, lo, hi, x));
  return x;
}

/// The message for a max_tokens / max_completion_tokens `x` outside [1, 2^31 - 1] (vLLM: "at least 1").
std::string max_tokens_range(const std::string& name, long long x) {
  return fmt::format("{} must be in [1, {}] (got {})", name, std::numeric_limits<int>::max(), x);
}

/// A finite number as pydantic's lax mode reads one: JSON numbers, true / false as 1 / 0, and strings holding a
/// decimal number (surrounding whitespace ignored).
double as_number(const json& v, const std::string& name) {
  double x = 0.0;
  if (v.is_number()) {
    x = v.get<double>();
  } else if (v.is_boolean()) {
    x = v.get<bool>() ? 1.0 : 0.0;
  } else if (v.is_string()) {
    const std::string_view t = trimmed(v.get_ref<const std::string&>());
    const std::string_view d = !t.empty() && t[0] == '+' ? t.substr(1) : t;
    const auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), x);
    if (d.empty() || ec != std::errc() || end != d.data() + d.size())
      bad_request(name, fmt::format("{} must be a number (got {})", name, type_name(v)));
  } else {
    bad_request(name, fmt::format("{} must be a number (got {})", name, type_name(v)));
  }
  if (!std::isfinite(x)) bad_request(name, name + " must be finite");
  return x;
}

/// A boolean as pydantic's lax mode reads one: true / false, the numbers 0 and 1, and the strings 0 / 1, f / t,
/// n / y, no / yes, off / on, false / true in any case (surrounding whitespace ignored).
bool as_bool(const json& v, const std::string& name) {
  const auto bad = [&] { bad_request(name, fmt::format("{} must be a boolean (got {})", name, type_name(v))); };
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) {
    const double x = v.get<double>();
    if (x != 0.0 && x != 1.0) bad();
    return x == 1.0;
  }
  if (!v.is_string()) bad();
  std::string t(trimmed(v.get_ref<const std::string&>()));
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* f : {"0", "f", "n", "no", "off", "false"})
    if (t == f) return false;
  for (const char* y : {"1", "t", "y", "yes", "on", "true"})
    if (t == y) return true;
  bad();
  return false;
}

std::vector<int> as_token_ids(const json& v, const std::string& name) {
  std::vector<int> ids;
  ids.reserve(v.size());
  for (const auto& e : v) ids.push_back(static_cast<int>(as_int(e, name, 0, std::numeric_limits<int>::max())));
  return ids;
}

/// A logprobs count (`name`: logprobs, prompt_logprobs, top_logprobs) within the server's --max-logprobs; vLLM's
/// -1 (the whole vocabulary) only where `allow_all`, and then always above the limit.
int as_logprobs(const json& v, const std::string& name, int max_logprobs, bool allow_all = false) {
  const long long x = as_int(v, name, allow_all ? -1 : 0, std::numeric_limits<int>::max());
  if (x == -1)
    bad_request(name, fmt::format("{} -1 asks for the whole vocabulary, more than the server's limit of {} (--max-logprobs)",
                                  name, max_logprobs));
  if (x > max_logprobs)
    bad_request(name, fmt::format("{} must be at most {} (got {}): the server's --max-logprobs is {}", name, max_logprobs, x,
                                  max_logprobs));
  return static_cast<int>(x);
}

/// vLLM's prompt_logprobs (both endpoints): a count within --max-logprobs; with stream only 0, which is then dropped
/// (as vLLM's check_logprobs). Call after r.stream is parsed.
void parse_prompt_logprobs(const json& b, GenerationRequest& r, int max_logprobs) {
  const json* v = field(b, "prompt_logprobs");
  if (!v || v->is_null()) return;
  r.prompt_logprobs = as_logprobs(*v, "prompt_logprobs", max_logprobs, /*allow_all=*/true);
  if (r.stream && *r.prompt_logprobs > 0)
    bad_request("prompt_logprobs", "prompt_logprobs is not available with stream (send stream false)");
  if (r.stream) r.prompt_logprobs.reset();  // 0 with stream: accepted and not sent (vLLM's check_logprobs)
}

/// Features a client relies on that ssmserve does not have: a 400 naming them rather than output that silently
/// ignores them (beam search; tools on /v1/completions, where `tool_choice` "none" is the plain behaviour and passes).
void reject_unsupported_features(const json& b, bool chat) {
  if (const json* v = field(b, "use_beam_search"); v && *v != false) bad_request("use_beam_search", "beam search is not supported");
  if (chat) return;  // tools: parse_tools
  const json* choice = field(b, "tool_choice");
  const bool tools = field(b, "tools") && !(field(b, "tools")->is_array() && field(b, "tools")->empty());
  if ((choice && *choice != "none") || (tools && !choice))
    bad_request(choice ? "tool_choice" : "tools", "tools are a chat completions feature (send no tools, or tool_choice \"none\")");
}

/// Chat `tools` and `tool_choice`, validated as vLLM's ChatCompletionRequest (check_tool_usage) does. "required" and a
/// named function are decoded under a JSON schema (structured outputs; parse_chat_request sets it).
void parse_tools(const json& b, ChatRequest& r) {
  if (const json* v = field(b, "tools")) {
    if (!v->is_array()) bad_request("tools", fmt::format("tools must be a list (got {})", type_name(*v)));
    for (size_t i = 0; i < v->size(); ++i) {
      const json& t = (*v)[i];
      const json* fn = t.is_object() ? field(t, "function") : nullptr;
      const json* type = t.is_object() ? field(t, "type") : nullptr;
      if (!fn || !fn->is_object() || !field(*fn, "name") || !(*fn)["name"].is_string() || (type && *type != "function"))
        bad_request("tools", fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": string, "
                                         "\"description\"?, \"parameters\"?}}}}", i));
      if ((*fn)["name"].get_ref<const std::string&>().empty())  // OpenAI's: 1 to 64 characters
        bad_request("tools", fmt::format("tools[{}].function.name must not be empty", i));
      if (const json* p = field(*fn, "parameters"); p && !p->is_object())
        bad_request("tools", fmt::format("tools[{}].function.parameters must be an object (a JSON schema)", i));
    }
    if (!v->empty()) r.tools = *v;
  }
  if (const json* v = field(b, "parallel_tool_calls")) r.parallel_tool_calls = as_bool(*v, "parallel_tool_calls");
  const json* choice = field(b, "tool_choice");
  if (!choice) {
    r.tool_choice = r.tools.is_null() ? "none" : "auto";  // vLLM / OpenAI: "auto" when tools are given
    return;
  }
  r.tool_choice_given = true;
  if (*choice == "none") {
    r.tool_choice = "none";
    return;
  }
  if (!field(b, "tools")) bad_request("tool_choice", "When using `tool_choice`, `tools` must be set.");
  if (*choice == "auto") {
    r.tool_choice = "auto";
    return;
  }
  if (*choice == "required") {
    r.tool_choice = r.tools.is_null() ? "none" : "required";  // vLLM (as OpenAI): "required" with tools [] is "none"
    return;
  }
  if (choice->is_object()) {
    const char* usage = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";
    const json* fn = field(*choice, "function");
    const json* type = field(*choice, "type");
    if ((type && *type != "function") || !fn || !fn->is_object())
      bad_request("tool_choice", fmt::format("Invalid value for `function` in `tool_choice`! {}", usage));
    const json* name = field(*fn, "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      bad_request("tool_choice", fmt::format("Invalid `name` in `function` in `tool_choice`! {}", usage));
    if (r.tools.is_null())
      bad_request("tool_choice", "The tool specified in `tool_choice` does not match any of the specified `tools`");
    r.tool_choice = "function";
    r.tool_choice_function = name->get<std::string>();
    return;
  }
  bad_request("tool_choice", fmt::format("Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or "
                                         "\"required\" are supported.", choice->dump()));
}

/// Sampling fields common to both endpoints (vLLM's names), starting from `defaults` (vLLM's to_sampling_params with
/// default_sampling_params: a field absent or null takes the model's default, else SamplingParams'). Range checks
/// that SamplingParams::validate also does are repeated here so the error names the OpenAI field.
void parse_common(const json& b, GenerationRequest& r, const char* max_tokens_key, bool chat,
                  const GenerationDefaults& defaults) {
  SamplingParams& sp = r.params;
  defaults.apply(sp);  // max_tokens: meaningful only when given (the server computes the default per prompt)
  if (const json* v = field(b, "model")) {
    if (!v->is_string()) bad_request("model", fmt::format("model must be a string (got {})", type_name(*v)));
    r.model = v->get<std::string>();
  }
  // Chat: max_completion_tokens, else the deprecated max_tokens (vLLM); errors name the one the client sent.
  r.max_tokens_field = max_tokens_key;
  const json* mt = field(b, max_tokens_key);
  if (!mt && chat && (mt = field(b, "max_tokens"))) r.max_tokens_field = "max_tokens";
  if (mt) {
    // At least 1 (vLLM's SamplingParams), on both endpoints and whatever the value; 0 is taken only by completions
    // with echo (checked there).
    const std::string& name = r.max_tokens_field;
    const long long x = as_int(*mt, name, std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max());
    if ((x < 1 && !(x == 0 && !chat)) || x > std::numeric_limits<int>::max()) bad_request(name, max_tokens_range(name, x));
    sp.max_tokens = static_cast<int>(x);
    r.max_tokens_given = true;
  }
  if (const json* v = field(b, "temperature")) {
    sp.temperature = as_number(*v, "temperature");
    if (sp.temperature < 0) bad_request("temperature", fmt::format("temperature must be >= 0 (got {})", sp.temperature));
  }
  if (const json* v = field(b, "top_p")) {
    sp.top_p = as_number(*v, "top_p");
    if (!(sp.top_p > 0 && sp.top_p <= 1)) bad_request("top_p", fmt::format("top_p must be in (0, 1] (got {})", sp.top_p));
  }
  if (const json* v = field(b, "top_k")) sp.top_k = static_cast<int>(as_int(*v, "top_k", -1, std::numeric_limits<int>::max()));
  if (const json* v = field(b, "min_p")) {
    sp.min_p = as_number(*v, "min_p");
    if (sp.min_p < 0 || sp.min_p > 1) bad_request("min_p", fmt::format("min_p must be in [0, 1] (got {})", sp.min_p));
  }
  // Any int64, as vLLM's request models; -1 is no seed (vLLM's SamplingParams), another negative seed its
  // two's-complement bits.
  if (const json* v = field(b, "seed")) {
    const long long seed = as_int(*v, "seed", std::numeric_limits<long long>::min(), std::numeric_limits<long long>::max());
    if (seed != -1) sp.seed = static_cast<uint64_t>(seed);
  }
  for (const char* k : {"presence_penalty", "frequency_penalty"})
    if (const json* v = field(b, k)) {
      const double x = as_number(*v, k);
      if (x < -2 || x > 2) bad_request(k, fmt::format("{} must be in [-2, 2] (got {})", k, x));
      (std::string(k) == "presence_penalty" ? sp.presence_penalty : sp.frequency_penalty) = x;
    }
  if (const json* v = field(b, "repetition_penalty")) {
    sp.repetition_penalty = as_number(*v, "repetition_penalty");
    if (sp.repetition_penalty <= 0) bad_request("repetition_penalty", "repetition_penalty must be > 0");
  }
  if (const json* v = field(b, "n")) sp.n = static_cast<int>(as_int(*v, "n", 1, kMaxN));
  if (const json* v = field(b, "best_of")) {
    if (as_int(*v, "best_of", 1, kMaxN) != sp.n) bad_request("best_of", "best_of must equal n (beam search is not supported)");
  }
  if (const json* v = field(b, "stop")) {
    if (v->is_string()) {
      sp.stop = {v->get<std::string>()};
    } else if (v->is_array()) {
      if (v->size() > 64) bad_request("stop", "at most 64 stop strings");
      for (const auto& s : *v) {
        if (!s.is_string()) bad_request("stop", "stop must be a string or a list of strings");
        sp.stop.push_back(s.get<std::string>());
      }
    } else {
      bad_request("stop", fmt::format("stop must be a string or a list of strings (got {})", type_name(*v)));
    }
    for (const auto& s : sp.stop)
      if (s.empty()) bad_request("stop", "stop strings must not be empty");
  }
  if (const json* v = field(b, "stop_token_ids")) {
    if (!v->is_array()) bad_request("stop_token_ids", "stop_token_ids must be a list of integers");
    sp.stop_token_ids = as_token_ids(*v, "stop_token_ids");
  }
  if (const json* v = field(b, "ignore_eos")) sp.ignore_eos = as_bool(*v, "ignore_eos");
  if (const json* v = field(b, "min_tokens")) sp.min_tokens = static_cast<int>(as_int(*v, "min_tokens", 0, std::numeric_limits<int>::max()));
  if (const json* v = field(b, "skip_special_tokens")) sp.skip_special_tokens = as_bool(*v, "skip_special_tokens");
  if (const json* v = field(b, "include_stop_str_in_output")) sp.include_stop_str_in_output = as_bool(*v, "include_stop_str_in_output");
  if (const json* v = field(b, "logit_bias")) sp.logit_bias = parse_logit_bias(*v);
  if (const json* v = field(b, "allowed_token_ids")) sp.allowed_token_ids = parse_allowed_token_ids(*v);
  if (const json* v = field(b, "bad_words")) sp.bad_words = parse_bad_words(*v);  // tokenized by the server (http_server.cpp)
  if (const json* v = field(b, "stream")) r.stream = as_bool(*v, "stream");
  if (const json* v = field(b, "stream_options")) {
    if (!v->is_object()) bad_request("stream_options", "stream_options must be an object");
    // As vLLM's validate_stream_options: an empty object passes without stream.
    if (!r.stream && !v->empty()) bad_request("stream_options", "stream_options is only allowed when stream is true");
    if (const json* u = field(*v, "include_usage")) r.include_usage = as_bool(*u, "stream_options.include_usage");
    if (const json* u = field(*v, "continuous_usage_stats"))
      r.continuous_usage_stats = as_bool(*u, "stream_options.continuous_usage_stats");
  }
  if (const json* v = field(b, "truncate_prompt_tokens")) {  // vLLM: an integer >= 1, or -1 (the model's context)
    const long long k = as_int(*v, "truncate_prompt_tokens", -1, std::numeric_limits<int>::max());
    if (k == 0) bad_request("truncate_prompt_tokens", "truncate_prompt_tokens must be an integer >= 1 or -1, got 0");
    r.truncate_prompt_tokens = static_cast<int>(k);
  }
  if (const json* v = field(b, "add_special_tokens")) r.add_special_tokens = as_bool(*v, "add_special_tokens");
  if (const json* v = field(b, "return_tokens_as_token_ids"))
    r.return_tokens_as_token_ids = as_bool(*v, "return_tokens_as_token_ids");
  if (const json* v = field(b, "return_token_ids")) r.return_token_ids = as_bool(*v, "return_token_ids");
  if (const json* v = field(b, "user"); v && !v->is_string())  // OpenAI's end-user id (vLLM: Optional[str]); unused
    bad_request("user", fmt::format("user must be a string (got {})", type_name(*v)));
  if (const json* v = field(b, "cache_salt")) {  // vLLM: a non-empty string
    if (!v->is_string() || v->get_ref<const std::string&>().empty())
      bad_request("cache_salt", "Parameter 'cache_salt' must be a non-empty string if provided.");
    if (v->get_ref<const std::string&>().size() > kMaxCacheSaltBytes)
      bad_request("cache_salt", fmt::format("cache_salt must be at most {} bytes", kMaxCacheSaltBytes));
    r.cache_salt = v->get<std::string>();
  }
  reject_unsupported_features(b, chat);
}

void check_body(const json& b) {
  if (!b.is_object()) bad_request("", "the request body must be a JSON object");
}

}  // namespace

std::map<int, float> parse_logit_bias(const json& v) {
  // {"token id": bias}: ids as decimal strings (OpenAI), biases clamped to [-100, 100] (vLLM).
  if (!v.is_object()) bad_request("logit_bias", fmt::format("logit_bias must be an object (got {})", type_name(v)));
  std::map<int, float> out;
  for (const auto& [key, bias] : v.items()) {
    const bool digits = !key.empty() && key.size() <= 10 && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const long long id = digits ? std::stoll(key) : -1;
    if (!digits || id < 0 || id > std::numeric_limits<int>::max())
      bad_request("logit_bias", fmt::format("logit_bias keys must be token ids (non-negative integers as strings), got '{}'", key));
    out[static_cast<int>(id)] = static_cast<float>(std::clamp(as_number(bias, "logit_bias"), -100.0, 100.0));
  }
  return out;
}

std::vector<int> parse_allowed_token_ids(const json& v) {
  if (!v.is_array()) bad_request("allowed_token_ids", "allowed_token_ids must be a list of integers");
  std::vector<int> ids = as_token_ids(v, "allowed_token_ids");
  if (ids.empty())  // as vLLM: an empty list would allow nothing, not everything
    bad_request("allowed_token_ids", "allowed_token_ids must not be empty (leave it out to allow every token)");
  return ids;
}

std::vector<std::string> parse_bad_words(const json& v) {
  if (!v.is_array()) bad_request("bad_words", fmt::format("bad_words must be a list of strings (got {})", type_name(v)));
  if (v.size() > static_cast<size_t>(kMaxBadWords))
    bad_request("bad_words", fmt::format("at most {} bad words (got {})", kMaxBadWords, v.size()));
  std::vector<std::string> words;
  for (const auto& w : v) {
    if (!w.is_string()) bad_request("bad_words", fmt::format("bad_words must be a list of strings (got an item of type {})", type_name(w)));
    const std::string& s = w.get_ref<const std::string&>();
    if (s.empty()) bad_request("bad_words", "bad_words cannot contain an empty string");
    if (s.size() > kMaxBadWordBytes)
      bad_request("bad_words", fmt::format("each bad word is at most {} bytes (got one of {})", kMaxBadWordBytes, s.size()));
    words.push_back(s);
  }
  return words;
}

nlohmann::ordered_json parse_body(const std::string& body) {
  json j;
  try {
    check_json_depth(body, "the request body");  // before parsing: deep nesting must not exhaust the stack
  } catch (const Error& e) {
    bad_request("", e.what());
  }
  // Before parsing too: an ordered object's parse time grows with the square of its keys.
  std::size_t at = 0;
  if (json_max_object_keys(body, kMaxRequestObjectKeys, &at) > kMaxRequestObjectKeys)
    bad_request("", fmt::format("the request body has an object of more than {} keys (at byte {}); refusing to parse it",
                                kMaxRequestObjectKeys, at));
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad_request("", fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  check_body(j);
  return j;
}

CompletionRequest parse_completion_request(const json& b, int max_logprobs, const GenerationDefaults& defaults) {
  check_body(b);
  CompletionRequest r;
  parse_common(b, r, "max_tokens", /*chat=*/false, defaults);
  r.params.structured_outputs = parse_structured_outputs(b, nullptr, &r.structured_outputs_field);
  if (!r.max_tokens_given && !b.contains("max_tokens")) {  // OpenAI's completions default (vLLM's, whatever the defaults)
    r.params.max_tokens = 16;
    r.max_tokens_defaulted = true;
  }
  const json* p = field(b, "prompt");
  if (!p) bad_request("prompt", "prompt is required");
  auto text_prompt = [&](const json& s) {
    PromptInput in;
    in.text = s.get<std::string>();
    if (in.text.empty()) bad_request("prompt", "the prompt is empty");
    r.prompts.push_back(std::move(in));
  };
  auto id_prompt = [&](const json& a) {
    PromptInput in;
    in.is_tokens = true;
    in.token_ids = as_token_ids(a, "prompt");
    if (in.token_ids.empty()) bad_request("prompt", "the prompt is empty");
    r.prompts.push_back(std::move(in));
  };
  if (p->is_string()) {
    text_prompt(*p);
  } else if (p->is_array()) {
    if (p->empty()) bad_request("prompt", "the prompt is empty");
    const json& first = p->front();
    if (first.is_number()) {
      id_prompt(*p);
    } else {
      if (p->size() > static_cast<size_t>(kMaxPromptsPerRequest))
        bad_request("prompt", fmt::format("at most {} prompts per request", kMaxPromptsPerRequest));
      // One kind per list, as vLLM's (OpenAI's) prompt type: list[str] or list[list[int]], never mixed.
      for (const auto& e : *p) {
        if (e.is_string() && first.is_string()) text_prompt(e);
        else if (e.is_array() && first.is_array()) id_prompt(e);
        else bad_request("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids");
      }
    }
  } else {
    bad_request("prompt", fmt::format("prompt must be a string or a list (got {})", type_name(*p)));
  }
  if (r.prompts.size() * static_cast<size_t>(r.params.n) > static_cast<size_t>(kMaxSequencesPerRequest))
    bad_request("n", fmt::format("{} prompts x n {} = {} sequences, more than the {} one request may ask for", r.prompts.size(),
                                 r.params.n, r.prompts.size() * static_cast<size_t>(r.params.n), kMaxSequencesPerRequest));
  if (const json* v = field(b, "echo")) r.echo = as_bool(*v, "echo");
  if (const json* v = field(b, "logprobs")) r.params.logprobs = as_logprobs(*v, "logprobs", max_logprobs);
  parse_prompt_logprobs(b, r, max_logprobs);
  if (field(b, "suffix")) bad_request("suffix", "suffix is not supported");
  if (r.max_tokens_given && r.params.max_tokens == 0) {  // vLLM: echo the prompt (and its logprobs) only
    if (!r.echo) bad_request("max_tokens", max_tokens_range("max_tokens", 0) + "; 0 is allowed only with echo");
    if (r.stream) bad_request("max_tokens", "max_tokens 0 with echo is not supported with stream");
    if (r.params.min_tokens > 0) bad_request("min_tokens", "min_tokens must be 0 when max_tokens is 0");
    r.prompt_only = true;
    r.params.max_tokens = 1;  // the engine runs the prompt and one token, which the response leaves out
  }
  return r;
}

ChatRequest parse_chat_request(const json& b, int max_logprobs, const GenerationDefaults& defaults) {
  check_body(b);
  ChatRequest r;
  parse_common(b, r, "max_completion_tokens", /*chat=*/true, defaults);
  parse_tools(b, r);
  // Structured outputs; a forced tool choice decodes the calls under vLLM's schema (serving.cpp turns the JSON into
  // tool_calls).
  const bool forced = r.tool_choice == "required" || r.tool_choice == "function";
  r.params.structured_outputs =
      parse_structured_outputs(b, forced ? tool_choice_json_schema(r.tools, r.tool_choice_function) : json(nullptr),
                               &r.structured_outputs_field);
  const json* m = field(b, "messages");
  if (!m || !m->is_array() || m->empty()) bad_request("messages", "messages must be a non-empty list");
  r.messages = json::array();
  for (const auto& msg : *m) {
    if (!msg.is_object()) bad_request("messages", "each message must be an object");
    const json* role = field(msg, "role");
    if (!role || !role->is_string()) bad_request("messages", "each message needs a string role");
    json out = msg;
    // Content: a string, null / missing, or a list of text parts (chat_part_text), kept as given:
    // the chat template gets it joined with newlines or as parts, as its content format wants (content_format.h).
    const json* c = field(msg, "content");
    if (c && c->is_array()) {
      for (const auto& part : *c) {
        if (!chat_part_text(part))
          bad_request("messages", "only text content parts are supported ({\"type\": \"text\", \"text\": ...}, "
                                  "input_text, output_text, refusal, thinking, or a plain string)");
      }
    } else if (c && !c->is_string() && !c->is_null()) {
      bad_request("messages", fmt::format("message content must be a string or a list of parts (got {})", type_name(*c)));
    }
    // vLLM's message types: tool_calls is a list of {"id"?, "type"?, "function": {"name", "arguments"}} (an object or
    // a string there reached the template as no calls). An assistant's tool-call arguments reach the template as an
    // object (as transformers' templates expect), not the JSON text the OpenAI format carries; null or "" is {}.
    if (json* calls = field(msg, "tool_calls") ? &out["tool_calls"] : nullptr) {
      if (!calls->is_array())
        bad_request("messages", fmt::format("a message's tool_calls must be a list (got {})", type_name(*calls)));
      for (auto& call : *calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].contains("name") || !call["function"]["name"].is_string())
          bad_request("messages", "each of a message's tool_calls must be {\"function\": {\"name\": string, \"arguments\": ...}}");
      }
    }
    r.messages.push_back(std::move(out));
  }
  if (const auto bad = parse_tool_call_arguments(r.messages))
    bad_request("messages", fmt::format("a tool call's function.arguments is not valid JSON: {}", *bad));
  if (const json* v = field(b, "add_generation_prompt")) r.add_generation_prompt = as_bool(*v, "add_generation_prompt");
  if (const json* v = field(b, "continue_final_message")) r.continue_final_message = as_bool(*v, "continue_final_message");
  if (r.continue_final_message && r.add_generation_prompt)  // as transformers (via vLLM): the default true too
    bad_request("continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true (add_generation_prompt defaults "
                "to true: send false to continue the final message)");
  if (const json* v = field(b, "chat_template")) {
    if (!v->is_string() || v->get<std::string>().empty())
      bad_request("chat_template", "chat_template must be a non-empty string (Jinja source)");
    r.chat_template = v->get<std::string>();
  }
  if (const json* v = field(b, "chat_template_kwargs")) {
    if (!v->is_object()) bad_request("chat_template_kwargs", "chat_template_kwargs must be an object of template variables");
    r.chat_template_kwargs = *v;
  }
  // vLLM's reasoning_effort: a template variable (over chat_template_kwargs' own), with enable_thinking = (effort !=
  // "none") unless chat_template_kwargs sets enable_thinking (vLLM's build_chat_params).
  if (const json* v = field(b, "reasoning_effort"); v && !v->is_null()) {
    static const char* const kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh", "max"};
    const bool known = v->is_string() && std::any_of(std::begin(kEfforts), std::end(kEfforts),
                                                     [&](const char* e) { return *v == e; });
    if (!known)
      bad_request("reasoning_effort", "reasoning_effort must be one of none, minimal, low, medium, high, xhigh, max");
    if (!r.chat_template_kwargs.is_object()) r.chat_template_kwargs = json::object();
    if (!r.chat_template_kwargs.contains("enable_thinking")) r.chat_template_kwargs["enable_thinking"] = *v != "none";
    r.chat_template_kwargs["reasoning_effort"] = *v;
  }
  if (const json* v = field(b, "documents")) {
    if (!v->is_array()) bad_request("documents", "documents must be a list");
    r.documents = *v;
  }
  if (const json* v = field(b, "logprobs")) r.logprobs = as_bool(*v, "logprobs");
  if (const json* v = field(b, "top_logprobs")) {
    r.top_logprobs = as_logprobs(*v, "top_logprobs", max_logprobs);
    if (!r.logprobs && r.top_logprobs > 0) bad_request("top_logprobs", "top_logprobs needs logprobs = true");
  }
  if (r.logprobs) r.params.logprobs = r.top_logprobs;
  if (const json* v = field(b, "echo")) r.echo = as_bool(*v, "echo");
  if (const json* v = field(b, "include_reasoning")) r.include_reasoning = as_bool(*v, "include_reasoning");
  parse_prompt_logprobs(b, r, max_logprobs);
  return r;
}

}  // namespace ssmserve::server
