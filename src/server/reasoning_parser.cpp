// Owns the reasoning parser of the chat endpoint (see reasoning_parser.h).
#include "server/reasoning_parser.h"

#include <algorithm>

#include "core/error.h"

namespace ssmserve::server {

PromptReasoning prompt_reasoning(std::string_view prompt, const ReasoningFormat& format) {
  const size_t start = format.start.empty() ? std::string_view::npos : prompt.rfind(format.start);
  const size_t end = format.end.empty() ? std::string_view::npos : prompt.rfind(format.end);
  if (start == std::string_view::npos && end == std::string_view::npos) return PromptReasoning::None;
  if (end == std::string_view::npos) return PromptReasoning::Open;
  if (start == std::string_view::npos) return PromptReasoning::Closed;
  return start > end ? PromptReasoning::Open : PromptReasoning::Closed;
}

PromptReasoning prompt_reasoning(std::span<const int> prompt_token_ids, int start_id, int end_id) {
  for (size_t i = prompt_token_ids.size(); i-- > 0;) {
    if (prompt_token_ids[i] == end_id) return PromptReasoning::Closed;
    if (prompt_token_ids[i] == start_id) return PromptReasoning::Open;
  }
  return PromptReasoning::None;
}

ReasoningParser::ReasoningParser(const ReasoningFormat& format, PromptReasoning prompt)
    : start_(format.start), end_(format.end) {
  SSM_CHECK(!start_.empty() && !end_.empty(), "reasoning format {}: empty marker", format.name);
  switch (prompt) {
    case PromptReasoning::Open: state_ = State::Reasoning; break;
    case PromptReasoning::Closed: state_ = State::Content; break;
    case PromptReasoning::None: state_ = format.starts_in_reasoning ? State::Reasoning : State::Before; break;
  }
}

ReasoningSplit ReasoningParser::extract(std::string_view text) const {
  ReasoningParser p = *this;
  p.held_.clear();
  ReasoningDelta d = p.feed(text, true);
  ReasoningSplit out;
  if (!d.reasoning.empty()) out.reasoning = std::move(d.reasoning);
  if (!d.content.empty()) out.content = std::move(d.content);
  return out;
}

ReasoningDelta ReasoningParser::feed(std::string_view piece, bool final) {
  ReasoningDelta out;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  auto emit = [&](std::string_view text) {
    if (text.empty()) return;
    (state_ == State::Reasoning ? out.reasoning : out.content).append(text);
  };
  // 1. Every whole marker: the text before it goes to the current part; the marker moves the state and is dropped.
  size_t at = 0;
  while (at < buf.size()) {
    const size_t s = buf.find(start_, at), e = buf.find(end_, at);
    if (s == std::string::npos && e == std::string::npos) break;
    // The earlier marker; at the same position (one a prefix of the other) the longer one.
    const bool is_start =
        e == std::string::npos || (s != std::string::npos && (s < e || (s == e && start_.size() > end_.size())));
    const size_t pos = is_start ? s : e;
    emit(std::string_view(buf).substr(at, pos - at));
    if (is_start) {
      if (state_ == State::Before) state_ = State::Reasoning;  // in the reasoning or the content: dropped
    } else {
      state_ = State::Content;  // ends the reasoning (before one began or after it: a stray marker, dropped)
    }
    at = pos + (is_start ? start_.size() : end_.size());
  }
  // 2. The rest, less a tail that may begin a marker (held for the next piece unless this is the last one).
  size_t keep = 0;
  if (!final) {
    const size_t longest = std::min(buf.size() - at, std::max(start_.size(), end_.size()) - 1);
    for (size_t n = longest; n > 0 && keep == 0; --n) {
      const std::string_view tail = std::string_view(buf).substr(buf.size() - n);
      const auto begins = [&](const std::string& marker) { return n < marker.size() && marker.compare(0, n, tail) == 0; };
      if (begins(start_) || begins(end_)) keep = n;
    }
  }
  emit(std::string_view(buf).substr(at, buf.size() - at - keep));
  held_ = buf.substr(buf.size() - keep);
  return out;
}

}  // namespace ssmserve::server
