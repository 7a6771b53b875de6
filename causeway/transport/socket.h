// TCP sockets for the DCN transport: addresses, and a move-only socket whose
// every wait has a deadline.
//
// Sockets are non-blocking underneath: each call tries the system call, and
// when the kernel would block it polls until the socket is ready or the
// deadline passes. Nothing here waits without a deadline, and a write to a
// peer that has gone away returns an error instead of raising SIGPIPE.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress where, SocketAddress::Parse("127.0.0.1:0"));
//   CAUSEWAY_ASSIGN_OR_RETURN(Socket listener, Socket::Listen(where, /*backlog=*/16));
//   // ... tell the peer listener.port() ...
//   CAUSEWAY_ASSIGN_OR_RETURN(Socket conn, listener.Accept(absl::Now() + absl::Seconds(5)));
//   uint8_t header[16];
//   CAUSEWAY_RETURN_IF_ERROR(conn.ReadExact(header, sizeof(header), absl::Now() + absl::Seconds(1)));
#ifndef CAUSEWAY_TRANSPORT_SOCKET_H_
#define CAUSEWAY_TRANSPORT_SOCKET_H_

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace causeway::transport {

// An IPv4 or IPv6 address and a TCP port, resolved when parsed. A value type.
class SocketAddress {
 public:
  // Parses "host:port": a dotted IPv4 address ("127.0.0.1:5000",
  // "0.0.0.0:5000"), a bracketed IPv6 address ("[::1]:5000", "[::]:0"),
  // "localhost" (always 127.0.0.1) or a host name, which is resolved here
  // with getaddrinfo (bounded by the system resolver's own timeouts; the
  // first IPv4 result is taken, else the first IPv6 one). Port 0 asks the
  // kernel for any free port when listening.
  //
  // Errors:
  //   InvalidArgument  not of that form (no port, a port above 65535, an
  //                    unbracketed IPv6 address, a malformed IPv4 address,
  //                    characters no host name has); the message quotes the
  //                    text and says what was expected.
  //   NotFound         a host name that does not resolve.
  //   Unavailable      the resolver could not answer now.
  static absl::StatusOr<SocketAddress> Parse(absl::string_view text);

  // The address of a socket as the kernel reports it (getsockname,
  // getpeername, accept). `length` must cover a sockaddr_in or sockaddr_in6.
  static absl::StatusOr<SocketAddress> FromSockaddr(const sockaddr* address, socklen_t length);

  // An unspecified address: family() is AF_UNSPEC, ToString() is "(none)".
  SocketAddress() = default;

  // AF_INET, AF_INET6 or AF_UNSPEC.
  int family() const { return storage_.ss_family; }
  uint16_t port() const;
  // In 127.0.0.0/8, ::1, or an IPv4-mapped 127.0.0.0/8. The wildcard
  // addresses 0.0.0.0 and :: are not loopback: they listen on every interface.
  bool IsLoopback() const;
  // "127.0.0.1:5000" or "[::1]:5000": numeric, never a host name.
  std::string ToString() const;

  const sockaddr* sockaddr_ptr() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t sockaddr_length() const { return length_; }

 private:
  sockaddr_storage storage_{};  // ss_family == AF_UNSPEC until set
  socklen_t length_ = 0;
};

// A TCP socket: a listener or one end of a connection. Owns its file
// descriptor (opened with O_CLOEXEC and O_NONBLOCK; connections have
// TCP_NODELAY) and closes it when destroyed. Move-only; a moved-from or
// default-constructed Socket is invalid and every call on it fails.
//
// Thread-safety: one thread may read while another writes the same
// connection; ShutdownBoth may be called from any thread and wakes both.
// Two concurrent reads, or two concurrent writes, interleave their bytes and
// are a caller's bug. Moving, Close and destruction need exclusive access.
class Socket {
 public:
  // A listener bound to `address` (SO_REUSEADDR), with room for `backlog`
  // connections not yet accepted. With port 0 the kernel picks a free port;
  // port() tells which.
  //
  // Errors: the system call that failed and its errno text, e.g.
  // "bind 127.0.0.1:5000: Address already in use".
  static absl::StatusOr<Socket> Listen(const SocketAddress& address, int backlog);

  // A connection to `address`, established before `deadline`.
  //
  // Errors:
  //   DeadlineExceeded  not established by `deadline`; names the address and
  //                     how long was waited.
  //   Unavailable       refused, unreachable or reset; with the errno text.
  static absl::StatusOr<Socket> Connect(const SocketAddress& address, absl::Time deadline);

  Socket() = default;
  Socket(Socket&& other) noexcept;
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  // The next connection on this listener, accepted before `deadline`.
  // DeadlineExceeded names the listening address and how long was waited.
  absl::StatusOr<Socket> Accept(absl::Time deadline);

  // Sends the bytes of every piece, in order, as one stream: pieces go to
  // the kernel together (sendmsg with a gather list, no copy into a staging
  // buffer), and partial writes are continued until all is sent or
  // `deadline` passes. Empty pieces are allowed.
  //
  // Errors:
  //   DeadlineExceeded  the peer did not take everything by `deadline`; says
  //                     how many of the bytes were sent and how long was
  //                     waited. What was sent stays sent: the stream is then
  //                     out of step and the connection should be closed.
  //   Unavailable       the peer closed or reset the connection (EPIPE,
  //                     ECONNRESET), with the errno text.
  absl::Status WriteAll(absl::Span<const absl::Span<const uint8_t>> pieces, absl::Time deadline);

  // Reads exactly `n` bytes into `out`, waiting until `deadline` for them.
  //
  // Errors:
  //   DeadlineExceeded  fewer than `n` bytes came by `deadline`; says how many
  //                     did and how long was waited.
  //   Unavailable       "peer closed the connection after 3 of 16 bytes" at
  //                     end of stream, or a reset with the errno text.
  // On an error the bytes read so far are in `out` but consumed from the
  // stream: the connection should be closed.
  absl::Status ReadExact(void* out, size_t n, absl::Time deadline);

  // Without waiting: reads into `out` at most `n` of the bytes that have
  // arrived, and returns how many (0 when none has). For a thread that
  // serves many connections (IslandServer's handshakes); Wait says when to
  // call again. Errors: as ReadExact's Unavailable ("peer closed the
  // connection after 0 of 16 bytes" at end of stream; the caller's count of
  // what it has of `n` goes in the message).
  absl::StatusOr<size_t> ReadSome(void* out, size_t n);

  // Without waiting: sends as much of `bytes` as the kernel takes now, and
  // returns how many (0 when it takes none). Errors: as WriteAll's
  // Unavailable.
  absl::StatusOr<size_t> WriteSome(absl::Span<const uint8_t> bytes);

  // Waits until the socket is ready for `events` (POLLIN, POLLOUT), or has
  // an error or hangup that the next call reports: true; false when
  // `deadline` came first.
  absl::StatusOr<bool> Wait(short events, absl::Time deadline) const;

  // Shuts down both directions: the peer reads end of stream, and reads and
  // writes blocked in other threads return at once. The descriptor stays
  // open until Close or destruction. Does nothing on an invalid socket.
  void ShutdownBoth();

  // Closes the descriptor; the socket becomes invalid. Idempotent.
  void Close();

  bool valid() const { return fd_ >= 0; }
  // The file descriptor, still owned by this socket; -1 when invalid.
  int fd() const { return fd_; }
  // The bound port: of a listener, the one the kernel picked for port 0.
  uint16_t port() const { return local_.port(); }
  // Where this socket is bound. For an accepted connection this is the
  // address the peer reached, so a connection to a wildcard listener tells
  // whether it came over loopback.
  const SocketAddress& local_address() const { return local_; }
  // The other end of a connection; unspecified for a listener.
  const SocketAddress& peer_address() const { return peer_; }

 private:
  Socket(int fd, SocketAddress local, SocketAddress peer)
      : fd_(fd), local_(std::move(local)), peer_(std::move(peer)) {}

  // The status of a call on an invalid socket.
  absl::Status InvalidSocketError(absl::string_view operation) const;

  int fd_ = -1;
  SocketAddress local_;
  SocketAddress peer_;
};

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_SOCKET_H_
