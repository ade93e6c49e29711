// Fuzz target for everything a client's request body reaches before the engine: JSON parsing (with the depth
// pre-scan), the OpenAI completions / chat / Responses parsers, Anthropic's Messages parser, and chat-template rendering of the client's messages.
// Built with libFuzzer (clang -fsanitize=fuzzer) or, without clang, with standalone_driver.cpp.
// Any ApiError / Error is an accepted outcome; a crash, sanitizer report, or other exception is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "server/api_error.h"
#include "chat/jinja.h"
#include "server/protocol.h"
#include "server/messages_api.h"
#include "server/responses_api.h"

namespace {

const ssmserve::server::jinja::Template& chat_template() {
  // The plain default template and a ChatML-like one exercising string operators, loops and filters.
  static const ssmserve::server::jinja::Template t(
      "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<sys>{% endif %}"
      "{{ '<|im_start|>' + m['role'] | trim + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ messages | length }}{{ messages[-1] | tojson }}{% endif %}");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ssmserve::server;
  const std::string body(reinterpret_cast<const char*>(data), size);
  try {
    const auto j = parse_body(body);
    try {
      (void)parse_completion_request(j);
    } catch (const ApiError&) {
    }
    try {  // a /v1/responses body, and the chat request it becomes
      (void)parse_chat_request(responses_to_chat_request(j).chat);
    } catch (const ApiError& e) {
      if (e.status != 400 && e.status != 404) __builtin_trap();
    } catch (const ssmserve::Error&) {
    }
    try {  // a /v1/messages body, and the chat request it becomes
      (void)parse_chat_request(messages_to_chat_request(j));
    } catch (const ApiError& e) {
      if (e.status != 400 && e.status != 404) __builtin_trap();
    } catch (const ssmserve::Error&) {
    }
    const ChatRequest chat = parse_chat_request(j);
    nlohmann::ordered_json ctx = {{"messages", chat.messages}, {"add_generation_prompt", chat.add_generation_prompt}};
    (void)chat_template().render(ctx);
  } catch (const ApiError& e) {
    if (e.status != 400 && e.status != 404) __builtin_trap();  // the parsers answer 400 / 404 only
  } catch (const ssmserve::Error&) {
  }
  return 0;
}
