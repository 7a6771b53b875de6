// Test helpers of the transport tests: connected loopback sockets and
// deadlines.
#ifndef CAUSEWAY_TESTS_TRANSPORT_LOOPBACK_H_
#define CAUSEWAY_TESTS_TRANSPORT_LOOPBACK_H_

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/base/status.h"
#include "causeway/transport/socket.h"

namespace causeway::transport::testing {

// The deadline `d` from now.
inline absl::Time In(absl::Duration d) { return absl::Now() + d; }

inline absl::Span<const uint8_t> AsBytes(absl::string_view text) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size());
}

// A listener on 127.0.0.1 at a port the kernel picked.
inline absl::StatusOr<Socket> ListenOnLoopback() {
  CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress any_port, SocketAddress::Parse("127.0.0.1:0"));
  return Socket::Listen(any_port, 16);
}

// Where `listener` can be reached over loopback.
inline absl::StatusOr<SocketAddress> AddressOf(const Socket& listener) {
  return SocketAddress::Parse(absl::StrCat("127.0.0.1:", listener.port()));
}

// Both ends of one loopback connection. The kernel completes a connection
// to a listener before it is accepted, so one thread can make both.
struct SocketPair {
  Socket client;
  Socket server;
};
inline absl::StatusOr<SocketPair> ConnectedPair() {
  CAUSEWAY_ASSIGN_OR_RETURN(Socket listener, ListenOnLoopback());
  CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress address, AddressOf(listener));
  CAUSEWAY_ASSIGN_OR_RETURN(Socket client, Socket::Connect(address, In(absl::Seconds(5))));
  CAUSEWAY_ASSIGN_OR_RETURN(Socket server, listener.Accept(In(absl::Seconds(5))));
  return SocketPair{std::move(client), std::move(server)};
}

}  // namespace causeway::transport::testing

#endif  // CAUSEWAY_TESTS_TRANSPORT_LOOPBACK_H_
