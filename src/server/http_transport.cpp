// Owns the Boost.Beast / Asio transport (see http_transport.h): the acceptor, one Connection state machine per
// socket (each on its own strand), the worker pool, and response framing.
#include "server/http_transport.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdint>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "server/worker_pool.h"

namespace ssmserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::clamp(s, 0.0, 1e7)));
}

/// A Content-Length value: 1-19 ASCII digits (no sign, spaces or lists), else nullopt.
std::optional<unsigned long long> parse_content_length(std::string_view v) {
  if (v.empty() || v.size() > 19) return std::nullopt;
  unsigned long long x = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    x = x * 10 + static_cast<unsigned>(c - '0');
  }
  return x;
}

std::string reason(int status) {
  const auto r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r.empty() || r == "<unknown-status>" ? std::string("Unknown") : std::string(r);
}

}  // namespace

std::optional<std::string> HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return v;
  return std::nullopt;
}

size_t HttpRequest::header_count(std::string_view name) const {
  size_t n = 0;
  for (const auto& [k, v] : headers) n += iequals(k, name);
  return n;
}

class Connection;

struct HttpTransport::Impl {
  HttpLimits limits;
  Precheck precheck;
  Handler handler;
  ErrorBody error_body;
  net::io_context ioc;
  tcp::acceptor acceptor{net::make_strand(ioc)};
  std::optional<WorkerPool> workers;
  std::atomic<int> num_connections{0};
  std::atomic<bool> draining{false};
  std::atomic<bool> stopped{false};
  std::mutex conns_mu;
  std::vector<std::weak_ptr<Connection>> conns;  // for stop(): closed on their strands
  net::steady_timer accept_retry{acceptor.get_executor()};
  net::steady_timer stop_timer{acceptor.get_executor()};

  void accept();
  void on_accept(beast::error_code ec, tcp::socket sock);
};

/// One client connection: reads a request (header deadline, body deadline), hands it to the worker pool, writes the
/// response (whole, or pulled from a Producer when the socket can take more), then reads the next (pipelined
/// bytes stay in the buffer) or closes. All members are touched on the connection's strand only.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpTransport::Impl& t, tcp::socket sock)
      : t_(t), sock_(std::move(sock)), timer_(sock_.get_executor()), tick_(sock_.get_executor()),
        buf_(t.limits.max_header_bytes + (64u << 10)) {
    ++t_.num_connections;
  }
  ~Connection() {
    if (producer_) producer_->close(false);
    --t_.num_connections;
  }

  void start() {
    beast::error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);
    wait_request();
  }
  /// Thread-safe: closes the connection on its strand (server stop).
  void close_from_outside() {
    net::post(sock_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // Exchange side (on the strand).
  void on_respond(HttpResponse r) {
    if (closed_ || producer_ || !exchanging_) return;
    write_whole(std::move(r));
  }
  void on_respond_later(std::shared_ptr<Producer> p) {
    if (closed_ || !exchanging_) {
      p->close(false);
      return;
    }
    producer_ = std::move(p);
    pump();
  }
  void on_wake() {
    if (producer_) pump();
  }
  net::any_io_executor executor() { return sock_.get_executor(); }

 private:
  // 1. Wait for a request's first byte within the keep-alive timeout.
  void wait_request() {
    if (closed_) return;
    if (served_ >= t_.limits.max_requests_per_connection) return close();
    if (buf_.size() > 0) return read_header();
    buf_.shrink_to_fit();  // idle connections hold no buffer
    arm(t_.limits.keep_alive_timeout_s);
    sock_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->timer_.cancel();
      ++self->timer_gen_;
      if (ec || self->closed_) return self->close();
      self->read_header();
    });
  }

  // 2. Read the request line and headers (header deadline), check framing, then the body (read deadline).
  void read_header() {
    request_start_ = Clock::now();
    hparser_.emplace();
    hparser_->header_limit(static_cast<std::uint32_t>(t_.limits.max_header_bytes));
    hparser_->body_limit(t_.limits.max_body_bytes);
    arm(std::min(t_.limits.header_timeout_s, t_.limits.read_timeout_s));
    http::async_read_header(sock_, buf_, *hparser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->timer_.cancel();
      ++self->timer_gen_;
      self->on_header(ec);
    });
  }

  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (timed_out_) return fail_request(408, "the request was not received in time");
    if (ec) {
      if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
          ec == net::error::operation_aborted)
        return close();
      if (ec == http::error::header_limit || ec == http::error::buffer_overflow)
        return fail_request(431, "the request headers are too large");
      if (ec == http::error::body_limit) return fail_request(413, "the request body is too large");
      if (ec == http::error::bad_content_length) return fail_request(400, "invalid or repeated Content-Length");
      if (ec == http::error::bad_transfer_encoding)
        return fail_request(400, "invalid Transfer-Encoding (or both Transfer-Encoding and Content-Length)");
      return fail_request(400, "malformed HTTP request");
    }
    const auto& h = hparser_->get();
    req_ = HttpRequest{};
    req_.method = std::string(h.method_string());
    req_.target = std::string(h.target());
    req_.version = h.version();
    for (const auto& f : h) req_.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
    std::string_view path = req_.target;
    if (path.rfind("http://", 0) == 0 || path.rfind("https://", 0) == 0) {  // absolute form
      const size_t slash = path.find('/', path.find("//") + 2);
      path = slash == std::string_view::npos ? std::string_view("/") : path.substr(slash);
    }
    req_.path = std::string(path.substr(0, path.find('?')));
    keep_alive_ = hparser_->keep_alive();
    // Message framing (RFC 9112 6.3): both, several or malformed lengths are a smuggling vector; refuse them.
    const size_t n_te = req_.header_count("Transfer-Encoding"), n_cl = req_.header_count("Content-Length");
    if (n_te > 0 && n_cl > 0) return fail_request(400, "a request must not have both Transfer-Encoding and Content-Length");
    if (n_te > 1 || (n_te == 1 && !iequals(*req_.header("Transfer-Encoding"), "chunked")))
      return fail_request(400, "only Transfer-Encoding: chunked is supported");
    if (n_cl > 1) return fail_request(400, "a request must not have several Content-Length headers");
    if (n_cl == 1) {
      const auto len = parse_content_length(*req_.header("Content-Length"));
      if (!len) return fail_request(400, fmt::format("invalid Content-Length '{}'", *req_.header("Content-Length")));
      if (*len > t_.limits.max_body_bytes)
        return fail_request(413, fmt::format("the request body has {} bytes; the limit is {} bytes", *len,
                                             t_.limits.max_body_bytes));
    }
    if (req_.version >= 11 && req_.header_count("Host") != 1)
      return fail_request(400, "an HTTP/1.1 request needs exactly one Host header");
    if (t_.precheck) {
      std::optional<HttpResponse> refused;
      try {
        refused = t_.precheck(req_);
      } catch (const std::exception& e) {
        refused = t_.error_body(500, e.what());
      }
      if (refused) {
        if (!hparser_->is_done()) refused->close = true;  // its body stays unread
        exchanging_ = true;
        return write_whole(std::move(*refused));
      }
    }
    if (hparser_->is_done()) return dispatch();
    // 3. The body: "Expect: 100-continue" clients wait for a go-ahead first.
    if (req_.version >= 11 && iequals(req_.header("Expect").value_or(""), "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      beast::error_code ec;
      net::write(sock_, net::buffer(kContinue.data(), kContinue.size()), ec);  // 25 bytes: fits an empty socket buffer
      if (ec) return close();
    }
    read_body();
  }

  void read_body() {
    bparser_.emplace(std::move(*hparser_));
    hparser_.reset();
    bparser_->body_limit(t_.limits.max_body_bytes);
    const auto left = std::chrono::duration<double>(request_start_ + seconds(t_.limits.read_timeout_s) - Clock::now()).count();
    arm(std::max(0.0, left));
    http::async_read(sock_, buf_, *bparser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->timer_.cancel();
      ++self->timer_gen_;
      self->on_body(ec);
    });
  }

  void on_body(beast::error_code ec) {
    if (closed_) return;
    if (timed_out_) return fail_request(408, "the request body was not received in time");
    if (ec) {
      if (ec == http::error::body_limit || ec == http::error::buffer_overflow)
        return fail_request(413, fmt::format("the request body is larger than the limit of {} bytes", t_.limits.max_body_bytes));
      if (ec == http::error::partial_message || ec == net::error::eof || ec == net::error::connection_reset ||
          ec == http::error::end_of_stream || ec == net::error::operation_aborted)
        return close();
      return fail_request(400, "the request body could not be read (malformed chunked encoding)");
    }
    req_.body = std::move(bparser_->get().body());
    bparser_.reset();
    dispatch();
  }

  // 4. Hand the request to a worker; watch the client meanwhile.
  void dispatch();

  /// While a request is handled (or a response written): every 200 ms, checks the client is still there and the
  /// write deadline, and lets the producer see server-wide changes (shutdown).
  void start_tick() {
    if (tick_running_ || closed_) return;
    tick_running_ = true;
    tick_.expires_after(std::chrono::milliseconds(200));
    tick_.async_wait([self = shared_from_this()](beast::error_code ec) {
      self->tick_running_ = false;
      if (ec || self->closed_ || !self->exchanging_) return;
      if (self->writing_ && Clock::now() - self->write_started_ > seconds(self->t_.limits.write_timeout_s)) {
        spdlog::debug("a client read nothing for {} s; closing", self->t_.limits.write_timeout_s);
        return self->close();
      }
      if (!self->writing_ && self->peer_closed()) {
        spdlog::debug("client went away during its request; closing");
        return self->close();
      }
      if (self->producer_ && !self->writing_) self->pump();
      if (!self->closed_ && self->exchanging_) self->start_tick();
    });
  }

  /// True when the client has gone (closed or half-closed its side, reset, or the socket failed). Pending bytes
  /// of a next pipelined request do not count.
  bool peer_closed() {
    pollfd p{sock_.native_handle(), static_cast<short>(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    if (!(p.revents & POLLIN)) return false;
    char c;
    const ssize_t n = ::recv(sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }

  // 5. Responses.
  std::string serialize_head(const HttpResponse& r, bool stream, size_t content_length) {
    std::string s = fmt::format("HTTP/1.1 {} {}\r\n", r.status, reason(r.status));
    if (!r.content_type.empty()) s += "Content-Type: " + r.content_type + "\r\n";
    for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
    if (!stream) s += fmt::format("Content-Length: {}\r\n", content_length);
    else if (chunked_) s += "Transfer-Encoding: chunked\r\n";
    if (closing_) s += "Connection: close\r\n";
    else if (req_.version < 11) s += "Connection: keep-alive\r\n";
    s += "\r\n";
    return s;
  }

  void decide_closing(const HttpResponse& r, bool stream) {
    closing_ = r.close || !keep_alive_ || t_.draining || served_ >= t_.limits.max_requests_per_connection ||
               (stream && req_.version < 11);  // HTTP/1.0 has no chunked encoding: the body ends with the connection
    chunked_ = stream && req_.version >= 11;
  }

  void write_whole(HttpResponse r) {
    decide_closing(r, false);
    wbuf_ = serialize_head(r, false, r.body.size());
    if (req_.method != "HEAD") wbuf_ += r.body;
    linger_ = r.close;
    write(/*last=*/true);
  }

  void pump() {
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

  void write(bool last) {
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

  void after_write(bool last) {
    wbuf_.clear();
    if (wbuf_.capacity() > (64u << 10)) wbuf_.shrink_to_fit();
    if (!last) {
      if (wake_pending_) pump();
      return;
    }
    end_exchange();
  }

  void end_exchange() {
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
  void fail_request(int status, const std::string& message) {
    HttpResponse r = t_.error_body(status, message);
    r.close = true;
    exchanging_ = true;
    keep_alive_ = false;
    if (req_.version == 0) req_.version = 11;
    write_whole(std::move(r));
  }

  /// Closes after the client read the response: stop sending, then close.
  void graceful_close() {
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    close();
  }

  /// Lingering close: the client may still be sending the body we refused; closing with unread input would reset
  /// the connection and could destroy the response before the client reads it. Drain for up to 2 s / 64 MiB.
  void linger_close() {
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    lingering_ = true;
    arm(2.0);
    drain_some();
  }
  void drain_some() {
    if (!scratch_) scratch_ = std::make_unique<char[]>(65536);
    sock_.async_read_some(net::buffer(scratch_.get(), 65536), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (ec || self->closed_ || self->drained_ > (64u << 20)) return self->close();
      self->drain_some();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    exchanging_ = false;
    timer_.cancel();
    tick_.cancel();
    if (producer_) {
      auto p = std::move(producer_);
      p->close(false);
    }
    beast::error_code ec;
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
  }

  /// Starts the phase deadline: on expiry pending socket operations are cancelled and timed_out_ is set.
  void arm(double s) {
    timed_out_ = false;
    const uint64_t gen = ++timer_gen_;  // a deadline that expired as its phase ended must not hit the next phase
    timer_.expires_after(seconds(s));
    timer_.async_wait([w = weak_from_this(), gen](beast::error_code ec) {
      auto self = w.lock();
      if (ec || !self || self->closed_ || gen != self->timer_gen_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      if (self->lingering_) return self->close();
      self->sock_.cancel(ignored);
    });
  }

  HttpTransport::Impl& t_;
  tcp::socket sock_;
  net::steady_timer timer_;  // the current phase's deadline
  net::steady_timer tick_;   // while a request is handled: disconnect watch, producer poll
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::empty_body>> hparser_;
  std::optional<http::request_parser<http::string_body>> bparser_;
  HttpRequest req_;
  Clock::time_point request_start_, write_started_;
  std::shared_ptr<Producer> producer_;
  std::string wbuf_;
  std::unique_ptr<char[]> scratch_;
  size_t drained_ = 0;
  uint64_t timer_gen_ = 0;
  int served_ = 0;
  bool keep_alive_ = true, closing_ = false, chunked_ = false, linger_ = false, lingering_ = false;
  bool exchanging_ = false, head_sent_ = false, writing_ = false, wake_pending_ = false;
  bool timed_out_ = false, closed_ = false, tick_running_ = false;
};

namespace {

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

void Connection::dispatch() {
  ++served_;
  exchanging_ = true;
  start_tick();
  auto ex = std::make_shared<ExchangeImpl>(weak_from_this(), sock_.get_executor(), std::move(req_));
  req_ = HttpRequest{};
  req_.version = ex->request().version;
  req_.method = ex->request().method;
  t_.workers->post([&t = t_, ex] {
    try {
      t.handler(ex);
    } catch (const std::exception& e) {
      ex->respond(t.error_body(500, e.what()));
    }
  });
}

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) { on_accept(ec, std::move(sock)); });
}

void HttpTransport::Impl::on_accept(beast::error_code ec, tcp::socket sock) {
  if (stopped) return;
  if (ec) {
    if (ec == net::error::operation_aborted) return;
    // Out of descriptors (EMFILE) or a transient error: wait a little instead of spinning.
    spdlog::warn("accept failed: {}", ec.message());
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](beast::error_code e) {
      if (!e && !stopped) accept();
    });
    return;
  }
  if (num_connections.load() >= limits.max_connections) {
    // Over the limit: a short 503 written without waiting, then closed.
    HttpResponse r = error_body(503, fmt::format("too many connections (--max-connections {})", limits.max_connections));
    std::string s = fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: {}\r\nRetry-After: 1\r\nContent-Length: {}\r\n"
                                "Connection: close\r\n\r\n{}", r.content_type, r.body.size(), r.body);
    ::send(sock.native_handle(), s.data(), s.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    beast::error_code ignored;
    sock.shutdown(tcp::socket::shutdown_send, ignored);
    sock.close(ignored);
  } else {
    auto c = std::make_shared<Connection>(*this, std::move(sock));
    {
      std::lock_guard lk(conns_mu);
      if (conns.size() > 1024 && conns.size() > 2u * static_cast<size_t>(num_connections.load()))
        conns.erase(std::remove_if(conns.begin(), conns.end(), [](const auto& w) { return w.expired(); }), conns.end());
      conns.push_back(c);
    }
    net::post(c->executor(), [c] { c->start(); });
  }
  accept();
}

HttpTransport::HttpTransport(HttpLimits limits, Precheck precheck, Handler handler, ErrorBody error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->precheck = std::move(precheck);
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
}

HttpTransport::~HttpTransport() {
  stop();
  if (impl_->workers) impl_->workers->stop();
}

int HttpTransport::bind(const std::string& host, int port) {
  beast::error_code ec;
  const auto addr = net::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  SSM_CHECK(!ec, "--host '{}' is not an IP address", host);
  tcp::endpoint ep(addr, static_cast<unsigned short>(port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  SSM_CHECK(!ec, "cannot open a socket for {}:{}: {}", host, port, ec.message());
  a.set_option(net::socket_base::reuse_address(true), ec);
  a.bind(ep, ec);
  SSM_CHECK(!ec, "cannot listen on {}:{} ({})", host, port, ec.message());
  a.listen(4096, ec);
  SSM_CHECK(!ec, "cannot listen on {}:{} ({})", host, port, ec.message());
  return a.local_endpoint().port();
}

void HttpTransport::run() {
  auto& im = *impl_;
  im.workers.emplace(std::max(1, im.limits.worker_threads));
  auto guard = net::make_work_guard(im.ioc);
  net::post(im.acceptor.get_executor(), [&im] { im.accept(); });
  std::vector<std::thread> threads;
  for (int i = 1; i < std::max(1, im.limits.io_threads); ++i) threads.emplace_back([&im] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : threads) t.join();
  im.workers->stop();
  // Connections still referenced by pending handlers are destroyed with the io_context's queues.
}

void HttpTransport::set_draining(bool on) { impl_->draining = on; }

void HttpTransport::post_work(std::function<void()> fn) {
  if (impl_->workers && !impl_->stopped) impl_->workers->post(std::move(fn));
}

void HttpTransport::stop() {
  auto& im = *impl_;
  if (im.stopped.exchange(true)) return;
  net::post(im.acceptor.get_executor(), [&im] {
    beast::error_code ec;
    im.acceptor.close(ec);
  });
  {
    std::lock_guard lk(im.conns_mu);
    for (auto& w : im.conns)
      if (auto c = w.lock()) c->close_from_outside();
    im.conns.clear();
  }
  // Let the closes run (each ends its producer), then end the loop.
  net::post(im.acceptor.get_executor(), [&im] {
    im.stop_timer.expires_after(std::chrono::milliseconds(200));
    im.stop_timer.async_wait([&im](beast::error_code) { im.ioc.stop(); });
  });
}

int HttpTransport::num_connections() const { return impl_->num_connections.load(); }

}  // namespace ssmserve::server
