// A connection between two islands: a socket past the handshake that carries
// control messages (control.proto) both ways, heartbeats, and a goodbye.
//
// Either side may call the other: Call sends a Request and waits, until a
// deadline, for the Response with the same id; Notify sends one that gets no
// response. Requests from the peer go to the RequestHandler given at
// creation. SendData sends bulk bytes in data frames written straight from
// the caller's memory; the peer's DataSink says where they go and they are
// read straight into that memory. Each side sends a heartbeat frame
// every `heartbeat_interval`; a peer from which nothing at all (heartbeat,
// message or goodbye) arrives for `peer_timeout` is taken as lost. A lost
// peer, a malformed frame, a message that does not decode, a goodbye or
// Close all fail the connection for good: status() then says why, and every
// waiting and later Call fails with that status.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Connection> connection,
//                    Connection::Connect(address, client_options, ConnectionOptions{}));
//   Request request;
//   request.mutable_ping()->set_payload("hi");
//   CAUSEWAY_ASSIGN_OR_RETURN(Response response,
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
#include "absl/types/span.h"
#include "causeway/transport/frame.h"
#include "causeway/transport/handshake.h"
#include "causeway/transport/socket.h"

namespace causeway::transport {

// The generated messages of control.proto (causeway/transport/control.pb.h), which
// callers include to build requests and read responses.
class DataHeader;
class Envelope;
class Request;
class Response;

// The most bytes one data frame of SendData carries. A larger SendData goes
// as several chunks, each a DataHeader and its data frame, and other frames
// (heartbeats, calls, other SendData) may come between chunks.
inline constexpr uint64_t kDataChunkBytes = uint64_t{64} << 20;

// Where incoming bulk bytes go. Both run on the reader thread, one chunk at a
// time and in order of arrival; like a RequestHandler they should be quick.
struct DataSink {
  // Given a DataHeader, returns where its `length` bytes go (the memory must
  // stay valid until `end` is called for it, or until the Connection is
  // destroyed if the connection fails first), or nullptr to have them read
  // and dropped (then `end` is not called), or an error, which fails the
  // connection (DataLoss with the sink's message, the peer told why in a
  // goodbye). The header has been checked: length <= kMaxDataPayload and
  // offset + length <= total.
  std::function<absl::StatusOr<uint8_t*>(const DataHeader&)> begin;
  // Called once the bytes are in place.
  std::function<void(const DataHeader&)> end;
};

struct ConnectionOptions {
  // How often this side sends a heartbeat.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // How long the peer may stay silent before the connection fails. Also the
  // time a whole frame (a large one included) has to arrive once begun; a
  // chunk's data frame begins once the sink's `begin` has returned.
  absl::Duration peer_timeout = absl::Seconds(5);
  // Where bulk data from the peer goes. Without `begin`, a peer that sends
  // bulk data fails the connection with DataLoss ("this side takes no bulk
  // data").
  DataSink data_sink;
};

// Answers a request from the peer. An error status is sent back as the
// Response's `error` and becomes the error of the peer's Call. Runs on the
// connection's reader thread, one request at a time and in order of
// arrival, so it must not wait for a Call on the same connection (its
// response would be read by this very thread) and should be quick: the
// peer's heartbeats are not read meanwhile, so a handler that takes longer
// than peer_timeout fails the connection.
using RequestHandler = std::function<absl::StatusOr<Response>(const Request&)>;

// The status a peer reported as a Status message's fields (`code` an
// absl::StatusCode value): OK for 0, Unknown for a code this side does not
// know, else that code with `message`.
absl::Status StatusFromPeer(int32_t code, std::string message);

// Writes `status` into a message's `code` and `message` fields (a Status, a
// RunDone, a FetchDone, a ChannelFailed): the other half of StatusFromPeer.
template <typename Fields>
void StatusToPeer(const absl::Status& status, Fields* fields) {
  fields->set_code(static_cast<int32_t>(status.code()));
  fields->set_message(std::string(status.message()));
}

// Thread-safe: Call, Notify, SendData, Close and status() may be used from
// any thread at once. Destruction closes the connection if it is still healthy (with the
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

  // Starts the connection on `socket`, whose server handshake has ended
  // welcoming `peer` (ServerHandshakeState, for a server that runs its
  // handshakes without a thread each). ResourceExhausted when its threads
  // cannot be made.
  static absl::StatusOr<std::unique_ptr<Connection>> Adopt(Socket socket, PeerInfo peer,
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

  // Sends `request` as a notification (request_id 0): the peer runs its
  // handler on it and sends no response, and its result, an error included,
  // is dropped. Returns once the request is written, which says nothing of
  // whether the peer has handled it; notifications and calls from one
  // thread are handled by the peer in the order sent.
  //
  // Errors:
  //   InvalidArgument  the request does not fit a control frame (16 MiB);
  //                    nothing was sent and the connection stays healthy.
  //   status()         the connection has failed, or failed while sending
  //                    (a write that fails or misses `deadline` fails the
  //                    connection with Unavailable, as in Call).
  absl::Status Notify(const Request& request, absl::Time deadline);

  // Sends `bytes` as bytes [offset, offset + bytes.size()) of the
  // `total`-byte object named by (`stream`, `tag`), in chunks of at most
  // kDataChunkBytes: each a control frame with a DataHeader and, right after
  // it, a data frame written straight from `bytes` (a gather write, no
  // copy). Other frames may come between chunks, never inside one. Empty
  // `bytes` send one empty chunk. Returns once everything is written, which
  // says nothing of whether the peer's sink has taken it; `bytes` may be
  // reused then. The whole send must finish by `deadline`.
  //
  // Example:
  //   // Both halves of a 1000-byte object, from two places.
  //   CAUSEWAY_RETURN_IF_ERROR(connection->SendData(/*stream=*/3, /*tag=*/1, 0, 1000,
  //                                        absl::MakeConstSpan(head, 600), deadline));
  //   CAUSEWAY_RETURN_IF_ERROR(connection->SendData(3, 1, 600, 1000,
  //                                        absl::MakeConstSpan(tail, 400), deadline));
  //
  // Errors:
  //   InvalidArgument  offset + bytes.size() exceeds `total` (or overflows);
  //                    nothing was sent and the connection stays healthy.
  //   status()         the connection has failed, or failed while sending
  //                    (a write that fails or misses `deadline` fails the
  //                    connection with Unavailable, as in Call).
  absl::Status SendData(uint64_t stream, uint64_t tag, uint64_t offset, uint64_t total,
                        absl::Span<const uint8_t> bytes, absl::Time deadline);

  // Sends the peer a goodbye carrying `reason` (cut to fit a goodbye frame)
  // and closes the connection: status() becomes Cancelled with the reason,
  // and the peer's becomes Unavailable with it. Waiting Calls fail. Does
  // nothing on a connection that has already failed.
  void Close(absl::string_view reason);

  // Close, then waits for a handler that is running and joins both
  // threads: no handler runs after it returns. The object stays valid
  // (every send fails at once) for threads that still hold it. Not to be
  // called from a handler.
  void Stop(absl::string_view reason);

  // OK while the connection is healthy; otherwise why it failed, for good:
  //   Unavailable  the peer was silent for peer_timeout, closed or reset the
  //                connection, or said goodbye (with its reason); the
  //                message names the peer and its address.
  //   DataLoss     the peer sent a malformed frame, a control message
  //                that does not decode, a DataHeader out of bounds or not
  //                followed by its data frame, a data frame without a
  //                DataHeader, or bulk data the sink refused (the peer is
  //                told so in a goodbye).
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
  absl::Status Start();

  void ReadLoop();
  void HeartbeatLoop();
  // The status that fails the connection for `error`, from reading a frame
  // that began (or was awaited from) `since`.
  absl::Status ReadFailure(const absl::Status& error, absl::Time since) const;
  // Handles one authenticated frame; an error fails the connection.
  absl::Status HandleFrame(FrameType type, const std::vector<uint8_t>& payload);
  // Runs the handler; answers unless `request_id` is 0 (a notification).
  absl::Status HandleRequest(uint64_t request_id, const Request& request);
  void HandleResponse(uint64_t request_id, Response response);
  // Checks `header`, asks the sink where its bytes go, and reads the data
  // frame that must follow into that memory.
  absl::Status HandleData(const DataHeader& header);
  // Fails the connection for a write that failed with `sent` while sending
  // `what`; the connection's status.
  absl::Status FailedSending(absl::string_view what, const absl::Status& sent);
  // After a failed write: waits up to kLastWordsWait for the reader to fail
  // the connection with what the peer said last (its goodbye), unless this
  // is the reader.
  void AwaitPeersLastWords() ABSL_LOCKS_EXCLUDED(mu_);
  static constexpr absl::Duration kLastWordsWait = absl::Milliseconds(250);

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
