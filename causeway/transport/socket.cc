#include "causeway/transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <string>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "causeway/base/fault_injection.h"
#include "causeway/base/status.h"

namespace causeway::transport {
namespace {

// The status of a failed system call: "<what>: <errno text>". Errors that mean
// the peer or the path to it is gone are Unavailable, whatever absl's general
// mapping says (it makes EPIPE a FailedPrecondition and a TCP timeout a
// DeadlineExceeded, which callers would mistake for their own deadline).
absl::Status ErrnoError(int error, absl::string_view what) {
  switch (error) {
    case EPIPE:
    case ECONNRESET:
    case ECONNABORTED:
    case ECONNREFUSED:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ENETDOWN:
      return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(error)));
    default:
      return absl::ErrnoToStatus(error, what);
  }
}

// An injected fault (causeway/base/fault_injection.h) at `point`: the connection
// is reset, so this side fails and the peer sees it close.
absl::Status InjectReset(int fd, FaultPoint point, absl::string_view what) {
  shutdown(fd, SHUT_RDWR);
  return InjectedFaultError(absl::StatusCode::kUnavailable, point,
                            absl::StrCat(what, ": ", std::strerror(ECONNRESET)));
}

// How long a call that started at `start` waited for `deadline`, to the
// nearest millisecond, for messages.
std::string Waited(absl::Time start, absl::Time deadline) {
  const absl::Duration waited = std::max(deadline - start, absl::ZeroDuration());
  return absl::FormatDuration(absl::Trunc(waited + absl::Microseconds(500), absl::Milliseconds(1)));
}

// Waits until `fd` is ready for `events` or `deadline` passes. True when it is
// ready, or has an error or hangup that retrying the call will report; false
// when the deadline came first.
absl::StatusOr<bool> PollUntil(int fd, short events, absl::Time deadline) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
    pollfd p{fd, events, 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, INT_MAX)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return ErrnoError(errno, "poll");
    // Timed out (the clock is checked again: poll may round down) or EINTR.
  }
}

absl::Status SetNoDelay(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoError(errno, "setsockopt TCP_NODELAY");
  }
  return absl::OkStatus();
}

absl::StatusOr<SocketAddress> LocalAddressOf(int fd) {
  sockaddr_storage storage{};
  socklen_t length = sizeof(storage);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
    return ErrnoError(errno, "getsockname");
  }
  return SocketAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&storage), length);
}

// A host name as DNS allows it: letters, digits, '-' and '.', at most 253.
bool IsHostName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  return std::all_of(host.begin(), host.end(),
                     [](char c) { return absl::ascii_isalnum(c) || c == '-' || c == '.'; });
}

bool IsDigitsAndDots(absl::string_view host) {
  return std::all_of(host.begin(), host.end(), [](char c) { return absl::ascii_isdigit(c) || c == '.'; });
}

// Resolves a host name to its first IPv4 address, else its first IPv6 one.
absl::StatusOr<SocketAddress> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &results);
  if (rc != 0) {
    const std::string message = absl::StrCat("cannot resolve host '", host, "': ", gai_strerror(rc));
    if (rc == EAI_AGAIN) return absl::UnavailableError(message);
    if (rc == EAI_SYSTEM) return ErrnoError(errno, message);
    return absl::NotFoundError(message);
  }
  const addrinfo* chosen = nullptr;
  for (const addrinfo* r = results; r != nullptr; r = r->ai_next) {
    if (r->ai_family == AF_INET) {
      chosen = r;
      break;
    }
    if (r->ai_family == AF_INET6 && chosen == nullptr) chosen = r;
  }
  absl::StatusOr<SocketAddress> address =
      chosen == nullptr ? absl::NotFoundError(absl::StrCat("host '", host, "' has no IPv4 or IPv6 address"))
                        : SocketAddress::FromSockaddr(chosen->ai_addr, chosen->ai_addrlen);
  freeaddrinfo(results);
  if (!address.ok()) return address.status();
  // The port is not given to getaddrinfo, so that a port is never a service
  // name: set it on the result.
  sockaddr_storage storage{};
  std::memcpy(&storage, address->sockaddr_ptr(), address->sockaddr_length());
  if (storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
  }
  return SocketAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&storage), address->sockaddr_length());
}

}  // namespace

absl::StatusOr<SocketAddress> SocketAddress::Parse(absl::string_view text) {
  auto invalid = [&text](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("socket address '", absl::CHexEscape(text), "': ", why,
                                                   "; expected host:port, as in 127.0.0.1:5000, "
                                                   "[::1]:5000 or localhost:0"));
  };
  absl::string_view host;
  absl::string_view port_text;
  const bool bracketed = absl::StartsWith(text, "[");
  if (bracketed) {
    const size_t close = text.find(']');
    if (close == absl::string_view::npos) return invalid("'[' without ']'");
    host = text.substr(1, close - 1);
    absl::string_view rest = text.substr(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return invalid("no ':' and port after ']'");
    port_text = rest;
  } else {
    const size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) return invalid("no port");
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (absl::StrContains(host, ':')) return invalid("an IPv6 address needs brackets, as in [::1]:5000");
  }
  uint32_t port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return invalid(absl::StrCat("port '", absl::CHexEscape(port_text), "' is not a number from 0 to 65535"));
  }
  if (host.empty()) return invalid("no host (0.0.0.0 or [::] listen on every interface)");

  const std::string host_string(host);
  SocketAddress address;
  if (bracketed) {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&address.storage_);
    if (inet_pton(AF_INET6, host_string.c_str(), &v6->sin6_addr) != 1) {
      return invalid(absl::StrCat("'", absl::CHexEscape(host), "' is not an IPv6 address"));
    }
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    address.length_ = sizeof(sockaddr_in6);
    return address;
  }
  const bool is_localhost = absl::EqualsIgnoreCase(host, "localhost");
  if (is_localhost || IsDigitsAndDots(host)) {
    auto* v4 = reinterpret_cast<sockaddr_in*>(&address.storage_);
    if (is_localhost) {
      v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (inet_pton(AF_INET, host_string.c_str(), &v4->sin_addr) != 1) {
      return invalid(absl::StrCat("'", host, "' is not an IPv4 address"));
    }
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    address.length_ = sizeof(sockaddr_in);
    return address;
  }
  if (!IsHostName(host)) return invalid(absl::StrCat("'", absl::CHexEscape(host), "' is not a host name"));
  return Resolve(host_string, static_cast<uint16_t>(port));
}

absl::StatusOr<SocketAddress> SocketAddress::FromSockaddr(const sockaddr* address, socklen_t length) {
  SocketAddress result;
  if (address->sa_family == AF_INET && length >= static_cast<socklen_t>(sizeof(sockaddr_in))) {
    result.length_ = sizeof(sockaddr_in);
  } else if (address->sa_family == AF_INET6 && length >= static_cast<socklen_t>(sizeof(sockaddr_in6))) {
    result.length_ = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("expected an IPv4 or IPv6 socket address, got family ",
                                                   address->sa_family, " of ", length, " bytes"));
  }
  std::memcpy(&result.storage_, address, result.length_);
  return result;
}

uint16_t SocketAddress::port() const {
  switch (family()) {
    case AF_INET:
      return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
    case AF_INET6:
      return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
    default:
      return 0;
  }
}

bool SocketAddress::IsLoopback() const {
  if (family() == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  return false;
}

std::string SocketAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, text, sizeof(text));
    return absl::StrCat(text, ":", port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, text, sizeof(text));
    return absl::StrCat("[", text, "]:", port());
  }
  return "(none)";
}

absl::StatusOr<Socket> Socket::Listen(const SocketAddress& address, int backlog) {
  const std::string where = address.ToString();
  Socket socket(::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), {}, {});
  if (!socket.valid()) return ErrnoError(errno, absl::StrCat("socket for ", where));
  const int one = 1;
  if (setsockopt(socket.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
    return ErrnoError(errno, "setsockopt SO_REUSEADDR");
  }
  if (bind(socket.fd_, address.sockaddr_ptr(), address.sockaddr_length()) != 0) {
    return ErrnoError(errno, absl::StrCat("bind ", where));
  }
  if (listen(socket.fd_, backlog) != 0) return ErrnoError(errno, absl::StrCat("listen on ", where));
  CAUSEWAY_ASSIGN_OR_RETURN(socket.local_, LocalAddressOf(socket.fd_));
  return socket;
}

absl::StatusOr<Socket> Socket::Connect(const SocketAddress& address, absl::Time deadline) {
  const absl::Time start = absl::Now();
  const std::string where = address.ToString();
  Socket socket(::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), {}, address);
  if (!socket.valid()) return ErrnoError(errno, absl::StrCat("socket for ", where));
  if (connect(socket.fd_, address.sockaddr_ptr(), address.sockaddr_length()) != 0) {
    // Interrupted or not, a non-blocking connect goes on in the background.
    if (errno != EINPROGRESS && errno != EINTR) return ErrnoError(errno, absl::StrCat("connect to ", where));
    CAUSEWAY_ASSIGN_OR_RETURN(bool ready, PollUntil(socket.fd_, POLLOUT, deadline));
    if (!ready) {
      return absl::DeadlineExceededError(
          absl::StrCat("connect to ", where, ": not established after ", Waited(start, deadline)));
    }
    int error = 0;
    socklen_t length = sizeof(error);
    if (getsockopt(socket.fd_, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) return ErrnoError(error, absl::StrCat("connect to ", where));
  }
  CAUSEWAY_RETURN_IF_ERROR(SetNoDelay(socket.fd_));
  CAUSEWAY_ASSIGN_OR_RETURN(socket.local_, LocalAddressOf(socket.fd_));
  return socket;
}

Socket::Socket(Socket&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), local_(other.local_), peer_(other.peer_) {}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    local_ = other.local_;
    peer_ = other.peer_;
  }
  return *this;
}

absl::Status Socket::InvalidSocketError(absl::string_view operation) const {
  return absl::FailedPreconditionError(absl::StrCat(operation, " on a closed or moved-from socket"));
}

absl::StatusOr<Socket> Socket::Accept(absl::Time deadline) {
  if (!valid()) return InvalidSocketError("Accept");
  const absl::Time start = absl::Now();
  for (;;) {
    sockaddr_storage storage{};
    socklen_t length = sizeof(storage);
    const int fd = accept4(fd_, reinterpret_cast<sockaddr*>(&storage), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Socket connection(fd, {}, {});
      CAUSEWAY_ASSIGN_OR_RETURN(connection.peer_,
                                SocketAddress::FromSockaddr(reinterpret_cast<sockaddr*>(&storage), length));
      CAUSEWAY_ASSIGN_OR_RETURN(connection.local_, LocalAddressOf(fd));
      CAUSEWAY_RETURN_IF_ERROR(SetNoDelay(fd));
      return connection;
    }
    switch (errno) {
      case EAGAIN:
#if EWOULDBLOCK != EAGAIN
      case EWOULDBLOCK:
#endif
        break;
      // A connection that went away while queued, or (see accept(2)) a network
      // error already pending on it: wait for the next one.
      case EINTR:
      case ECONNABORTED:
      case EPROTO:
      case ENETDOWN:
      case ENOPROTOOPT:
      case EHOSTDOWN:
      case ENONET:
      case EHOSTUNREACH:
      case ENETUNREACH:
        continue;
      default:
        return ErrnoError(errno, absl::StrCat("accept on ", local_.ToString()));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(bool ready, PollUntil(fd_, POLLIN, deadline));
    if (!ready) {
      return absl::DeadlineExceededError(
          absl::StrCat("accept on ", local_.ToString(), ": no connection after ", Waited(start, deadline)));
    }
  }
}

absl::Status Socket::WriteAll(absl::Span<const absl::Span<const uint8_t>> pieces, absl::Time deadline) {
  if (!valid()) return InvalidSocketError("WriteAll");
  if (ShouldInjectFault(FaultPoint::kSend)) return InjectReset(fd_, FaultPoint::kSend, absl::StrCat("write to ", peer_.ToString()));
  const absl::Time start = absl::Now();
  absl::InlinedVector<iovec, 8> iov;
  uint64_t total = 0;
  for (absl::Span<const uint8_t> piece : pieces) {
    if (piece.empty()) continue;
    iov.push_back({const_cast<uint8_t*>(piece.data()), piece.size()});
    total += piece.size();
  }
  uint64_t sent = 0;
  size_t next = 0;  // the first iovec not yet sent in full
  while (next < iov.size()) {
    msghdr message{};
    message.msg_iov = &iov[next];
    message.msg_iovlen = std::min<size_t>(iov.size() - next, IOV_MAX);
    const ssize_t n = sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += n;
      for (size_t left = n; left > 0;) {
        const size_t step = std::min(left, iov[next].iov_len);
        iov[next].iov_base = static_cast<uint8_t*>(iov[next].iov_base) + step;
        iov[next].iov_len -= step;
        left -= step;
        if (iov[next].iov_len == 0) ++next;
      }
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoError(
          errno, absl::StrCat("write to ", peer_.ToString(), " after ", sent, " of ", total, " bytes"));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(bool ready, PollUntil(fd_, POLLOUT, deadline));
    if (!ready) {
      return absl::DeadlineExceededError(absl::StrCat("write to ", peer_.ToString(), ": ", sent, " of ",
                                                      total, " bytes sent after ", Waited(start, deadline)));
    }
  }
  return absl::OkStatus();
}

absl::Status Socket::ReadExact(void* out, size_t n, absl::Time deadline) {
  if (!valid()) return InvalidSocketError("ReadExact");
  if (ShouldInjectFault(FaultPoint::kReceive)) return InjectReset(fd_, FaultPoint::kReceive, absl::StrCat("read from ", peer_.ToString()));
  const absl::Time start = absl::Now();
  auto* bytes = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd_, bytes + got, n - got, 0);
    if (r > 0) {
      got += r;
      continue;
    }
    if (r == 0) {
      return absl::UnavailableError(absl::StrCat(
          "read from ", peer_.ToString(), ": peer closed the connection after ", got, " of ", n, " bytes"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoError(errno,
                        absl::StrCat("read from ", peer_.ToString(), " after ", got, " of ", n, " bytes"));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(bool ready, PollUntil(fd_, POLLIN, deadline));
    if (!ready) {
      return absl::DeadlineExceededError(absl::StrCat("read from ", peer_.ToString(), ": ", got, " of ", n,
                                                      " bytes received after waiting ",
                                                      Waited(start, deadline)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> Socket::ReadSome(void* out, size_t n) {
  if (!valid()) return InvalidSocketError("ReadSome");
  if (n == 0) return 0;
  for (;;) {
    const ssize_t r = recv(fd_, out, n, 0);
    if (r > 0) return static_cast<size_t>(r);
    if (r == 0) {
      return absl::UnavailableError(
          absl::StrCat("read from ", peer_.ToString(), ": peer closed the connection"));
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return ErrnoError(errno, absl::StrCat("read from ", peer_.ToString()));
  }
}

absl::StatusOr<size_t> Socket::WriteSome(absl::Span<const uint8_t> bytes) {
  if (!valid()) return InvalidSocketError("WriteSome");
  if (bytes.empty()) return 0;
  for (;;) {
    const ssize_t n = send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return ErrnoError(errno, absl::StrCat("write to ", peer_.ToString()));
  }
}

absl::StatusOr<bool> Socket::Wait(short events, absl::Time deadline) const {
  if (!valid()) return InvalidSocketError("Wait");
  return PollUntil(fd_, events, deadline);
}

void Socket::ShutdownBoth() {
  if (valid()) shutdown(fd_, SHUT_RDWR);
}

void Socket::Close() {
  if (valid()) close(std::exchange(fd_, -1));
}

}  // namespace causeway::transport
