// Owns the producer of one generation's HTTP response (OpenAIServer::GenerationProducer): the whole JSON once every
// choice finished, or the SSE stream, written on the connection's I/O thread as the engine's outputs arrive.
#pragma once
#include <atomic>
#include <memory>
#include <utility>

#include "server/http_server.h"
#include "server/http_transport.h"
#include "server/serving.h"

namespace ssmserve::server {

/// Produces a generation's response on the connection's I/O thread as the engine's outputs arrive: the whole JSON
/// once every choice finished (non-streaming: the status is the real outcome), or SSE chunks (streaming). Asked
/// again only when the previous write finished, so a client that does not read leaves its outputs coalescing in
/// the channel (bounded by --max-pending-output-bytes). Closing before the end aborts the engine requests.
class OpenAIServer::GenerationProducer final : public Producer, public std::enable_shared_from_this<GenerationProducer> {
 public:
  GenerationProducer(OpenAIServer& srv, std::shared_ptr<Exchange> ex, std::shared_ptr<GenerationJob> job,
                     std::shared_ptr<std::atomic<int>> inflight)
      : srv_(srv), ex_(std::move(ex)), job_(job), builder_(std::move(job)), inflight_(std::move(inflight)) {}

  /// One turn of the response (admission, then the body or the next SSE events); see http_transport.h's Producer.
  void produce(ProducerOutput& out) override;
  /// The response ended (sent, or the client went away): aborts the engine requests of unfinished choices.
  void close(bool) override;

 private:
  OpenAIServer& srv_;
  std::shared_ptr<Exchange> ex_;  // kept alive for the channel's wake-ups (they hold it weakly)
  std::shared_ptr<GenerationJob> job_;
  ResponseBuilder builder_;
  std::shared_ptr<std::atomic<int>> inflight_;
  bool accepted_ = false, opened_ = false, rendering_ = false;
  std::atomic<bool> rendered_{false};
  HttpResponse final_;  // written by the worker before rendered_ is set
};

}  // namespace ssmserve::server
