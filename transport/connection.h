// A connection between two islands: a socket past the handshake that carries
// control messages (control.proto) both ways, heartbeats, and a goodbye.
//
// Either side may call the other: Call sends a Request and waits, until a
// deadline, for the Response with the same id; requests from the peer go to
// the RequestHandler given at creation. Each side sends a heartbeat frame
// every `heartbeat_interval`; a peer from which nothing at all (heartbeat,
// message or goodbye) arrives for `peer_timeout` is taken as lost. A lost
// peer, a malformed frame, a message that does not decode, a goodbye or
// Close all fail the connection for good: status() then says why, and every
// waiting and later Call fails with that status.
//
// Example:
//   ASSIGN_OR_RETURN(std::unique_ptr<Connection> connection,
//                    Connection::Connect(address, client_options, ConnectionOptions{}));
//   Request request;
//   request.mutable_ping()->set_payload("hi");
//   ASSIGN_OR_RETURN(Response response,
//                    connection->Call(request, absl::Now() + absl::Seconds(1)));
//   // response.pong().payload() == "hi"
//   connection->Close("done");
#ifndef CAUSEWAY_TRANSPORT_CONNECTION_H_
#define CAUSEWAY_TRANSPORT_CONNECTION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/frame.h"
#include "transport/handshake.h"
#include "transport/socket.h"

namespace causeway::transport {

// The generated messages of control.proto (transport/control.pb.h), which
// callers include to build requests and read responses.
class Envelope;
class Request;
class Response;

struct ConnectionOptions {
  // How often this side sends a heartbeat.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // How long the peer may stay silent before the connection fails. Also the
  // time a whole frame (a large one included) has to arrive once begun.
  absl::Duration peer_timeout = absl::Seconds(5);
};

// Answers a request from the peer. An error status is sent back as the
// Response's `error` and becomes the error of the peer's Call. Runs on the
// connection's reader thread, one request at a time and in order of
// arrival, so it must not wait for a Call on the same connection (its
// response would be read by this very thread) and should be quick: the
// peer's heartbeats are not read meanwhile, so a handler that takes longer
// than peer_timeout fails the connection.
using RequestHandler = std::function<absl::StatusOr<Response>(const Request&)>;

// Thread-safe: Call, Close and status() may be used from any thread at
// once. Destruction closes the connection if it is still healthy (with the
// reason "connection destroyed"), waits for a handler that is running, joins
// both threads and closes the socket; no Call may be running then.
class Connection {
 public:
  // Connects to `address`, runs the client handshake and starts the
  // connection. The connect and the handshake share `handshake.timeout`.
  // Without a handler, every request from the peer is answered Unimplemented.
  // Errors: those of Socket::Connect and ClientHandshake.
  static absl::StatusOr<std::unique_ptr<Connection>> Connect(const SocketAddress& address,
                                                             const ClientHandshakeOptions& handshake,
                                                             const ConnectionOptions& options,
                                                             RequestHandler handler = nullptr);

  // Runs the server handshake on `socket`, just accepted from a listener,
  // and starts the connection. Errors: those of ServerHandshake.
  static absl::StatusOr<std::unique_ptr<Connection>> Accept(Socket socket,
                                                            const ServerHandshakeOptions& handshake,
                                                            const ConnectionOptions& options,
                                                            RequestHandler handler = nullptr);

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  // Sends `request` and waits for its response until `deadline`.
  //
  // Errors:
  //   InvalidArgument   the request does not fit a control frame (16 MiB);
  //                     nothing was sent and the connection stays healthy.
  //   DeadlineExceeded  no response by `deadline`; names the peer and how long
  //                     was waited. A response arriving later is dropped.
  //   the peer's error  the handler on the other side returned an error: its
  //                     code, and its message after the peer's name.
  //   status()          the connection failed before or while waiting:
  //                     Unavailable for a lost or departed peer, ...
  absl::StatusOr<Response> Call(const Request& request, absl::Time deadline);

  // Sends the peer a goodbye carrying `reason` (cut to fit a goodbye frame)
  // and closes the connection: status() becomes Cancelled with the reason,
  // and the peer's becomes Unavailable with it. Waiting Calls fail. Does
  // nothing on a connection that has already failed.
  void Close(absl::string_view reason);

  // OK while the connection is healthy; otherwise why it failed, for good:
  //   Unavailable  the peer was silent for peer_timeout, closed or reset the
  //                connection, or said goodbye (with its reason); the
  //                message names the peer and its address.
  //   DataLoss     the peer sent a malformed frame or a control message
  //                that does not decode (the peer is told so in a goodbye).
  //   Cancelled    this side called Close, or the connection was destroyed.
  absl::Status status() const;

  // The peer, as the handshake established it.
  const PeerInfo& peer() const { return peer_; }
  const SocketAddress& peer_address() const { return socket_.peer_address(); }
  // "'island-1' (127.0.0.1:5000)": how messages name the peer.
  const std::string& peer_description() const { return peer_description_; }

 private:
  // A Call waiting for its response. Lives on the caller's stack.
  struct PendingCall {
    bool done = false;
    absl::StatusOr<Response>* result = nullptr;
  };

  Connection(Socket socket, PeerInfo peer, const ConnectionOptions& options, RequestHandler handler);
  void Start();

  void ReadLoop();
  void HeartbeatLoop();
  // Handles one authenticated frame; an error fails the connection.
  absl::Status HandleFrame(FrameType type, const std::vector<uint8_t>& payload);
  absl::Status HandleRequest(uint64_t request_id, const Request& request);
  void HandleResponse(uint64_t request_id, Response response);

  // Sends `envelope` in a frame of `type`. Serializes writers.
  absl::Status Send(FrameType type, const Envelope& envelope, absl::Time deadline);
  // Fails the connection with `why` if it is still healthy: sets status(),
  // completes every PendingCall with it and shuts the socket down. With a
  // `goodbye` reason, first tells the peer (best effort).
  void Fail(const absl::Status& why, std::optional<absl::string_view> goodbye);

  Socket socket_;  // reads on the reader thread; writes under write_mu_
  const PeerInfo peer_;
  const std::string peer_description_;
  const ConnectionOptions options_;
  const RequestHandler handler_;

  // Held while a frame is written, never together with mu_.
  absl::Mutex write_mu_;

  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, PendingCall*> pending_ ABSL_GUARDED_BY(mu_);

  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_CONNECTION_H_
