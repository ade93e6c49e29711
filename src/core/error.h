// Owns ssmserve's error type and the check macro every component uses to reject bad input with a clear message.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ssmserve {

/// The one exception type ssmserve throws for bad input (checkpoint, config, request, prompt) or a failed
/// resource (file, memory). `what()` names what is wrong and where (file, tensor, field). The CLI turns it
/// into a message on stderr and exit code 1.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

/// Throws ssmserve::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ssmserve

/// SSM_CHECK(cond, "fmt {}", args...): throws ssmserve::Error with the message when cond is false.
#define SSM_CHECK(cond, ...)                 \
  do {                                       \
    if (!(cond)) ::ssmserve::fail(__VA_ARGS__); \
  } while (0)
