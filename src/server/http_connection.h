// Owns the Connection state machine of the HTTP transport (internal to src/server/http_*.cpp): its declaration and
// the transport state its connections share (HttpTransport::Impl: acceptor, worker pool, open connections). A
// connection reads requests and keeps its deadlines in http_connection.cpp, hands each request to a worker and
// writes the answer in http_exchange.cpp; http_transport.cpp accepts connections and runs the I/O threads.
#pragma once
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/http_transport.h"
#include "server/worker_pool.h"

namespace ssmserve::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

class Connection;

struct HttpTransport::Impl {
  HttpLimits limits;
  Precheck precheck;
  Handler handler;
  ErrorBody error_body;
  ResponseHeaders response_headers;
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
  Connection(HttpTransport::Impl& t, tcp::socket sock);
  ~Connection();

  void start();
  /// Thread-safe: closes the connection on its strand (server stop).
  void close_from_outside();

  // Exchange side (on the strand).
  void on_respond(HttpResponse r);
  void on_respond_later(std::shared_ptr<Producer> p);
  void on_wake();
  net::any_io_executor executor() { return sock_.get_executor(); }

 private:
  // Reading a request, the watch while it is handled, deadlines and closing (http_connection.cpp).
  void wait_request();
  void read_header();
  void on_header(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void start_tick();
  bool peer_closed();
  void close();
  void arm(double s);

  // Handing the request to a worker, writing the response, closing after it (http_exchange.cpp).
  void dispatch();
  std::string serialize_head(const HttpResponse& r, bool stream, size_t content_length);
  void decide_closing(const HttpResponse& r, bool stream);
  void write_whole(HttpResponse r);
  void pump();
  void write(bool last);
  void after_write(bool last);
  void end_exchange();
  void fail_request(int status, const std::string& message);
  void graceful_close();
  void linger_close();
  void drain_some();

  HttpTransport::Impl& t_;
  tcp::socket sock_;
  net::steady_timer timer_;  // the current phase's deadline
  net::steady_timer tick_;   // while a request is handled: disconnect watch, producer poll
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::empty_body>> hparser_;
  std::optional<http::request_parser<http::string_body>> bparser_;
  HttpRequest req_;
  // The request-dependent response headers (HttpTransport::ResponseHeaders), taken from the head before dispatch
  // moves req_'s headers to the exchange; empty for a request that failed before its head.
  std::vector<std::pair<std::string, std::string>> response_headers_;
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

}  // namespace ssmserve::server
