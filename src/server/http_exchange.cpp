// Owns a Connection's exchange (see http_connection.h): handing a complete request to a worker through an Exchange
// (ExchangeImpl posts the handler's answer back to the connection's strand), then writing the answer: a whole
// response, or a Producer's output pulled only when the previous write finished (chunked for HTTP/1.1,
// close-delimited for 1.0); the keep-alive or close decision, the refusals the transport answers itself, and the
// graceful and lingering closes after a response.
#include "server/http_connection.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ssmserve::server {

namespace {

std::string reason(int status) {
  const auto r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r.empty() || r == "<unknown-status>" ? std::string("Unknown") : std::string(r);
}

/// The handle a handler answers through; posts everything to the connection's strand.
class ExchangeImpl final : public Exchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(std::weak_ptr<Connection> c, net::any_io_executor ex, HttpRequest req)
      : conn_(std::move(c)), ex_(std::move(ex)), req_(std::move(req)) {}
  const HttpRequest& request() const override { return req_; }
  void respond(HttpResponse r) override {
    net::post(ex_, [c = conn_, r = std::move(r)]() mutable {
      if (auto conn = c.lock()) conn->on_respond(std::move(r));
    });
  }
  void respond_later(std::shared_ptr<Producer> p) override {
    net::post(ex_, [c = conn_, p = std::move(p)]() mutable {
      if (auto conn = c.lock()) conn->on_respond_later(std::move(p));
      else p->close(false);
    });
  }
  void wake() override {
    if (wake_posted_.exchange(true)) return;  // one pending wake is enough
    net::post(ex_, [self = shared_from_this()]() {
      self->wake_posted_ = false;
      if (auto conn = self->conn_.lock()) conn->on_wake();
    });
  }

 private:
  std::weak_ptr<Connection> conn_;
  net::any_io_executor ex_;
  HttpRequest req_;
  std::atomic<bool> wake_posted_{false};
};

}  // namespace

void Connection::on_respond(HttpResponse r) {
  if (closed_ || producer_ || !exchanging_) return;
  write_whole(std::move(r));
}

void Connection::on_respond_later(std::shared_ptr<Producer> p) {
  if (closed_ || !exchanging_) {
    p->close(false);
    return;
  }
  producer_ = std::move(p);
  pump();
}

void Connection::on_wake() {
  if (producer_) pump();
}

// 4. Hand the request to a worker; watch the client meanwhile (start_tick).
void Connection::dispatch() {
  ++served_;
  exchanging_ = true;
  start_tick();
  auto ex = std::make_shared<ExchangeImpl>(weak_from_this(), sock_.get_executor(), std::move(req_));
  req_ = HttpRequest{};
  req_.version = ex->request().version;
  req_.method = ex->request().method;
  req_.target = ex->request().target;  // for the access line
  t_.workers->post([&t = t_, ex] {
    try {
      t.handler(ex);
    } catch (const std::exception& e) {
      ex->respond(t.error_body(500, e.what()));
    }
  });
}

// 5. Responses.
std::string Connection::serialize_head(const HttpResponse& r, bool stream, size_t content_length) {
  if (t_.limits.access_log && spdlog::should_log(spdlog::level::info)) {
    boost::system::error_code ec;
    const auto peer = sock_.remote_endpoint(ec);
    const std::string who = ec ? std::string("-") : fmt::format("{}:{}", peer.address().to_string(), peer.port());
    // The target as sent (its first 2 KB), with control bytes, '"', '\\' and non-ASCII bytes percent-encoded as
    // uvicorn's line does: the line stays one valid UTF-8 line with one quoted field.
    std::string target;
    for (const char c : std::string_view(req_.target).substr(0, 2048)) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x21 || u >= 0x7f || c == '"' || c == '\\') target += fmt::format("%{:02X}", u);
      else target += c;
    }
    spdlog::info("{} - \"{} {} HTTP/{}.{}\" {} {}", who, req_.method.empty() ? "-" : req_.method,
                 target.empty() ? "-" : target, req_.version / 10, req_.version % 10, r.status, reason(r.status));
  }
  std::string s = fmt::format("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
  if (!r.content_type.empty()) s += "Content-Type: " + r.content_type + "\r\n";
  for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
  for (const auto& [k, v] : response_headers_) s += k + ": " + v + "\r\n";
  if (!stream) s += fmt::format("Content-Length: {}\r\n", content_length);
  else if (chunked_) s += "Transfer-Encoding: chunked\r\n";
  if (closing_) s += "Connection: close\r\n";
  else if (req_.version < 11) s += "Connection: keep-alive\r\n";
  s += "\r\n";
  return s;
}

void Connection::decide_closing(const HttpResponse& r, bool stream) {
  closing_ = r.close || !keep_alive_ || t_.draining || served_ >= t_.limits.max_requests_per_connection ||
             (stream && req_.version < 11);  // HTTP/1.0 has no chunked encoding: the body ends with the connection
  chunked_ = stream && req_.version >= 11;
}

void Connection::write_whole(HttpResponse r) {
  decide_closing(r, false);
  wbuf_ = serialize_head(r, false, r.body.size());
  if (req_.method != "HEAD") wbuf_ += r.body;
  linger_ = r.close;
  write(/*last=*/true);
}

void Connection::pump() {
  if (closed_ || !producer_) return;
  if (writing_) {
    wake_pending_ = true;
    return;
  }
  wake_pending_ = false;
  ProducerOutput out;
  try {
    producer_->produce(out);
  } catch (const std::exception& e) {
    spdlog::error("response producer failed: {}", e.what());
    if (head_sent_) return close();
    auto p = std::move(producer_);
    p->close(false);
    return write_whole(t_.error_body(500, e.what()));
  }
  std::string w;
  bool last = false;
  if (out.head && !head_sent_) {
    head_sent_ = true;
    if (!out.stream) {
      auto p = std::move(producer_);
      p->close(true);  // its work is done; the bytes are the connection's now
      return write_whole(std::move(*out.head));
    }
    decide_closing(*out.head, true);
    w = serialize_head(*out.head, true, 0);
  }
  if (!head_sent_) return;  // nothing yet
  if (!out.data.empty()) w += chunked_ ? fmt::format("{:x}\r\n", out.data.size()) + out.data + "\r\n" : out.data;
  if (out.done) {
    if (chunked_) w += "0\r\n\r\n";
    last = true;
  }
  if (w.empty()) return;
  wbuf_ = std::move(w);
  write(last);
}

void Connection::write(bool last) {
  // Most writes fit in the socket's buffer: write at once (no event-loop round trip), and wait only for the rest.
  beast::error_code ec;
  size_t n = 0;
  sock_.non_blocking(true, ec);
  if (!ec) n = sock_.write_some(net::buffer(wbuf_), ec);
  if (ec == net::error::would_block || ec == net::error::try_again) ec = {};
  if (ec) return close();
  if (n == wbuf_.size()) return after_write(last);
  wbuf_.erase(0, n);
  writing_ = true;
  write_started_ = Clock::now();
  start_tick();  // enforces the write deadline
  net::async_write(sock_, net::buffer(wbuf_), [self = shared_from_this(), last](beast::error_code ec, size_t) {
    self->writing_ = false;
    if (self->closed_) return;
    if (ec) return self->close();  // the client went away, or stopped reading past the write timeout
    self->after_write(last);
  });
}

void Connection::after_write(bool last) {
  wbuf_.clear();
  if (wbuf_.capacity() > (64u << 10)) wbuf_.shrink_to_fit();
  if (!last) {
    if (wake_pending_) pump();
    return;
  }
  end_exchange();
}

void Connection::end_exchange() {
  if (producer_) {
    auto p = std::move(producer_);
    p->close(true);
  }
  exchanging_ = false;
  head_sent_ = false;
  if (closing_) return linger_ ? linger_close() : graceful_close();
  wait_request();
}

/// Answers a request the transport refuses itself, then closes (the stream position is unknown).
void Connection::fail_request(int status, const std::string& message) {
  HttpResponse r = t_.error_body(status, message);
  r.close = true;
  exchanging_ = true;
  keep_alive_ = false;
  if (req_.version == 0) req_.version = 11;
  write_whole(std::move(r));
}

/// Closes after the client read the response: stop sending, then close.
void Connection::graceful_close() {
  beast::error_code ec;
  sock_.shutdown(tcp::socket::shutdown_send, ec);
  close();
}

/// Lingering close: the client may still be sending the body we refused; closing with unread input would reset
/// the connection and could destroy the response before the client reads it. Drain for up to 2 s / 64 MiB.
void Connection::linger_close() {
  beast::error_code ec;
  sock_.shutdown(tcp::socket::shutdown_send, ec);
  lingering_ = true;
  arm(2.0);
  drain_some();
}

void Connection::drain_some() {
  if (!scratch_) scratch_ = std::make_unique<char[]>(65536);
  sock_.async_read_some(net::buffer(scratch_.get(), 65536), [self = shared_from_this()](beast::error_code ec, size_t n) {
    self->drained_ += n;
    if (ec || self->closed_ || self->drained_ > (64u << 20)) return self->close();
    self->drain_some();
  });
}

}  // namespace ssmserve::server
