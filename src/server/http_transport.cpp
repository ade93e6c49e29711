// Owns the Boost.Beast / Asio transport (see http_transport.h): the acceptor (over the connection limit a 503,
// then close), the I/O threads and the worker pool, draining and stop. Each connection is a Connection state
// machine on its own strand (http_connection.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/error.h"
#include "server/http_connection.h"

namespace ssmserve::server {

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

HttpTransport::HttpTransport(HttpLimits limits, Precheck precheck, Handler handler, ErrorBody error_body,
                             ResponseHeaders response_headers)
    : impl_(std::make_unique<Impl>()) {
  impl_->response_headers = std::move(response_headers);
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
