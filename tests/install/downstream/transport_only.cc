// Links only causeway::transport: a connection to a port where nothing
// listens must fail with an error, and the program must link at all (its
// connections use the tracer, which is in the base library, and no Vulkan).
#include <cstdio>

#include "absl/status/status.h"
#include "causeway/transport.h"

int main() {
  absl::StatusOr<causeway::transport::SocketAddress> nowhere =
      causeway::transport::SocketAddress::Parse("127.0.0.1:1");
  if (!nowhere.ok()) {
    std::fprintf(stderr, "downstream_transport: %s\n", nowhere.status().ToString().c_str());
    return 1;
  }
  causeway::transport::ClientHandshakeOptions handshake;
  handshake.name = "downstream";
  absl::StatusOr<std::unique_ptr<causeway::transport::Connection>> c =
      causeway::transport::Connection::Connect(*nowhere, handshake, {});
  if (c.ok()) {
    std::fprintf(stderr, "downstream_transport: connected to 127.0.0.1:1, expected an error\n");
    return 1;
  }
  std::printf("downstream_transport: connecting to nothing fails: %s\n", c.status().ToString().c_str());
  return 0;
}
