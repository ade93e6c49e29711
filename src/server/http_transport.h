// Owns the event-driven HTTP/1.1 transport of the server (Boost.Beast over Asio): a few I/O threads hold every
// connection (accept, read with header / body / keep-alive deadlines, write with a write deadline, pipelining,
// disconnect detection, lingering close), a small worker pool runs the request handlers (parsing, tokenizing),
// and responses are either whole or produced over time (SSE) with backpressure: a producer is asked for more only
// when the previous write has finished. Nothing here knows about OpenAI or the engine (http_server.cpp does).
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ssmserve::server {

/// Limits of the transport; times in seconds.
struct HttpLimits {
  int max_connections = 16384;          ///< open connections; more are answered 503 and closed at once
  size_t max_header_bytes = 64u << 10;  ///< request line + headers (else 431)
  size_t max_body_bytes = 32u << 20;    ///< request body, sized or chunked (else 413)
  double header_timeout_s = 10.0;       ///< request line + headers must arrive within this of their first byte (408)
  double read_timeout_s = 60.0;         ///< the whole request (headers + body) within this of its first byte (408)
  double keep_alive_timeout_s = 5.0;    ///< an idle connection (or a new one that sends nothing) is closed after it
  double write_timeout_s = 60.0;        ///< one write may wait this long for the client to read, else the connection ends
  int max_requests_per_connection = 1000;
  int io_threads = 2;                   ///< threads running every connection's I/O
  int worker_threads = 4;               ///< threads running handlers (request parsing, tokenization, rendering)
  /// An access line per response at info level (uvicorn's): `client - "METHOD target HTTP/1.1" status reason`.
  bool access_log = true;
};

/// One request: head and (complete) body.
struct HttpRequest {
  std::string method;  ///< as sent ("GET", "POST", ...)
  std::string target;  ///< the request target as sent
  std::string path;    ///< target without query (origin form)
  int version = 11;    ///< 10 = HTTP/1.0, 11 = HTTP/1.1
  std::vector<std::pair<std::string, std::string>> headers;  ///< in order, names as sent
  std::string body;
  /// The first value of header `name` (case-insensitive), or nullopt.
  std::optional<std::string> header(std::string_view name) const;
  /// How many times header `name` (case-insensitive) occurs.
  size_t header_count(std::string_view name) const;
};

/// A whole response, or the head of a streamed one (body empty then).
struct HttpResponse {
  int status = 200;
  std::string content_type;  ///< empty: no Content-Type
  std::vector<std::pair<std::string, std::string>> headers;  ///< extra headers (no CR / LF in names or values)
  std::string body;
  bool close = false;  ///< end the connection after this response
};

/// What a producer hands over on one call.
struct ProducerOutput {
  /// Set once, on the first call that has something: the status and headers. With stream = false, head->body is
  /// the whole response and the exchange ends; with stream = true the body follows in `data` (chunked for
  /// HTTP/1.1, until the connection closes for HTTP/1.0).
  std::optional<HttpResponse> head;
  bool stream = false;
  std::string data;   ///< body bytes of a streamed response
  bool done = false;  ///< the streamed body is complete
};

/// A response produced over time. All calls come on the connection's I/O thread, one at a time.
class Producer {
 public:
  virtual ~Producer() = default;
  /// Called after Exchange::wake(), after a write finished (when woken meanwhile), and every few hundred ms;
  /// appends what is ready to `out` (nothing: call again later). Must not block. An exception ends the exchange
  /// (500 before the head, else the connection closes).
  virtual void produce(ProducerOutput& out) = 0;
  /// The exchange ended: `complete` after the last byte was written, false when the client went away, a write
  /// timed out or the server stopped (the producer then aborts its work). Called exactly once.
  virtual void close(bool complete) = 0;
};

/// One request and the handle to answer it; thread-safe. Exactly one of respond / respond_later may be called.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const HttpRequest& request() const = 0;
  /// Sends a whole response.
  virtual void respond(HttpResponse r) = 0;
  /// Hands the response to `p` (see Producer). If the connection is already gone, p->close(false) is called.
  virtual void respond_later(std::shared_ptr<Producer> p) = 0;
  /// The producer has something new: it will be asked (on the I/O thread) when no write is in flight.
  virtual void wake() = 0;
};

/// The transport. Construct, bind(), then run() (blocks until stop()).
class HttpTransport {
 public:
  /// Runs on an I/O thread after the headers, before any body is read: a response refuses the request (its body
  /// is not read; the connection closes after it). Must be cheap.
  using Precheck = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;
  /// Runs on a worker thread with a complete request; answers through the exchange (exceptions become 500).
  using Handler = std::function<void(const std::shared_ptr<Exchange>&)>;
  /// Builds an error response (status, message) for errors the transport answers itself (400, 408, 413, 431,
  /// 500, 503).
  using ErrorBody = std::function<HttpResponse(int status, const std::string& message)>;
  /// Runs on an I/O thread once a request's head has arrived: appends headers that depend on the request (CORS) to
  /// every response head written for it (whole, streamed, refused, or the transport's own errors after the head).
  /// Must be cheap and must not throw.
  using ResponseHeaders = std::function<void(const HttpRequest& req, std::vector<std::pair<std::string, std::string>>& headers)>;

  HttpTransport(HttpLimits limits, Precheck precheck, Handler handler, ErrorBody error_body,
                ResponseHeaders response_headers = nullptr);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  /// Listens on host:port (0 = any free port); returns the bound port. Throws Error when it cannot.
  int bind(const std::string& host, int port);
  /// Serves until stop(): returns after the I/O and worker threads ended and every connection was closed (open
  /// producers get close(false)).
  void run();
  /// Thread-safe: runs `fn` on a worker thread (e.g. rendering a large response off the I/O threads); dropped when
  /// the transport has stopped.
  void post_work(std::function<void()> fn);
  /// Thread-safe. While set, every response closes its connection.
  void set_draining(bool on);
  /// Thread-safe: ends run().
  void stop();
  /// Open connections now.
  int num_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ssmserve::server
