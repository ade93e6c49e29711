// Owns the per-connection stream and loop under cpp-httplib (see http_connection.h).
#include "server/http_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ssmserve::server {

namespace {

thread_local Connection* t_current = nullptr;

using Clock = std::chrono::steady_clock;

int to_ms(double s) { return static_cast<int>(std::clamp(s * 1000.0, 0.0, 2.0e9)); }

/// poll() one fd for `events`, retrying on EINTR; returns the revents (0 on timeout, POLLERR on failure).
short poll_fd(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return p.revents;
    if (r == 0) return 0;
    if (errno != EINTR) return POLLERR;
    timeout_ms = static_cast<int>(std::max<long long>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count()));
  }
}

void address_of(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int r = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                     : ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (r != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

}  // namespace

/// The connection's byte stream: a read-ahead buffer that outlives single requests (so pipelined requests are not
/// lost), reads bounded by the request deadline, writes bounded by the write timeout.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, const HttpTimeouts& t) : fd_(fd), t_(t) {}

  /// Starts the deadline of a new request (its first byte is readable or buffered).
  void begin_request() {
    deadline_ = Clock::now() + std::chrono::milliseconds(to_ms(t_.read_timeout_s));
    timed_out_ = false;
  }
  bool buffered() const { return pos_ < end_; }
  bool timed_out() const { return timed_out_; }

  bool is_readable() const override { return buffered() || wait_readable(); }
  bool is_writable() const override {
    const short ev = poll_fd(fd_, POLLOUT, to_ms(t_.read_timeout_s));
    return (ev & POLLOUT) && !(ev & (POLLERR | POLLHUP)) && !peer_closed();
  }

  ssize_t read(char* ptr, size_t size) override {
    if (size == 0) return 0;
    if (buffered()) {
      const size_t n = std::min(size, end_ - pos_);
      std::memcpy(ptr, buf_ + pos_, n);
      pos_ += n;
      return static_cast<ssize_t>(n);
    }
    if (!wait_readable()) return -1;
    pos_ = end_ = 0;
    const bool direct = size >= sizeof(buf_);
    ssize_t n;
    do {
      n = ::recv(fd_, direct ? ptr : buf_, direct ? size : sizeof(buf_), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) return n < 0 ? -1 : 0;
    if (direct) return n;
    end_ = static_cast<size_t>(n);
    return read(ptr, size);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!(poll_fd(fd_, POLLOUT, to_ms(t_.read_timeout_s)) & POLLOUT)) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

  bool peer_closed() const {
    const short ev = poll_fd(fd_, POLLIN | POLLRDHUP, 0);
    if (ev & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    if (!(ev & POLLIN)) return false;
    char c;  // readable: pending data of a next request, or EOF
    ssize_t n;
    do {
      n = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

 private:
  /// Waits for input within the request deadline (and at most read_timeout_s); marks a timeout.
  bool wait_readable() const {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
    if (left <= 0) {
      timed_out_ = true;
      return false;
    }
    const short ev = poll_fd(fd_, POLLIN, static_cast<int>(std::min<long long>(left, to_ms(t_.read_timeout_s))));
    if (ev == 0) timed_out_ = true;
    return ev != 0;  // readable, or an error / hang-up that recv() then reports
  }

  int fd_;
  HttpTimeouts t_;
  Clock::time_point deadline_ = Clock::now();
  mutable bool timed_out_ = false;
  char buf_[16384];
  size_t pos_ = 0, end_ = 0;
};

Connection::Connection(int fd, const HttpTimeouts& t) : fd_(fd), stream_(std::make_unique<ConnectionStream>(fd, t)) {}
Connection::~Connection() = default;

bool Connection::peer_closed() const { return stream_->peer_closed(); }
bool Connection::timed_out() const { return stream_->timed_out(); }

Connection* current_connection() { return t_current; }

bool HttpServer::wait_for_request(Connection& c) {
  if (c.stream().buffered()) return true;
  const auto until = Clock::now() + std::chrono::milliseconds(to_ms(timeouts_.keep_alive_timeout_s));
  while (svr_sock_ != INVALID_SOCKET) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    if (left <= 0) return false;
    const short ev = poll_fd(c.stream().socket(), POLLIN, static_cast<int>(std::min<long long>(left, 100)));
    if (ev & (POLLERR | POLLNVAL)) return false;
    if (ev & (POLLIN | POLLHUP)) return true;  // a request, or EOF (process_request then ends the connection)
  }
  return false;
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  bool ret = false;
  {
    Connection conn(sock, timeouts_);
    t_current = &conn;
    for (size_t left = keep_alive_max_count_; left > 0 && !conn.closing(); --left) {
      if (!wait_for_request(conn)) break;
      conn.stream().begin_request();
      bool client_closes = false;
      ret = process_request(conn.stream(), left == 1 || closing_, client_closes, nullptr);
      if (!ret || client_closes || conn.timed_out() || closing_) break;
    }
    t_current = nullptr;
    if (conn.closing() && !conn.timed_out()) {
      // Lingering close: the client may still be sending the body we refused; closing with unread input would
      // reset the connection and could destroy our error response before the client reads it. Drain a while.
      ::shutdown(sock, SHUT_WR);
      thread_local char sink[65536];
      size_t drained = 0;
      const auto until = Clock::now() + std::chrono::seconds(2);
      while (drained < (64u << 20) && Clock::now() < until && (poll_fd(sock, POLLIN, 200) & (POLLIN | POLLHUP))) {
        const ssize_t n = ::recv(sock, sink, sizeof(sink), MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && (errno == EINTR || errno == EAGAIN))) break;
        if (n > 0) drained += static_cast<size_t>(n);
      }
    }
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace ssmserve::server
