// Owns a Connection's reading side and lifecycle (see http_connection.h): waiting for a request's first byte within
// the keep-alive timeout, reading its line and headers (header deadline) and body (read deadline), checking its
// framing (RFC 9112: lengths, Transfer-Encoding, Host) and running the route's precheck; the 200 ms watch while a
// request is handled (client gone, write deadline, producer poll); the phase deadlines and closing. Also
// HttpRequest's header lookups.
#include "server/http_connection.h"

#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

namespace ssmserve::server {

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

Connection::Connection(HttpTransport::Impl& t, tcp::socket sock)
    : t_(t), sock_(std::move(sock)), timer_(sock_.get_executor()), tick_(sock_.get_executor()),
      buf_(t.limits.max_header_bytes + (64u << 10)) {
  ++t_.num_connections;
}

Connection::~Connection() {
  if (producer_) producer_->close(false);
  --t_.num_connections;
}

void Connection::start() {
  beast::error_code ec;
  sock_.set_option(tcp::no_delay(true), ec);
  wait_request();
}

void Connection::close_from_outside() {
  net::post(sock_.get_executor(), [self = shared_from_this()] { self->close(); });
}

// 1. Wait for a request's first byte within the keep-alive timeout.
void Connection::wait_request() {
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
void Connection::read_header() {
  request_start_ = Clock::now();
  req_.target.clear();  // the access line of a request that fails before its head shows "-", not the last one's
  req_.method.clear();
  response_headers_.clear();
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

void Connection::on_header(beast::error_code ec) {
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
  if (t_.response_headers) t_.response_headers(req_, response_headers_);
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

void Connection::read_body() {
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

void Connection::on_body(beast::error_code ec) {
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

/// While a request is handled (or a response written): every 200 ms, checks the client is still there and the
/// write deadline, and lets the producer see server-wide changes (shutdown).
void Connection::start_tick() {
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
bool Connection::peer_closed() {
  pollfd p{sock_.native_handle(), static_cast<short>(POLLIN | POLLRDHUP), 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
  if (!(p.revents & POLLIN)) return false;
  char c;
  const ssize_t n = ::recv(sock_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void Connection::close() {
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
void Connection::arm(double s) {
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

}  // namespace ssmserve::server
