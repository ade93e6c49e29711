// Owns the producer of one generation's HTTP response (see generation_producer.h).
#include "server/generation_producer.h"

#include <chrono>
#include <string>
#include <vector>

#include "server/http_responses.h"

namespace ssmserve::server {

using json = nlohmann::ordered_json;

void OpenAIServer::GenerationProducer::produce(ProducerOutput& out) {
  const GenerationJob& j = *job_;
  // An error response in the API's shape (OpenAI's, or the renderer's: Anthropic's for /v1/messages).
  auto error_response = [&j](const ApiError& e) {
    if (!j.renderer) return server::error_response(e);
    HttpResponse r = json_response(j.renderer->error_body(e), e.status);
    if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
    return r;
  };
  // 1. Admission.
  if (!accepted_) {
    const auto decided = j.channel->try_accepted();
    if (!decided) {
      if (srv_.force_stop_) out.head = error_response(ApiError(503, "the server is shutting down; the request was aborted"));
      return;
    }
    if (!decided->empty()) {
      out.head = error_response(ApiError(400, *decided));
      return;
    }
    accepted_ = true;
  }
  std::vector<OutputChannel::Item> items;
  std::string fatal;
  int fatal_status = 500;
  j.channel->pop_all(items, std::chrono::milliseconds(0), &fatal, &fatal_status);
  // 2a. Not streaming: the whole response once every choice finished.
  if (!j.stream) {
    if (rendering_) {  // the body is rendered on a worker (it can be tens of MB: logprobs, echo)
      if (rendered_.load(std::memory_order_acquire)) out.head = std::move(final_);
      return;
    }
    for (auto& it : items) builder_.on_output(it.index, std::move(it.output));
    if (builder_.all_finished()) {
      rendering_ = true;
      srv_.transport_->post_work([self = shared_from_this(), error_response] {
        try {
          HttpResponse r;
          r.content_type = "application/json";
          const GenerationJob& job = *self->job_;
          r.body = job.renderer ? dump(job.renderer->whole(self->builder_.final_response())) : self->builder_.final_body();
          self->final_ = std::move(r);
        } catch (const std::exception& e) {
          self->final_ = error_response(ApiError(500, e.what()));
        }
        self->rendered_.store(true, std::memory_order_release);
        self->ex_->wake();
      });
    } else if (!fatal.empty()) out.head = error_response(ApiError(fatal_status, fatal));
    else if (srv_.force_stop_) out.head = error_response(ApiError(503, "the server is shutting down; the request was aborted"));
    return;
  }
  // 2b. Streaming: SSE events. vLLM's continuous_usage_stats: every chunk carries its choice's usage so far (its
  // prompt's tokens and the choice's generated tokens, not the request's totals).
  auto event = [&](json c) {
    if (j.continuous_usage) {
      const json* choices = c.contains("choices") ? &c["choices"] : nullptr;
      c["usage"] = choices && choices->is_array() && choices->size() == 1 && (*choices)[0].contains("index")
                       ? builder_.choice_usage((*choices)[0]["index"].get<int>())
                       : builder_.usage();
    }
    out.data += sse(c);
  };
  if (j.renderer) {  // /v1/responses, /v1/messages: that API's stream events from the chat chunks
    ChatRenderer& rs = *j.renderer;
    if (!opened_) {
      HttpResponse head;
      head.content_type = "text/event-stream; charset=utf-8";
      head.headers.emplace_back("Cache-Control", "no-cache");
      out.head = std::move(head);
      out.stream = true;
      out.data += rs.open(builder_.usage());
      for (const auto& c : builder_.opening_chunks()) out.data += rs.on_chunk(c);
      opened_ = true;
    }
    for (auto& it : items)
      for (const auto& c : builder_.on_output(it.index, std::move(it.output))) out.data += rs.on_chunk(c);
    if (builder_.all_finished()) {
      out.data += rs.finish(builder_.usage());
      out.done = true;
    } else if (!fatal.empty() || srv_.force_stop_) {
      out.data += rs.error(fatal.empty() ? ApiError(503, "the server is shutting down; the request was aborted")
                                         : ApiError(fatal_status, fatal));
      out.done = true;
    }
    return;
  }
  if (!opened_) {
    HttpResponse head;
    head.content_type = "text/event-stream; charset=utf-8";  // as vLLM (Starlette): clients decode the text as UTF-8
    head.headers.emplace_back("Cache-Control", "no-cache");
    out.head = std::move(head);
    out.stream = true;
    for (const auto& c : builder_.opening_chunks()) event(c);
    opened_ = true;
  }
  for (auto& it : items)
    for (const auto& c : builder_.on_output(it.index, std::move(it.output))) event(c);
  if (builder_.all_finished()) {
    if (j.include_usage) out.data += sse(builder_.usage_chunk());
    out.data += "data: [DONE]\n\n";
    out.done = true;
  } else if (!fatal.empty() || srv_.force_stop_) {
    const ApiError e = fatal.empty() ? ApiError(503, "the server is shutting down; the request was aborted")
                                     : ApiError(fatal_status, fatal);
    out.data += sse(e.body()) + "data: [DONE]\n\n";
    out.done = true;
  }
}

void OpenAIServer::GenerationProducer::close(bool) {
  if (!builder_.all_finished()) srv_.engine_.abort(job_->request_ids);
  --*inflight_;
}

}  // namespace ssmserve::server
