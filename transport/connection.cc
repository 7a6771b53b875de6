#include "transport/connection.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/status.h"
#include "transport/control.pb.h"
#include "transport/frame.h"

namespace causeway::transport {
namespace {

// Room in a goodbye frame for the Envelope around the reason.
constexpr size_t kMaxGoodbyeReasonBytes = kMaxGoodbyePayload - 32;

absl::Span<const uint8_t> AsBytes(const std::string& bytes) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// The Response that carries `status` back to the caller.
Response ErrorResponse(const absl::Status& status) {
  Response response;
  response.mutable_error()->set_code(static_cast<int32_t>(status.code()));
  response.mutable_error()->set_message(std::string(status.message()));
  return response;
}

// The code of a Status message from the peer, as an absl code; an
// out-of-range or OK code (the peer's bug) becomes Unknown.
absl::StatusCode PeerCode(int32_t code) {
  if (code <= 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> Connection::Connect(const SocketAddress& address,
                                                                const ClientHandshakeOptions& handshake,
                                                                const ConnectionOptions& options,
                                                                RequestHandler handler) {
  ASSIGN_OR_RETURN(Socket socket, Socket::Connect(address, absl::Now() + handshake.timeout));
  ASSIGN_OR_RETURN(PeerInfo peer, ClientHandshake(socket, handshake));
  std::unique_ptr<Connection> connection(
      new Connection(std::move(socket), std::move(peer), options, std::move(handler)));
  connection->Start();
  return connection;
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Accept(Socket socket,
                                                               const ServerHandshakeOptions& handshake,
                                                               const ConnectionOptions& options,
                                                               RequestHandler handler) {
  ASSIGN_OR_RETURN(PeerInfo peer, ServerHandshake(socket, handshake));
  std::unique_ptr<Connection> connection(
      new Connection(std::move(socket), std::move(peer), options, std::move(handler)));
  connection->Start();
  return connection;
}

Connection::Connection(Socket socket, PeerInfo peer, const ConnectionOptions& options, RequestHandler handler)
    : socket_(std::move(socket)),
      peer_(std::move(peer)),
      peer_description_(absl::StrCat("'", peer_.name, "' (", socket_.peer_address().ToString(), ")")),
      options_(options),
      handler_(std::move(handler)) {}

void Connection::Start() {
  reader_ = std::thread([this] { ReadLoop(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
}

Connection::~Connection() {
  Close("connection destroyed");
  reader_.join();
  heartbeat_.join();
}

absl::Status Connection::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status Connection::Send(FrameType type, const Envelope& envelope, absl::Time deadline) {
  std::string bytes;
  if (!envelope.SerializeToString(&bytes)) {
    return absl::InternalError(
        absl::StrCat("could not serialize a control message for peer ", peer_description_));
  }
  absl::MutexLock lock(&write_mu_);
  return WriteFrame(socket_, type, {AsBytes(bytes)}, deadline);
}

void Connection::Fail(const absl::Status& why, std::optional<absl::string_view> goodbye) {
  std::map<uint64_t, PendingCall*> pending;
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return;
    status_ = why;
    pending.swap(pending_);
    for (auto& [id, call] : pending) {
      *call->result = why;
      call->done = true;
    }
  }
  if (goodbye.has_value()) {
    Envelope envelope;
    envelope.mutable_goodbye()->set_reason(std::string(goodbye->substr(0, kMaxGoodbyeReasonBytes)));
    // Best effort: the peer may be gone, and a stuck one must not hold us.
    Send(FrameType::kGoodbye, envelope, absl::Now() + std::min(options_.peer_timeout, absl::Seconds(1)))
        .IgnoreError();
  }
  // Wakes the reader (and a heartbeat stuck in a write); the peer reads end
  // of stream.
  socket_.ShutdownBoth();
}

void Connection::Close(absl::string_view reason) {
  reason = reason.substr(0, kMaxGoodbyeReasonBytes);
  Fail(absl::CancelledError(absl::StrCat("connection to peer ", peer_description_, " closed: ", reason)),
       reason);
}

absl::StatusOr<Response> Connection::Call(const Request& request, absl::Time deadline) {
  absl::StatusOr<Response> result = absl::UnknownError("no response");
  PendingCall call;
  call.result = &result;
  Envelope envelope;
  {
    absl::MutexLock lock(&mu_);
    if (!status_.ok()) return status_;
    envelope.set_request_id(next_request_id_++);
    pending_[envelope.request_id()] = &call;
  }
  *envelope.mutable_request() = request;
  const absl::Time start = absl::Now();
  if (absl::Status sent = Send(FrameType::kControl, envelope, deadline); !sent.ok()) {
    if (absl::IsInvalidArgument(sent)) {  // too large: nothing was sent
      absl::MutexLock lock(&mu_);
      pending_.erase(envelope.request_id());
      return sent;
    }
    // Whatever was written, the stream may now be out of step: the
    // connection is of no further use.
    Fail(absl::UnavailableError(
             absl::StrCat("sending a request to peer ", peer_description_, ": ", sent.message())),
         /*goodbye=*/std::nullopt);
    absl::MutexLock lock(&mu_);
    if (!call.done) {
      pending_.erase(envelope.request_id());
      return sent;
    }
    return result;
  }
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithDeadline(absl::Condition(&call.done), deadline)) {
    pending_.erase(envelope.request_id());
    return absl::DeadlineExceededError(absl::StrCat(
        "no response from peer ", peer_description_, " to request ", envelope.request_id(), " within ",
        absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))));
  }
  return result;
}

void Connection::HeartbeatLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !status_.ok(); };
      if (mu_.AwaitWithTimeout(absl::Condition(&failed), options_.heartbeat_interval)) return;
    }
    absl::Status sent;
    {
      absl::MutexLock lock(&write_mu_);
      sent = WriteFrame(socket_, FrameType::kHeartbeat, {}, absl::Now() + options_.peer_timeout);
    }
    if (!sent.ok()) {
      Fail(absl::UnavailableError(
               absl::StrCat("sending a heartbeat to peer ", peer_description_, ": ", sent.message())),
           /*goodbye=*/std::nullopt);
      return;
    }
  }
}

void Connection::ReadLoop() {
  absl::Time last_heard = absl::Now();
  while (true) {
    absl::StatusOr<Frame> frame =
        ReadFrame(socket_, /*authenticated=*/true, kMaxControlPayload, last_heard + options_.peer_timeout);
    if (!frame.ok()) {
      const absl::Status& error = frame.status();
      if (absl::IsDeadlineExceeded(error)) {
        Fail(absl::UnavailableError(absl::StrCat(
                 "peer ", peer_description_, " was silent for ",
                 absl::FormatDuration(absl::Trunc(absl::Now() - last_heard, absl::Milliseconds(1))),
                 " (peer_timeout ", absl::FormatDuration(options_.peer_timeout), "): ", error.message())),
             /*goodbye=*/std::nullopt);
      } else if (absl::IsUnavailable(error)) {
        Fail(absl::UnavailableError(
                 absl::StrCat("lost the connection to peer ", peer_description_, ": ", error.message())),
             /*goodbye=*/std::nullopt);
      } else {
        // A header this side refuses: the stream can no longer be trusted.
        absl::Status why = absl::DataLossError(
            absl::StrCat("malformed frame from peer ", peer_description_, ": ", error.message()));
        Fail(why, why.message());
      }
      return;
    }
    last_heard = absl::Now();
    if (absl::Status handled = HandleFrame(frame->type, frame->payload); !handled.ok()) {
      // Tell a peer that broke the protocol why it is dropped.
      Fail(handled,
           absl::IsDataLoss(handled) ? std::optional<absl::string_view>(handled.message()) : std::nullopt);
      return;
    }
    if (!status().ok()) return;  // closed meanwhile
    // Time spent in the handler is not the peer's silence.
    last_heard = absl::Now();
  }
}

absl::Status Connection::HandleFrame(FrameType type, const std::vector<uint8_t>& payload) {
  switch (type) {
    case FrameType::kHeartbeat:
      return absl::OkStatus();
    case FrameType::kGoodbye: {
      Envelope envelope;
      std::string reason = "(no reason given)";
      if (envelope.ParseFromArray(payload.data(), static_cast<int>(payload.size())) &&
          envelope.has_goodbye()) {
        reason = envelope.goodbye().reason();
      }
      return absl::UnavailableError(
          absl::StrCat("peer ", peer_description_, " closed the connection: ", reason));
    }
    case FrameType::kControl: {
      Envelope envelope;
      if (!envelope.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
        return absl::DataLossError(absl::StrCat("control frame of ", payload.size(), " bytes from peer ",
                                                peer_description_, " is not a control message (Envelope)"));
      }
      switch (envelope.body_case()) {
        case Envelope::kRequest:
          return HandleRequest(envelope.request_id(), envelope.request());
        case Envelope::kResponse:
          HandleResponse(envelope.request_id(), std::move(*envelope.mutable_response()));
          return absl::OkStatus();
        case Envelope::kGoodbye:
          return absl::UnavailableError(absl::StrCat(
              "peer ", peer_description_, " closed the connection: ", envelope.goodbye().reason()));
        case Envelope::BODY_NOT_SET:
          break;
      }
      return absl::DataLossError(absl::StrCat("control message ", envelope.request_id(), " from peer ",
                                              peer_description_,
                                              " has no body, or one this side does not know"));
    }
    default:
      return absl::DataLossError(absl::StrCat("unexpected ", FrameTypeName(type), " frame from peer ",
                                              peer_description_, " on a control connection"));
  }
}

absl::Status Connection::HandleRequest(uint64_t request_id, const Request& request) {
  absl::StatusOr<Response> response = absl::UnimplementedError("this side has no handler for requests");
  if (request.kind_case() == Request::KIND_NOT_SET) {
    response = absl::UnimplementedError("a request of a kind this side does not know");
  } else if (handler_) {
    response = handler_(request);
  }
  Envelope reply;
  reply.set_request_id(request_id);
  *reply.mutable_response() = response.ok() ? *std::move(response) : ErrorResponse(response.status());
  absl::Status sent = Send(FrameType::kControl, reply, absl::Now() + options_.peer_timeout);
  if (absl::IsInvalidArgument(sent)) {  // a response too large: nothing was sent
    *reply.mutable_response() = ErrorResponse(sent);
    sent = Send(FrameType::kControl, reply, absl::Now() + options_.peer_timeout);
  }
  if (!sent.ok()) {
    return absl::UnavailableError(
        absl::StrCat("sending response ", request_id, " to peer ", peer_description_, ": ", sent.message()));
  }
  return absl::OkStatus();
}

void Connection::HandleResponse(uint64_t request_id, Response response) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(request_id);
  if (it == pending_.end()) return;  // its Call gave up at its deadline
  PendingCall* call = it->second;
  pending_.erase(it);
  if (response.has_error()) {
    *call->result = absl::Status(PeerCode(response.error().code()),
                                 absl::StrCat("peer ", peer_description_, ": ", response.error().message()));
  } else {
    *call->result = std::move(response);
  }
  call->done = true;
}

}  // namespace causeway::transport
