// Owns the connection layer under cpp-httplib: one persistent, buffered stream per TCP connection (pipelined
// HTTP/1.1 requests are served in order instead of losing the bytes read ahead), read deadlines against slow
// clients (slowloris), peer-liveness checks for handlers waiting on the engine, and ending a connection after a
// response whose request body was not read. httplib's own request parsing and routing are used unchanged: this
// replaces only Server::process_and_close_socket, the library's per-connection hook.
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>

namespace ssmserve::server {

/// Socket timeouts of the HTTP layer (seconds).
struct HttpTimeouts {
  /// A request's line, headers and body must all arrive within this many seconds of its first byte; slower
  /// clients get 408 and are disconnected. Also the longest one write may wait for a client to drain its socket.
  double read_timeout_s = 60.0;
  /// An idle keep-alive connection (or a new one that sends nothing) is closed after this many seconds.
  double keep_alive_timeout_s = 5.0;
};

class ConnectionStream;

/// One client connection, served start to end by one worker thread (the thread running the handlers and content
/// providers of its requests; see current_connection()).
class Connection {
 public:
  Connection(int fd, const HttpTimeouts& t);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// True when the client has gone: it closed (or half-closed) its side, reset the connection, or the socket
  /// failed. Pending bytes of a next pipelined request do not count. Non-blocking (one poll()).
  bool peer_closed() const;
  /// Ends the connection after the response being produced (e.g. its request body was left unread).
  void close_after_response() { close_ = true; }
  bool closing() const { return close_; }
  /// True when the current request did not arrive within HttpTimeouts::read_timeout_s.
  bool timed_out() const;
  ConnectionStream& stream() { return *stream_; }

 private:
  int fd_;
  std::unique_ptr<ConnectionStream> stream_;
  bool close_ = false;
};

/// The connection served by the calling thread, or nullptr outside a connection thread.
Connection* current_connection();

/// httplib::Server whose connections are served through Connection: same parsing, routing and keep-alive
/// rules (keep_alive_max_count, Connection: close), plus the behaviour described at the top of this file.
class HttpServer : public httplib::Server {
 public:
  explicit HttpServer(HttpTimeouts t) : timeouts_(t) {}
  /// While set, every connection ends after its current response (graceful shutdown).
  void set_closing(bool on) { closing_ = on; }

 private:
  bool process_and_close_socket(socket_t sock) override;
  /// Waits until a next request's first byte (or EOF) is readable; false on keep-alive timeout, error or stop().
  bool wait_for_request(Connection& c);
  HttpTimeouts timeouts_;
  std::atomic<bool> closing_{false};
};

}  // namespace ssmserve::server
