// Owns respell_engine_options (see engine_options.h).
#include "engine/engine_options.h"

namespace ssmserve {
namespace {

/// A character a flag's name may contain: a flag ends where none follows.
bool flag_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

std::string respell_engine_options(std::string_view message,
                                   const std::function<std::string(const EngineOptionName&)>& spell) {
  std::string out;
  out.reserve(message.size());
  char quote = 0;  // the open quote (` or "), 0 outside quotes
  size_t i = 0;
  while (i < message.size()) {
    const char c = message[i];
    if (quote != 0) {
      if (c == quote) quote = 0;
      out += c;
      ++i;
      continue;
    }
    if (c == '`' || c == '"') {
      quote = c;
      out += c;
      ++i;
      continue;
    }
    if (c == '-' && i + 2 < message.size() && message[i + 1] == '-' && (i == 0 || !flag_char(message[i - 1]))) {
      size_t end = i + 2;
      while (end < message.size() && flag_char(message[end])) ++end;
      const std::string_view word = message.substr(i, end - i);
      const EngineOptionName* hit = nullptr;
      for (const EngineOptionName& o : kEngineOptionNames)
        if (o.flag == word) hit = &o;
      if (hit != nullptr) {
        out += spell(*hit);
        i = end;
        continue;
      }
      out.append(word);
      i = end;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

}  // namespace ssmserve
