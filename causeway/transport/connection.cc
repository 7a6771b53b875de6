#include "causeway/transport/connection.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
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
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/frame.h"

namespace causeway::transport {
namespace {

// Room in a goodbye frame for the Envelope around the reason.
constexpr size_t kMaxGoodbyeReasonBytes = kMaxGoodbyePayload - 32;

// The most bytes read at a time when dropping bulk data nobody takes.
constexpr uint64_t kDropBufferBytes = uint64_t{1} << 20;

static_assert(kDataChunkBytes <= kMaxDataPayload, "a chunk must fit a data frame");

absl::Span<const uint8_t> AsBytes(const std::string& bytes) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// The Response that carries `status` back to the caller.
Response ErrorResponse(const absl::Status& status) {
  Response response;
  StatusToPeer(status, response.mutable_error());
  return response;
}

// "data (stream 3, tag 1, bytes [0, 4096) of 8192)", for messages.
std::string Describe(const DataHeader& header) {
  return absl::StrCat("data (stream ", header.stream(), ", tag ", header.tag(), ", bytes [", header.offset(),
                      ", ", header.offset() + header.length(), ") of ", header.total(), ")");
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

absl::Status StatusFromPeer(int32_t code, std::string message) {
  if (code == 0) return absl::OkStatus();
  return absl::Status(PeerCode(code), std::move(message));
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Connect(const SocketAddress& address,
                                                                const ClientHandshakeOptions& handshake,
                                                                const ConnectionOptions& options,
                                                                RequestHandler handler) {
  CAUSEWAY_ASSIGN_OR_RETURN(Socket socket, Socket::Connect(address, absl::Now() + handshake.timeout));
  CAUSEWAY_ASSIGN_OR_RETURN(PeerInfo peer, ClientHandshake(socket, handshake));
  return Adopt(std::move(socket), std::move(peer), options, std::move(handler));
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Accept(Socket socket,
                                                               const ServerHandshakeOptions& handshake,
                                                               const ConnectionOptions& options,
                                                               RequestHandler handler) {
  CAUSEWAY_ASSIGN_OR_RETURN(PeerInfo peer, ServerHandshake(socket, handshake));
  return Adopt(std::move(socket), std::move(peer), options, std::move(handler));
}

absl::StatusOr<std::unique_ptr<Connection>> Connection::Adopt(Socket socket, PeerInfo peer,
                                                              const ConnectionOptions& options,
                                                              RequestHandler handler) {
  std::unique_ptr<Connection> connection(
      new Connection(std::move(socket), std::move(peer), options, std::move(handler)));
  CAUSEWAY_RETURN_IF_ERROR(connection->Start());
  return connection;
}

Connection::Connection(Socket socket, PeerInfo peer, const ConnectionOptions& options, RequestHandler handler)
    : socket_(std::move(socket)),
      peer_(std::move(peer)),
      peer_description_(absl::StrCat("'", peer_.name, "' (", socket_.peer_address().ToString(), ")")),
      options_(options),
      handler_(std::move(handler)) {}

absl::Status Connection::Start() {
  try {
    reader_ = std::thread([this] {
      Tracer::NameThread("connection reader");
      ReadLoop();
    });
    heartbeat_ = std::thread([this] {
      Tracer::NameThread("connection heartbeat");
      HeartbeatLoop();
    });
  } catch (const std::system_error& e) {
    // The destructor closes the connection and joins a reader that started.
    return absl::ResourceExhaustedError(
        absl::StrCat("no thread for the connection with ", peer_description_, ": ", e.what()));
  }
  return absl::OkStatus();
}

Connection::~Connection() { Stop("connection destroyed"); }

void Connection::Stop(absl::string_view reason) {
  Close(reason);
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
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
    // Best effort: the peer may be gone, and a stuck one must not hold us,
    // neither in the write nor behind a writer it stalls (a SendData to a
    // peer that stopped reading holds the write lock for its deadline).
    const absl::Time deadline = absl::Now() + std::min(options_.peer_timeout, absl::Seconds(1));
    std::string bytes;
    const bool serialized = envelope.SerializeToString(&bytes);
    while (serialized) {
      if (write_mu_.TryLock()) {
        WriteFrame(socket_, FrameType::kGoodbye, {AsBytes(bytes)}, deadline).IgnoreError();
        write_mu_.Unlock();
        break;
      }
      if (absl::Now() >= deadline) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
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

void Connection::AwaitPeersLastWords() {
  if (std::this_thread::get_id() == reader_.get_id()) return;  // no one else reads them
  absl::MutexLock lock(&mu_);
  auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !status_.ok(); };
  mu_.AwaitWithTimeout(absl::Condition(&failed), kLastWordsWait);
}

absl::Status Connection::FailedSending(absl::string_view what, const absl::Status& sent) {
  // A peer that closed the connection may have said why just before (a
  // goodbye): the write fails as soon as the peer is gone, while its last
  // frames may still wait for the reader. Given a moment to read them, the
  // reader fails the connection with the peer's reason, which callers get
  // instead of a broken pipe.
  AwaitPeersLastWords();
  // Whatever was written, the stream may now be out of step: the connection
  // is of no further use.
  Fail(absl::UnavailableError(
           absl::StrCat("sending ", what, " to peer ", peer_description_, ": ", sent.message())),
       /*goodbye=*/std::nullopt);
  return status();
}

absl::Status Connection::Notify(const Request& request, absl::Time deadline) {
  if (absl::Status current = status(); !current.ok()) return current;
  Envelope envelope;
  envelope.set_request_id(0);
  *envelope.mutable_request() = request;
  absl::Status sent = Send(FrameType::kControl, envelope, deadline);
  if (sent.ok() || absl::IsInvalidArgument(sent)) return sent;  // too large: nothing was sent
  return FailedSending("a notification", sent);
}

absl::Status Connection::SendData(uint64_t stream, uint64_t tag, uint64_t offset, uint64_t total,
                                  absl::Span<const uint8_t> bytes, absl::Time deadline) {
  const uint64_t size = bytes.size();
  if (offset > total || size > total - offset) {
    return absl::InvalidArgumentError(absl::StrCat("SendData of ", size, " bytes at offset ", offset,
                                                   " (stream ", stream, ", tag ", tag,
                                                   ") runs past the end of the ", total, "-byte object"));
  }
  if (absl::Status current = status(); !current.ok()) return current;
  HostSpan span("relay");
  if (span.active()) {
    span.set_args(absl::StrCat("\"direction\":\"send\",\"bytes\":", size, ",\"tag\":", tag,
                               ",\"peer\":", JsonQuote(peer_description_)));
    static std::atomic<uint64_t> dcn_sent{0};
    Tracer::Get().Counter("DCN bytes sent", -1, static_cast<double>(dcn_sent.fetch_add(size) + size));
  }
  uint64_t sent_bytes = 0;
  do {
    const uint64_t length = std::min(size - sent_bytes, kDataChunkBytes);
    Envelope envelope;
    DataHeader& header = *envelope.mutable_data();
    header.set_stream(stream);
    header.set_tag(tag);
    header.set_offset(offset + sent_bytes);
    header.set_length(length);
    header.set_total(total);
    std::string header_bytes;
    if (!envelope.SerializeToString(&header_bytes)) {
      return absl::InternalError(
          absl::StrCat("could not serialize a DataHeader for peer ", peer_description_));
    }
    // Both frames in one gather write, the payload straight from `bytes`.
    const std::array<uint8_t, kFrameHeaderSize> control_frame =
        EncodeFrameHeader(FrameType::kControl, header_bytes.size());
    const std::array<uint8_t, kFrameHeaderSize> data_frame = EncodeFrameHeader(FrameType::kData, length);
    const absl::Span<const uint8_t> pieces[] = {control_frame, AsBytes(header_bytes), data_frame,
                                                bytes.subspan(sent_bytes, length)};
    absl::Status sent;
    {
      absl::MutexLock lock(&write_mu_);
      sent = socket_.WriteAll(pieces, deadline);
    }
    if (!sent.ok()) return FailedSending(Describe(header), sent);
    sent_bytes += length;
  } while (sent_bytes < size);
  return absl::OkStatus();
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
    FailedSending("a request", sent).IgnoreError();
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
      AwaitPeersLastWords();
      Fail(absl::UnavailableError(
               absl::StrCat("sending a heartbeat to peer ", peer_description_, ": ", sent.message())),
           /*goodbye=*/std::nullopt);
      return;
    }
  }
}

absl::Status Connection::ReadFailure(const absl::Status& error, absl::Time since) const {
  if (absl::IsDeadlineExceeded(error)) {
    return absl::UnavailableError(
        absl::StrCat("peer ", peer_description_, " was silent for ",
                     absl::FormatDuration(absl::Trunc(absl::Now() - since, absl::Milliseconds(1))),
                     " (peer_timeout ", absl::FormatDuration(options_.peer_timeout), "): ", error.message()));
  }
  if (absl::IsUnavailable(error)) {
    return absl::UnavailableError(
        absl::StrCat("lost the connection to peer ", peer_description_, ": ", error.message()));
  }
  // A header this side refuses: the stream can no longer be trusted.
  return absl::DataLossError(
      absl::StrCat("malformed frame from peer ", peer_description_, ": ", error.message()));
}

void Connection::ReadLoop() {
  absl::Time last_heard = absl::Now();
  while (true) {
    const absl::Time deadline = last_heard + options_.peer_timeout;
    // Every type's own bound applies; a data frame is never read here.
    absl::StatusOr<FrameHeader> header =
        ReadFrameHeader(socket_, /*authenticated=*/true, kMaxDataPayload, deadline);
    std::vector<uint8_t> payload;
    absl::Status handled;
    if (!header.ok()) {
      handled = ReadFailure(header.status(), last_heard);
    } else if (header->type == FrameType::kData) {
      handled = absl::DataLossError(absl::StrCat("a data frame of ", header->length, " bytes from peer ",
                                                 peer_description_, " came without a DataHeader before it"));
    } else {
      payload.resize(header->length);
      if (absl::Status read = socket_.ReadExact(payload.data(), payload.size(), deadline); !read.ok()) {
        handled = ReadFailure(
            absl::Status(read.code(), absl::StrCat("reading the payload of a ", FrameTypeName(header->type),
                                                   " frame: ", read.message())),
            last_heard);
      } else {
        last_heard = absl::Now();
        handled = HandleFrame(header->type, payload);
      }
    }
    if (!handled.ok()) {
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
        case Envelope::kData:
          return HandleData(envelope.data());
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
  if (request_id == 0) return absl::OkStatus();  // a notification: no response, its result dropped
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

absl::Status Connection::HandleData(const DataHeader& header) {
  if (header.length() > kMaxDataPayload) {
    return absl::DataLossError(absl::StrCat("data (stream ", header.stream(), ", tag ", header.tag(),
                                            ") from peer ", peer_description_, ": length ", header.length(),
                                            " exceeds the ", kMaxDataPayload, "-byte bound of a data frame"));
  }
  if (header.offset() > header.total() || header.length() > header.total() - header.offset()) {
    return absl::DataLossError(absl::StrCat("data (stream ", header.stream(), ", tag ", header.tag(),
                                            ") from peer ", peer_description_, ": ", header.length(),
                                            " bytes at offset ", header.offset(), " run past the end of the ",
                                            header.total(), "-byte object"));
  }
  if (!options_.data_sink.begin) {
    return absl::DataLossError(
        absl::StrCat(Describe(header), " from peer ", peer_description_, ": this side takes no bulk data"));
  }
  absl::StatusOr<uint8_t*> where = options_.data_sink.begin(header);
  if (!where.ok()) {
    return absl::DataLossError(absl::StrCat(Describe(header), " from peer ", peer_description_,
                                            " refused by this side's sink: ", where.status().message()));
  }
  // The data frame follows at once: it begins now, after the sink's time.
  const absl::Time begun = absl::Now();
  const absl::Time deadline = begun + options_.peer_timeout;
  absl::StatusOr<FrameHeader> frame =
      ReadFrameHeader(socket_, /*authenticated=*/true, kMaxDataPayload, deadline);
  if (!frame.ok()) return ReadFailure(frame.status(), begun);
  if (frame->type != FrameType::kData || frame->length != header.length()) {
    return absl::DataLossError(absl::StrCat(Describe(header), " from peer ", peer_description_,
                                            " must be followed by a data frame of ", header.length(),
                                            " bytes, got a ", FrameTypeName(frame->type), " frame of ",
                                            frame->length, " bytes"));
  }
  absl::Status read;
  HostSpan span("relay");
  if (span.active()) {
    span.set_args(absl::StrCat("\"direction\":\"receive\",\"bytes\":", header.length(), ",\"tag\":",
                               header.tag(), ",\"peer\":", JsonQuote(peer_description_)));
    static std::atomic<uint64_t> dcn_received{0};
    Tracer::Get().Counter("DCN bytes received", -1,
                          static_cast<double>(dcn_received.fetch_add(header.length()) + header.length()));
  }
  if (*where != nullptr) {
    read = socket_.ReadExact(*where, header.length(), deadline);
  } else {
    std::vector<uint8_t> scratch(std::min(header.length(), kDropBufferBytes));
    for (uint64_t dropped = 0; read.ok() && dropped < header.length(); dropped += scratch.size()) {
      read = socket_.ReadExact(scratch.data(), std::min<uint64_t>(scratch.size(), header.length() - dropped),
                               deadline);
    }
  }
  if (!read.ok()) {
    return ReadFailure(absl::Status(read.code(), absl::StrCat("reading the payload of ", Describe(header),
                                                              ": ", read.message())),
                       begun);
  }
  if (*where != nullptr && options_.data_sink.end) options_.data_sink.end(header);
  return absl::OkStatus();
}

}  // namespace causeway::transport
