#include "causeway/distributed/island_server.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <system_error>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/base/byte_ranges.h"
#include "causeway/base/checked_size.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/distributed/island.pb.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/host_budget.h"
#include "causeway/scheduler/inbox.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/program_def.pb.h"
#include "causeway/transport/control.pb.h"

namespace causeway::transport {
namespace {

// How long a channel's data may take to leave once begun.
constexpr absl::Duration kSendDeadline = absl::Seconds(60);

Response IslandReply(const IslandResponse& reply) {
  Response response;
  response.set_island(reply.SerializeAsString());
  return response;
}

Request IslandCall(const IslandRequest& request) {
  Request out;
  out.set_island(request.SerializeAsString());
  return out;
}

uint64_t NextSessionSerial() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

// Runs jobs one at a time, in order, on a thread of its own.
class JobQueue {
 public:
  explicit JobQueue(std::string name)
      : thread_([this, name = std::move(name)] {
          Tracer::NameThread(name);
          Loop();
        }) {}
  ~JobQueue() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Push(std::function<void()> job) {
    absl::MutexLock lock(&mu_);
    jobs_.push_back(std::move(job));
  }

 private:
  void Loop() {
    while (true) {
      std::function<void()> job;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (jobs_.empty()) return;  // stopping, and nothing left
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<std::function<void()>> jobs_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace

// The receiving end of a channel: an inbox fed by the peer's data frames.
class IslandServer::Receiver : public Channel {
 public:
  // Takes no bytes until set_max_total gives the declared size of what it
  // receives.
  Receiver(uint64_t id, std::string peer)
      : id_(id),
        peer_(std::move(peer)),
        inbox_(absl::StrCat("channel ", id, " from island '", peer_, "'"), /*max_total=*/0) {}
  Future<> Send(uint64_t, uint64_t, uint64_t, std::shared_ptr<Buffer>, Future<>) override {
    return Future<>::Ready(absl::InternalError(absl::StrCat(Describe(), " only receives")));
  }
  Future<> Receive(uint64_t tag, uint64_t total, std::vector<Target> targets) override {
    return inbox_.Expect(tag, total, std::move(targets));
  }
  void Abandon(uint64_t tag, const absl::Status& why) override { inbox_.Abandon(tag, why); }
  std::string Describe() const override { return inbox_.name(); }
  uint64_t id() const { return id_; }
  const std::string& peer() const { return peer_; }
  Inbox& inbox() { return inbox_; }

 private:
  uint64_t id_;
  std::string peer_;
  Inbox inbox_;
};

// A connection to another island for sending channel data, with a thread
// that writes (sends must not block the completion threads that start them).
class IslandServer::PeerLink {
 public:
  explicit PeerLink(std::unique_ptr<Connection> connection) : connection_(std::move(connection)) {}
  Connection& connection() { return *connection_; }
  void Push(std::function<void()> job) { queue_.Push(std::move(job)); }
  // Tells the peer that `channel`'s values come over this link, ahead of
  // them.
  void OpenChannel(uint64_t channel) {
    Push([this, channel] {
      IslandRequest open;
      open.mutable_channel_open()->set_channel(channel);
      (void)connection_->Notify(IslandCall(open), absl::Now() + kSendDeadline);
    });
  }

 private:
  std::unique_ptr<Connection> connection_;
  JobQueue queue_{"peer sender"};  // destroyed first: its jobs use the connection
};

namespace {

// Bytes of the largest value `program` receives over `channel` (0 if none).
uint64_t ReceivedBytes(const Program& program, const Channel* channel) {
  uint64_t bytes = 0;
  for (const ProgramStep& step : program.steps()) {
    if (step.kind != ProgramStep::kReceive || step.channel.get() != channel || step.outputs.empty()) continue;
    const ProgramValue& value = program.values()[step.outputs[0]];
    absl::StatusOr<uint64_t> value_bytes = CheckedByteSize(value.shape, DTypeSize(value.dtype));
    if (value_bytes.ok()) bytes = std::max(bytes, *value_bytes);
  }
  return bytes;
}

// The sending end of a channel.
class Sender : public Channel, public std::enable_shared_from_this<Sender> {
 public:
  Sender(uint64_t id, std::string peer, std::shared_ptr<IslandServer::PeerLink> link)
      : id_(id), peer_(std::move(peer)), link_(std::move(link)) {}
  Future<> Send(uint64_t tag, uint64_t offset, uint64_t total, std::shared_ptr<Buffer> staging,
                Future<> ready) override {
    auto promise = std::make_shared<Promise<>>();
    Future<> sent = promise->future();
    ready.OnReady([self = shared_from_this(), tag, offset, total, staging = std::move(staging),
                   promise](const absl::Status& status) {
      // The job holds no reference to the link it runs on (a link's queue
      // must not be destroyed from its own thread).
      IslandServer::PeerLink* link = self->link_.get();
      link->Push([link, id = self->id_, what = self->Describe(), tag, offset, total, staging, promise, status] {
        Connection& c = link->connection();
        if (!status.ok()) {
          IslandRequest failed;
          failed.mutable_channel_failed()->set_channel(id);
          failed.mutable_channel_failed()->set_tag(tag);
          StatusToPeer(status, failed.mutable_channel_failed());
          (void)c.Notify(IslandCall(failed), absl::Now() + kSendDeadline);
          promise->Set(status);
          return;
        }
        absl::Status s = c.SendData(
            id, tag, offset, total,
            absl::Span<const uint8_t>(static_cast<const uint8_t*>(staging->mapped()), staging->size()),
            absl::Now() + kSendDeadline);
        if (!s.ok()) s = absl::UnavailableError(absl::StrCat(what, ": ", s.message()));
        promise->Set(s);
      });
    });
    return sent;
  }
  Future<> Receive(uint64_t, uint64_t, std::vector<Target>) override {
    return Future<>::Ready(absl::InternalError(absl::StrCat(Describe(), " only sends")));
  }
  void Abandon(uint64_t, const absl::Status&) override {}  // receives nothing
  std::string Describe() const override { return absl::StrCat("channel ", id_, " to island '", peer_, "'"); }

 private:
  uint64_t id_;
  std::string peer_;
  std::shared_ptr<IslandServer::PeerLink> link_;
};

// "host" of "host:port" (and "[v6]" of "[v6]:port").
std::string HostOf(const SocketAddress& address) {
  std::string text = address.ToString();
  const size_t colon = text.rfind(':');
  return colon == std::string::npos ? text : text.substr(0, colon);
}

}  // namespace

// One accepted connection: a controller (a client of the island) or a peer
// island sending channel data. Its requests run on the connection's reader
// thread, except those that may wait (runs, fetches), which go in order to
// the session's worker, and what waits for devices, to its outbox.
class IslandServer::Session : public std::enable_shared_from_this<Session> {
 public:
  // `socket`'s server handshake has ended, welcoming `peer`.
  Session(IslandServer* server, Socket socket, PeerInfo peer)
      : server_(server),
        source_(HostOf(socket.peer_address())),
        socket_(std::move(socket)),
        peer_(std::move(peer)),
        host_budget_(std::make_shared<HostBudget>(absl::StrCat("session ", serial_, " from ", source_),
                                                  server->options_.session_host_budget,
                                                  server->host_memory_)) {}

  const HostBudget& host_budget() const { return *host_budget_; }

  // Unique among the server's sessions, for the life of the process.
  uint64_t serial() const { return serial_; }

  // Ends the session: fails what waits on this peer's values, closes the
  // connection (joining its threads, so no handler runs after), gives back
  // everything its client held, and drains its worker and outbox. Called
  // once, by the thread that holds the last reference to come (the reaper
  // or the server's destructor).
  void Teardown(const absl::Status& why) {
    FailReceivers(why);
    std::unique_ptr<Connection> connection;
    std::shared_ptr<Client> client;
    {
      absl::MutexLock lock(&mu_);
      connection = std::move(connection_);
      client = client_;
    }
    // Stopped, not destroyed: a job on the worker or the outbox may hold
    // it still; its sends now fail at once, and it goes once they drain.
    if (connection != nullptr) connection->Stop(why.message());
    // A value's chunk the reader had begun when the connection failed is
    // never finished: its run fails rather than wait for it (the reader is
    // gone, so nothing writes into the slot any more).
    if (current_receiver_ != nullptr) {
      current_receiver_->inbox().End(
          current_slot_, absl::UnavailableError(absl::StrCat("the connection from island '", peer_name(),
                                                             "' ended in the middle of a value: ", why.message())));
      current_receiver_.reset();
    }
    if (client != nullptr) client->Close();
    worker_.reset();
    outbox_.reset();
    connection.reset();
    // Everything the session made goes now, not when the last reference to
    // the session does, so that sessions() counts it until it is back.
    {
      absl::flat_hash_map<uint64_t, std::shared_ptr<Mesh>> meshes;
      absl::flat_hash_map<uint64_t, ArrayRef> arrays;
      absl::flat_hash_map<uint64_t, LoadedProgram> programs;
      absl::flat_hash_map<uint64_t, Upload> uploads;
      {
        absl::MutexLock lock(&mu_);
        meshes.swap(meshes_);
        arrays.swap(arrays_);
        programs.swap(programs_);
        uploads.swap(uploads_);
        client_.reset();
      }
    }
    RetireWhenDone();
  }

  // The host the connection came from (its address without the port).
  const std::string& source() const { return source_; }
  void Close(const std::string& why) {
    absl::MutexLock lock(&mu_);
    if (connection_ != nullptr) connection_->Close(why);
    closed_ = true;
  }
  // The connection, for writing outside the lock: Teardown stops it (a
  // write then fails at once) and destroys it only after draining the jobs
  // that may hold it.
  Connection* connection() {
    absl::MutexLock lock(&mu_);
    return connection_.get();
  }
  // What to tell the peer's receivers when this session ends.
  std::string peer_name() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return peer_name_;
  }
  absl::Status status() const {
    absl::MutexLock lock(&mu_);
    return connection_ == nullptr ? absl::OkStatus() : connection_->status();
  }
  // Fails every receive of this controller's programs (it is gone) and
  // takes their channels off the island: values still on their way to them
  // are dropped when they come.
  void FailReceivers(const absl::Status& why) {
    std::vector<std::shared_ptr<Receiver>> receivers;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [id, p] : programs_) receivers.insert(receivers.end(), p.receivers.begin(), p.receivers.end());
    }
    server_->RemoveReceivers(receivers);
    for (auto& r : receivers) r->inbox().Close(why);
  }

 private:
  struct LoadedProgram {
    std::shared_ptr<Executable> exe;
    std::vector<std::shared_ptr<Receiver>> receivers;
  };
  struct Upload {
    std::vector<uint8_t> bytes;
    HostCharge charge;  // of the session's host budget, for `bytes`
    ByteRanges begun;  // each byte once: bytes sent twice fail the session
  };

 public:
  // Serves the connection, on its own reader thread from now on.
  // ResourceExhausted when its threads cannot be made.
  absl::Status Start() {
    ConnectionOptions options = server_->options_.connection;
    std::weak_ptr<Session> weak = shared_from_this();
    options.data_sink.begin = [weak](const DataHeader& h) -> absl::StatusOr<uint8_t*> {
      auto self = weak.lock();
      if (self == nullptr) return nullptr;
      return self->BeginData(h);
    };
    options.data_sink.end = [weak](const DataHeader& h) {
      if (auto self = weak.lock()) self->EndData(h);
    };
    const std::string peer_name = peer_.name;
    CAUSEWAY_ASSIGN_OR_RETURN(auto connection,
                              Connection::Adopt(std::move(socket_), std::move(peer_), options,
                                                [weak](const Request& r) -> absl::StatusOr<Response> {
                                                  auto self = weak.lock();
                                                  if (self == nullptr)
                                                    return absl::UnavailableError("session ended");
                                                  return self->Handle(r);
                                                }));
    absl::MutexLock lock(&mu_);
    peer_name_ = peer_name;
    connection_ = std::move(connection);
    serving_ = true;
    if (closed_) connection_->Close("the island is shutting down");
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<std::shared_ptr<Client>> client() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (client_ == nullptr) {
      CAUSEWAY_ASSIGN_OR_RETURN(client_, server_->island_->Connect(peer_name_));
    }
    return client_;
  }

  // Work nobody waits on (an upload, a run whose outputs were released)
  // retires lazily and holds its buffers until then: the accelerators'
  // completion threads retire what is submitted so far as it finishes, so
  // that memory a tenant let go of is back without waiting for the next
  // tenant's work.
  void RetireWhenDone() {
    for (Accelerator* a : server_->runtime_->accelerators()) a->WantCompletion(a->submitted_value());
  }

  absl::StatusOr<uint8_t*> BeginData(const DataHeader& h) {
    if (h.stream() == kUploadStream) {
      absl::MutexLock lock(&mu_);
      auto a = arrays_.find(h.tag());
      // Released meanwhile (or never made): the bytes are dropped, and runs
      // that name the array fail with "no array".
      if (a == arrays_.end()) return nullptr;
      const uint64_t bytes = a->second->shard_bytes() * a->second->shard_count();
      if (h.total() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("upload of ", h.total(), " bytes to array ", h.tag(),
                                                       " of ", bytes, " bytes"));
      }
      Upload& up = uploads_[h.tag()];
      CAUSEWAY_RETURN_IF_ERROR(
          up.begun.Add(h.offset(), h.length(), absl::StrCat("the upload to array ", h.tag())));
      if (up.bytes.empty()) {
        CAUSEWAY_ASSIGN_OR_RETURN(
            up.charge,
            HostBudget::Charge(host_budget_, bytes, absl::StrCat("the upload to array ", h.tag())));
        up.bytes.resize(bytes);
      }
      return up.bytes.data() + h.offset();
    }
    if (h.stream() >= kFirstChannelStream) {
      // No such channel (any more): the values of a program whose
      // controller has gone, still on their way when it went. Dropped.
      // From another than the island the receiver takes values from: not
      // its values (the peer's other channels go on).
      std::shared_ptr<Receiver> r = server_->FindReceiver(h.stream());
      if (r == nullptr || r->peer() != peer_name()) return nullptr;
      absl::StatusOr<Inbox::Slot> slot =
          r->inbox().Begin(h.tag(), h.offset(), h.length(), h.total(), host_budget_);
      if (!slot.ok()) {
        // The run failed or was cancelled here (or failed now, past this
        // session's host budget): drop its bytes.
        if (absl::IsFailedPrecondition(slot.status()) || absl::IsUnavailable(slot.status()) ||
            absl::IsCancelled(slot.status()) || absl::IsAborted(slot.status()) ||
            absl::IsResourceExhausted(slot.status())) {
          return nullptr;
        }
        return slot.status();
      }
      if (slot->data == nullptr) return nullptr;  // the run abandoned its value: dropped
      current_receiver_ = r;
      current_slot_ = *slot;
      return slot->data;
    }
    return absl::InvalidArgumentError(absl::StrCat("an island takes no data on stream ", h.stream()));
  }

  void EndData(const DataHeader& h) {
    if (h.stream() >= kFirstChannelStream) {
      if (current_receiver_ != nullptr) current_receiver_->inbox().End(current_slot_);
      current_receiver_.reset();
      return;
    }
    absl::MutexLock lock(&mu_);
    // Chunks begin and end one at a time, in order: all begun is all in.
    Upload& up = uploads_[h.tag()];
    if (up.begun.bytes() < up.bytes.size()) return;
    // The bytes keep their charge until the worker has written them.
    auto done = std::make_shared<Upload>(std::move(up));
    uploads_.erase(h.tag());
    auto a = arrays_.find(h.tag());
    if (a == arrays_.end()) return;
    ArrayRef array = a->second;
    const uint64_t id = h.tag();
    worker_->Push([this, id, array, done] {
      absl::Status s = array->Upload(done->bytes.data(), done->bytes.size());
      absl::MutexLock lock(&mu_);
      if (s.ok()) {
        failed_uploads_.erase(id);
      } else {
        failed_uploads_[id] = absl::Status(s.code(), absl::StrCat("array ", id, " was not written: ", s.message()));
      }
    });
  }

  absl::StatusOr<Response> Handle(const Request& request) {
    if (request.kind_case() == Request::kPing) {
      Response r;
      r.mutable_pong()->set_payload(request.ping().payload());
      return r;
    }
    if (request.kind_case() == Request::kRegisterIsland || request.kind_case() == Request::kListIslands) {
      if (server_->options_.registry == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("island '", server_->options_.name, "' is not a launch's coordinator"));
      }
      return server_->options_.registry->Handle(request);
    }
    if (request.kind_case() != Request::kIsland) return absl::UnimplementedError("unknown request");
    IslandRequest in;
    if (!in.ParseFromString(request.island())) return absl::InvalidArgumentError("not an IslandRequest");
    IslandResponse out;
    absl::MutexLock lock(&mu_);
    // The connection serves as soon as it starts, perhaps before Start has
    // taken it and the peer's name: a request waits for that (the tenant's
    // client is named by it).
    auto serving = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return serving_ || closed_; };
    mu_.Await(absl::Condition(&serving));
    switch (in.kind_case()) {
      case IslandRequest::kDescribe:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.describe(), out));
        break;
      case IslandRequest::kAllocateMesh:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.allocate_mesh(), out));
        break;
      case IslandRequest::kCreateArray:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.create_array(), out));
        break;
      case IslandRequest::kReleaseArray:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.release_array(), out));
        break;
      case IslandRequest::kLoadProgram:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.load_program(), out));
        break;
      case IslandRequest::kExecute:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.execute(), out));
        break;
      case IslandRequest::kFetch:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.fetch(), out));
        break;
      case IslandRequest::kCancelRuns:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.cancel_runs(), out));
        break;
      case IslandRequest::kCancelRun:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.cancel_run(), out));
        break;
      case IslandRequest::kChannelOpen:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.channel_open(), out));
        break;
      case IslandRequest::kChannelFailed:
        CAUSEWAY_RETURN_IF_ERROR(Serve(in.channel_failed(), out));
        break;
      default:
        return absl::UnimplementedError("an island request of a kind this island does not serve");
    }
    return IslandReply(out);
  }

  // One handler per island request, under the session's lock; what goes
  // back is `out`.
  absl::Status Serve(const DescribeIsland&, IslandResponse& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    IslandInfo* info = out.mutable_info();
    info->set_name(server_->options_.name);
    info->set_accelerators(static_cast<int32_t>(server_->runtime_->size()));
    const DeviceCapabilities& device = server_->runtime_->accelerator(0)->capabilities();
    info->set_device(device.name);
    info->set_device_type(static_cast<int32_t>(device.kind));
    info->set_subgroup_size(device.subgroup_size);
    info->set_max_workgroup_invocations(device.max_workgroup_invocations);
    info->set_max_storage_buffers(device.max_storage_buffers);
    for (int d = 0; d < 3; ++d) {
      info->add_max_workgroup_size(device.max_workgroup_size[d]);
      info->add_max_workgroup_count(device.max_workgroup_count[d]);
    }
    for (size_t i = 0; i < server_->runtime_->size(); ++i) {
      const absl::Status health = server_->runtime_->accelerator(i)->health();
      info->add_out_of_service(health.ok() ? "" : std::string(health.message()));
    }
    return absl::OkStatus();
  }

  absl::Status Serve(const AllocateMesh& req, IslandResponse& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto c, client());
    std::vector<int> dims(req.dims().begin(), req.dims().end());
    CAUSEWAY_ASSIGN_OR_RETURN(auto mesh, c->AllocateMesh(dims));
    meshes_[next_id_] = mesh;
    out.set_id(next_id_++);
    return absl::OkStatus();
  }

  absl::Status Serve(const CreateArray& ca, IslandResponse& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto c, client());
    auto mesh = meshes_.find(ca.mesh());
    if (mesh == meshes_.end()) return absl::NotFoundError(absl::StrCat("no mesh ", ca.mesh()));
    ShardingDef sharding_def;
    if (!sharding_def.ParseFromString(ca.sharding())) return absl::InvalidArgumentError("bad sharding");
    CAUSEWAY_ASSIGN_OR_RETURN(Sharding sharding, FromDef(sharding_def));
    CAUSEWAY_ASSIGN_OR_RETURN(DType dtype, FromDef(static_cast<DTypeDef>(ca.dtype())));
    if (ca.shape_size() < 1 || ca.shape_size() > 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("CreateArray: rank must be 1 to 8, got ", ca.shape_size()));
    }
    Shape shape(ca.shape().begin(), ca.shape().end());
    if (absl::StatusOr<uint64_t> bytes = CheckedByteSize(shape, DTypeSize(dtype)); !bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("CreateArray: ", bytes.status().message()));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef array, c->CreateArray(mesh->second, shape, dtype, sharding));
    arrays_[next_id_] = array;
    out.set_id(next_id_++);
    return absl::OkStatus();
  }

  absl::Status Serve(const ReleaseArray& req, IslandResponse&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t id = req.array();
    if ((!arrays_.contains(id) && !pending_.contains(id)) || released_.contains(id)) {
      return absl::NotFoundError(absl::StrCat("no array ", id));
    }
    // Runs queued before this request may still read it, or make it:
    // it goes after them, in order. Later requests no longer see it.
    released_.insert(id);
    worker_->Push([this, id] {
      ArrayRef dropped;
      absl::MutexLock lock(&mu_);
      released_.erase(id);
      failed_uploads_.erase(id);
      if (auto it = arrays_.find(id); it != arrays_.end()) {
        dropped = std::move(it->second);
        arrays_.erase(it);
      }
      RetireWhenDone();
    });
    return absl::OkStatus();
  }

  absl::Status Serve(const LoadProgram& req, IslandResponse& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    CAUSEWAY_ASSIGN_OR_RETURN(auto c, client());
    ProgramDef def;
    if (!def.ParseFromString(req.program())) {
      return absl::InvalidArgumentError("LoadProgram: not a ProgramDef");
    }
    absl::flat_hash_map<std::string, std::shared_ptr<Mesh>> meshes;
    for (const auto& [name, id] : req.meshes()) {
      auto mesh = meshes_.find(id);
      if (mesh == meshes_.end()) return absl::NotFoundError(absl::StrCat("mesh '", name, "': no mesh ", id));
      meshes[name] = mesh->second;
    }
    absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels;
    LoadedProgram loaded;
    for (const ChannelEnd& end : req.channels()) {
      if (end.id() < kFirstChannelStream) return absl::InvalidArgumentError("channel ids start at 16");
      if (end.send()) {
        CAUSEWAY_ASSIGN_OR_RETURN(auto link, server_->Peer(end.peer_address()));
        link->OpenChannel(end.id());
        channels[end.id()] = std::make_shared<Sender>(end.id(), end.peer_name(), std::move(link));
      } else {
        auto r = std::make_shared<Receiver>(end.id(), end.peer_name());
        channels[end.id()] = r;
        loaded.receivers.push_back(r);
      }
    }
    // Its transfer plans are charged to this session's host budget.
    CAUSEWAY_ASSIGN_OR_RETURN(auto program, BuildProgram(def, meshes, channels, host_budget_));
    CAUSEWAY_ASSIGN_OR_RETURN(loaded.exe, c->Load(program));
    // A peer's data header cannot size an early-arrival buffer beyond
    // what the receive declared.
    for (const auto& r : loaded.receivers) {
      r->inbox().set_max_total(ReceivedBytes(loaded.exe->program(), r.get()));
    }
    CAUSEWAY_RETURN_IF_ERROR(server_->AddReceivers(loaded.receivers));
    for (int o : loaded.exe->program().outputs()) {
      const ProgramValue& v = loaded.exe->program().values()[o];
      ArrayType* t = out.mutable_loaded()->add_outputs();
      for (int64_t d : v.shape) t->add_shape(d);
      t->set_dtype(static_cast<int32_t>(ToDef(v.dtype)));
    }
    programs_[next_id_] = std::move(loaded);
    out.mutable_loaded()->set_id(next_id_++);
    return absl::OkStatus();
  }

  absl::Status Serve(const Execute& ex, IslandResponse& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t program_id = ex.program(), tag = ex.tag();
    auto p = programs_.find(program_id);
    const Executable* known = p != programs_.end() ? p->second.exe.get() : nullptr;
    auto refuse = [&](absl::Status why) {
      // A notification's error is not answered: it comes back as the run's.
      if (known != nullptr) FailSends(*known, tag, why);
      outbox_->Push([this, program_id, tag, why] { ReportRun(program_id, tag, why); });
      return why;
    };
    if (p == programs_.end()) return refuse(absl::NotFoundError(absl::StrCat("no program ", program_id)));
    if (runs_.contains({program_id, tag})) {
      // Not refuse(): the run of that tag is this one's, not to be failed.
      return absl::InvalidArgumentError(
          absl::StrCat("run ", tag, " of program ", program_id, " is already in progress"));
    }
    // An input made by a run queued before this one (pending) is looked
    // up when this run's turn comes; the rest are held from now.
    std::vector<std::pair<uint64_t, ArrayRef>> inputs;
    for (uint64_t id : ex.inputs()) {
      auto a = arrays_.find(id);
      if (released_.contains(id)) {
        return refuse(absl::NotFoundError(absl::StrCat("no array ", id, " (released)")));
      } else if (a != arrays_.end()) {
        inputs.push_back({id, a->second});
      } else if (pending_.contains(id)) {
        inputs.push_back({id, nullptr});
      } else {
        return refuse(absl::NotFoundError(absl::StrCat("no array ", id)));
      }
    }
    const size_t count = p->second.exe->program().outputs().size();
    std::vector<uint64_t> outputs(ex.outputs().begin(), ex.outputs().end());
    if (outputs.empty()) {
      for (size_t i = 0; i < count; ++i) {
        outputs.push_back(next_id_++);
        out.mutable_execute_started()->add_outputs(outputs.back());
      }
    } else if (outputs.size() != count) {
      return refuse(absl::InvalidArgumentError(
          absl::StrCat("program ", program_id, " has ", count, " outputs; ", outputs.size(), " ids given")));
    } else {
      absl::flat_hash_set<uint64_t> given;
      for (uint64_t id : outputs) {
        if (id < kControllerIds || arrays_.contains(id) || pending_.contains(id)) {
          return refuse(
              absl::InvalidArgumentError(absl::StrCat("output id ", id, " is in use or below 2^62")));
        }
        // Twice, one output would replace the other silently.
        if (!given.insert(id).second) {
          return refuse(absl::InvalidArgumentError(absl::StrCat("output id ", id, " is given twice")));
        }
      }
    }
    pending_.insert(outputs.begin(), outputs.end());
    runs_[{program_id, tag}] = std::nullopt;
    auto exe = p->second.exe;
    // Beyond 2^62 us (146,000 years) a deadline is none.
    const absl::Duration deadline = ex.deadline_us() == 0 || ex.deadline_us() > (uint64_t{1} << 62)
                                        ? absl::InfiniteDuration()
                                        : absl::Microseconds(static_cast<int64_t>(ex.deadline_us()));
    worker_->Push([this, exe, inputs, outputs, program_id, tag, deadline] {
      RunJob(exe, inputs, outputs, program_id, tag, deadline);
    });
    return absl::OkStatus();
  }

  absl::Status Serve(const FetchArray& req, IslandResponse&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t array_id = req.array(), fetch = req.fetch();
    worker_->Push([this, array_id, fetch] { FetchJob(array_id, fetch); });
    return absl::OkStatus();
  }

  absl::Status Serve(const CancelRuns& req, IslandResponse&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto p = programs_.find(req.program());
    if (p == programs_.end()) return absl::NotFoundError("no such program");
    for (auto& r : p->second.receivers) r->inbox().Close(absl::AbortedError(req.message()));
    return absl::OkStatus();
  }

  absl::Status Serve(const CancelRun& req, IslandResponse&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // A run not found has ended (or never was): nothing to do.
    const std::pair<uint64_t, uint64_t> key{req.program(), req.tag()};
    auto r = runs_.find(key);
    if (r == runs_.end()) return absl::OkStatus();
    if (!r->second.has_value()) {
      cancelled_.insert(key);
    } else if (client_ != nullptr) {
      CAUSEWAY_RETURN_IF_ERROR(client_->Cancel(*r->second));
    }
    return absl::OkStatus();
  }

  absl::Status Serve(const ChannelOpen& req, IslandResponse&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    server_->OpenChannel(req.channel(), serial_);
    return absl::OkStatus();
  }

  absl::Status Serve(const ChannelFailed& f, IslandResponse&) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    // From the island that sends on the channel, or from the controller
    // that loaded the receiving program (a run's part failed elsewhere):
    // no one else fails a tenant's runs.
    if (auto r = server_->FindReceiver(f.channel());
        r != nullptr && (r->peer() == peer_name_ || Loaded(*r))) {
      r->inbox().Fail(f.tag(), StatusFromPeer(f.code() == 0 ? 2 : f.code(),
                                              absl::StrCat(r->Describe(), ": ", f.message())));
    }
    return absl::OkStatus();
  }

  // Whether `r` receives for a program this session loaded.
  bool Loaded(const Receiver& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, p] : programs_) {
      for (const auto& mine : p.receivers) {
        if (mine.get() == &r) return true;
      }
    }
    return false;
  }

  void Notify(const IslandRequest& note) {
    if (Connection* c = connection()) (void)c->Notify(IslandCall(note), absl::Now() + kSendDeadline);
  }

  // Run `tag` of `exe` will not run here: the islands waiting for its values
  // are told, so that their devices do not wait for them.
  static void FailSends(const Executable& exe, uint64_t tag, const absl::Status& why) {
    for (const ProgramStep& step : exe.program().steps()) {
      if (step.kind == ProgramStep::kSend) (void)step.channel->Send(tag, 0, 0, nullptr, Future<>::Ready(why));
    }
  }

  void ReportRun(uint64_t program_id, uint64_t tag, const absl::Status& s) {
    IslandRequest note;
    RunDone* done = note.mutable_run_done();
    done->set_program(program_id);
    done->set_tag(tag);
    StatusToPeer(s, done);
    Notify(note);
  }

  // On the worker: runs in the order they were asked for.
  void RunJob(const std::shared_ptr<Executable>& exe, const std::vector<std::pair<uint64_t, ArrayRef>>& given,
              const std::vector<uint64_t>& outputs, uint64_t program_id, uint64_t tag,
              absl::Duration deadline) {
    std::shared_ptr<Client> c;
    std::vector<ArrayRef> inputs;
    absl::Status missing;
    {
      absl::MutexLock lock(&mu_);
      c = client_;
      if (cancelled_.erase({program_id, tag}) > 0) {
        missing = absl::CancelledError(absl::StrCat("run ", tag, " of program '", exe->program().name(),
                                                    "' cancelled by its controller before it started"));
      }
      for (const auto& [id, array] : given) {
        if (auto f = failed_uploads_.find(id); f != failed_uploads_.end()) {
          if (missing.ok()) missing = f->second;
        } else if (array != nullptr) {
          inputs.push_back(array);
        } else if (auto a = arrays_.find(id); a != arrays_.end()) {
          inputs.push_back(a->second);
        } else if (missing.ok()) {
          missing = absl::NotFoundError(absl::StrCat("no array ", id, " (the run that makes it failed)"));
        }
      }
    }
    absl::StatusOr<Execution> run = missing.ok() ? c->Execute(exe, inputs, {.tag = tag, .deadline = deadline})
                                                 : absl::StatusOr<Execution>(missing);
    bool cancel_now = false;
    auto report = [this, program_id, tag](const absl::Status& s) { ReportRun(program_id, tag, s); };
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < outputs.size(); ++i) {
        pending_.erase(outputs[i]);
        if (run.ok()) arrays_[outputs[i]] = run->outputs[i];
      }
      if (run.ok()) {
        runs_[{program_id, tag}] = *run;
      } else {
        runs_.erase({program_id, tag});
      }
      // A cancel that came while the run was being started (its entry
      // still empty) applies now.
      cancel_now = cancelled_.erase({program_id, tag}) > 0 && run.ok();
    }
    if (!run.ok()) {
      FailSends(*exe, tag, run.status());
      report(run.status());
      return;
    }
    if (cancel_now) (void)c->Cancel(*run);
    outbox_->Push([this, run = *run, report, program_id, tag] {
      const absl::Status s = run.Await();
      {
        absl::MutexLock lock(&mu_);
        runs_.erase({program_id, tag});
      }
      report(s);
    });
  }

  void FetchJob(uint64_t array_id, uint64_t fetch) {
    ArrayRef array;
    absl::Status failed;
    {
      absl::MutexLock lock(&mu_);
      auto a = arrays_.find(array_id);
      if (a != arrays_.end()) array = a->second;
      if (auto f = failed_uploads_.find(array_id); f != failed_uploads_.end()) failed = f->second;
    }
    outbox_->Push([this, array, array_id, fetch, failed] {
      absl::Status s = failed;
      if (s.ok() && array == nullptr) {
        s = absl::NotFoundError(absl::StrCat("no array ", array_id, " (or the run that makes it failed)"));
      } else if (s.ok()) {
        std::vector<uint8_t> bytes(array->shard_bytes() * array->shard_count());
        s = array->Download(bytes.data(), bytes.size());
        Connection* c = connection();
        if (s.ok() && c != nullptr) {
          s = c->SendData(kFetchStream, fetch, 0, bytes.size(), bytes, absl::Now() + kSendDeadline);
        }
      }
      IslandRequest note;
      note.mutable_fetch_done()->set_fetch(fetch);
      StatusToPeer(s, note.mutable_fetch_done());
      Notify(note);
    });
  }

  IslandServer* server_;
  const uint64_t serial_ = NextSessionSerial();
  const std::string source_;
  // Until Start gives them to the connection.
  Socket socket_;
  PeerInfo peer_;
  // Shared with the charges, which may outlive the session (an early value
  // held by a receiver of another session's program).
  const std::shared_ptr<HostBudget> host_budget_;
  // Touched only on the connection's reader thread, and by Teardown once
  // that thread has ended.
  std::shared_ptr<Receiver> current_receiver_;
  Inbox::Slot current_slot_;

  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  // Set once Run holds the connection and the peer's name; stays set.
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_name_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Connection> connection_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Client> client_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Mesh>> meshes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, ArrayRef> arrays_ ABSL_GUARDED_BY(mu_);
  // Outputs of runs queued on the worker and not yet started: they join
  // arrays_ (or, if the run could not start, are forgotten) in queue order.
  absl::flat_hash_set<uint64_t> pending_ ABSL_GUARDED_BY(mu_);
  // Released, and dropped from arrays_ once the worker reaches the release.
  absl::flat_hash_set<uint64_t> released_ ABSL_GUARDED_BY(mu_);
  // Arrays whose last upload the worker could not write: runs and fetches
  // that name them fail with why, rather than read what was there before.
  absl::flat_hash_map<uint64_t, absl::Status> failed_uploads_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, LoadedProgram> programs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Upload> uploads_ ABSL_GUARDED_BY(mu_);
  // Runs by (program id, tag): queued on the worker (null: not yet
  // started; cancelled_ once the controller cancels one), and started, until
  // reported. A tag names one run at a time.
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::optional<Execution>> runs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::pair<uint64_t, uint64_t>> cancelled_ ABSL_GUARDED_BY(mu_);
  // Made with the session, reset only by Teardown (after the connection,
  // whose reader pushes into them, is gone).
  std::unique_ptr<JobQueue> worker_ = std::make_unique<JobQueue>("session worker");
  std::unique_ptr<JobQueue> outbox_ = std::make_unique<JobQueue>("session outbox");
};

namespace {

// "host:port", with the host cut so that the name is a valid peer name (a
// host name may be longer than kMaxPeerNameBytes, or hold other bytes).
std::string DefaultName(const std::string& host, int port) {
  const std::string suffix = absl::StrCat(":", port);
  std::string name = host.substr(0, kMaxPeerNameBytes - suffix.size());
  for (char& c : name) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return absl::StrCat(name, suffix);
}

}  // namespace

IslandServer::IslandServer(Runtime* runtime, IslandServerOptions options)
    : runtime_(runtime),
      options_(std::move(options)),
      host_memory_(std::make_shared<HostBudget>("the island's sessions", UINT64_MAX)) {}

absl::StatusOr<std::unique_ptr<IslandServer>> IslandServer::Create(Runtime* runtime, IslandServerOptions options) {
  if (!options.name.empty()) CAUSEWAY_RETURN_IF_ERROR(CheckPeerName(options.name));
  CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress where, SocketAddress::Parse(options.listen));
  CAUSEWAY_RETURN_IF_ERROR(CheckListenPolicy(where, options.secret.has_value()));
  std::unique_ptr<IslandServer> server(new IslandServer(runtime, std::move(options)));
  CAUSEWAY_ASSIGN_OR_RETURN(server->listener_, Socket::Listen(where, 64));
  // The address peers reach: the one listened on, with the port the kernel
  // gave; on a wildcard address, this host's name.
  std::string host = where.ToString().substr(0, where.ToString().rfind(':'));
  if (host == "0.0.0.0" || host == "[::]") {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0) host = name;
  }
  server->advertised_ = absl::StrCat(host, ":", server->listener_.port());
  if (server->options_.name.empty()) server->options_.name = DefaultName(host, server->listener_.port());
  server->options_.island.name = server->options_.name;
  CAUSEWAY_ASSIGN_OR_RETURN(server->island_, Island::Create(runtime, server->options_.island));
  CAUSEWAY_ASSIGN_OR_RETURN(server->address_, SocketAddress::Parse(absl::StrCat(
                                                  where.ToString().substr(0, where.ToString().rfind(':')),
                                                  ":", server->listener_.port())));
  server->acceptor_ = std::thread([s = server.get()] {
    Tracer::NameThread("acceptor");
    s->AcceptLoop();
  });
  server->reaper_ = std::thread([s = server.get()] {
    Tracer::NameThread("reaper");
    s->ReapLoop();
  });
  return server;
}

IslandServer::~IslandServer() {
  Shutdown();
  // Not started when Create failed part way (a port in use, no island).
  if (acceptor_.joinable()) acceptor_.join();
  if (reaper_.joinable()) reaper_.join();
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions.swap(sessions_);
    peers_.clear();
    retired_links_.clear();
  }
  for (auto& s : sessions) s->Teardown(absl::CancelledError(absl::StrCat("island '", options_.name, "' shut down")));
  sessions.clear();
  absl::MutexLock lock(&mu_);
  receivers_.clear();
}

void IslandServer::Shutdown() {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    sessions = sessions_;
  }
  for (auto& s : sessions) s->Close(absl::StrCat("island '", options_.name, "' is shutting down"));
}

void IslandServer::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&stopping_));
}

size_t IslandServer::sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

// The connections in their handshake, served by the accept loop.
class IslandServer::Handshakes {
 public:
  struct Entry {
    std::unique_ptr<ServerHandshakeState> state;
    std::string source;  // the host it came from
  };
  std::vector<Entry>& entries() { return entries_; }
  size_t FromSource(const std::string& source) const {
    return std::count_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.source == source; });
  }

 private:
  std::vector<Entry> entries_;
};

void IslandServer::AcceptLoop() {
  Handshakes handshakes;
  std::vector<pollfd> fds;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
    }
    // Wakes for the listener, any handshake's socket, the first handshake
    // deadline, and at least every 100 ms to see Shutdown.
    fds.assign(1, pollfd{listener_.fd(), POLLIN, 0});
    absl::Time wake = absl::Now() + absl::Milliseconds(100);
    for (const Handshakes::Entry& h : handshakes.entries()) {
      fds.push_back(pollfd{h.state->fd(), h.state->events(), 0});
      wake = std::min(wake, h.state->deadline());
    }
    const int64_t ms = std::max<int64_t>(
        0, absl::ToInt64Milliseconds(absl::Ceil(wake - absl::Now(), absl::Milliseconds(1))));
    if (poll(fds.data(), fds.size(), static_cast<int>(ms)) < 0 && errno != EINTR) {
      Refused(absl::StrCat("poll in the accept loop: ", std::strerror(errno)));
      absl::SleepFor(absl::Milliseconds(50));
      continue;
    }
    // Handshakes first (fds[1..] are theirs, in order), then the listener,
    // whose new connections join the list after.
    const absl::Time now = absl::Now();
    std::vector<Handshakes::Entry>& entries = handshakes.entries();
    size_t kept = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      if ((fds[i + 1].revents != 0 || now >= entries[i].state->deadline()) && entries[i].state->Advance()) {
        HandshakeEnded(*entries[i].state);
        continue;
      }
      if (kept != i) entries[kept] = std::move(entries[i]);
      ++kept;
    }
    entries.resize(kept);
    if (fds[0].revents != 0) AcceptQueued(handshakes);
    handshakes_ = entries.size();
  }
  // Shutting down: the handshakes in progress end with their sockets.
  handshakes_ = 0;
}

void IslandServer::AcceptQueued(Handshakes& handshakes) {
  for (int accepted = 0; accepted < 64; ++accepted) {
    absl::StatusOr<Socket> socket = listener_.Accept(absl::Now());
    if (!socket.ok()) {
      if (absl::IsDeadlineExceeded(socket.status())) return;  // nothing more queued
      // Out of descriptors (EMFILE, ENFILE) or memory: the connection stays
      // queued; say so and retry after a pause rather than spin, while the
      // sessions already served go on.
      Refused(absl::StrCat("accepting a connection failed: ", socket.status().message()));
      absl::SleepFor(absl::Milliseconds(50));
      return;
    }
    const std::string source = HostOf(socket->peer_address());
    const size_t pending = handshakes.entries().size(), from_source = handshakes.FromSource(source);
    if (pending >= static_cast<size_t>(options_.max_unauthenticated) ||
        from_source >= static_cast<size_t>(options_.max_unauthenticated_per_address)) {
      // Dropping the socket closes it: the peer sees the connection closed
      // before any handshake.
      Refused(absl::StrCat("refused a connection from ", source, ": ", pending,
                           " connections are in their handshake (at most ", options_.max_unauthenticated,
                           "), ", from_source, " from that address (at most ",
                           options_.max_unauthenticated_per_address, ")"));
      continue;
    }
    ServerHandshakeOptions options;
    options.name = options_.name;
    options.secret = options_.secret;
    options.timeout = options_.handshake_timeout;
    auto state = std::make_unique<ServerHandshakeState>(*std::move(socket), options);
    // The hello may be there already.
    if (state->Advance()) {
      HandshakeEnded(*state);
      continue;
    }
    handshakes.entries().push_back({std::move(state), source});
  }
}

void IslandServer::HandshakeEnded(ServerHandshakeState& handshake) {
  if (!handshake.result().ok()) {
    Refused(absl::StrCat("refused a connection: ", handshake.result().status().message()));
    return;
  }
  auto session = std::make_shared<Session>(this, handshake.TakeSocket(), *handshake.result());
  // Started outside the server's lock: a session takes its own lock before
  // the server's, never after.
  if (absl::Status s = session->Start(); !s.ok()) {
    Refused(absl::StrCat("refused a connection from ", session->source(), ": ", s.message()));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      sessions_.push_back(session);
      return;
    }
  }
  // Shutdown came meanwhile and closed the sessions in the list: this one
  // ends here.
  session->Teardown(absl::CancelledError(absl::StrCat("island '", options_.name, "' is shutting down")));
}

void IslandServer::Refused(const std::string& why) {
  // Said at most once a second, with how many went unsaid, so that a flood
  // does not flood the log too.
  const absl::Time now = absl::Now();
  if (now - last_refusal_note_ < absl::Seconds(1)) {
    ++unsaid_refusals_;
    return;
  }
  std::fprintf(stderr, "island '%s': %s%s\n", options_.name.c_str(), why.c_str(),
               unsaid_refusals_ == 0
                   ? ""
                   : absl::StrCat(" (and ", unsaid_refusals_, " more since the last note)").c_str());
  last_refusal_note_ = now;
  unsaid_refusals_ = 0;
}

void IslandServer::ReapLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100))) return;
    }
    std::vector<std::shared_ptr<Session>> sessions, ended;
    {
      absl::MutexLock lock(&mu_);
      sessions = sessions_;
    }
    for (auto& s : sessions) {
      if (!s->status().ok()) ended.push_back(s);
    }
    // Torn down before they leave the list, so that sessions() counts a
    // session until everything it held is back.
    for (auto& s : ended) {
      absl::Status why = s->status().ok() ? absl::UnavailableError("the session ended") : s->status();
      s->Teardown(why);
      LinkLost(s->serial(), s->peer_name(), why);
    }
    {
      absl::MutexLock lock(&mu_);
      for (auto& s : ended) {
        auto it = std::find(sessions_.begin(), sessions_.end(), s);
        if (it != sessions_.end()) sessions_.erase(it);
      }
    }
    RetireLinks();
  }
}

void IslandServer::RetireLinks() {
  std::vector<std::shared_ptr<PeerLink>> unused;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = peers_.begin(); it != peers_.end();) {
      if (it->second->connection().status().ok()) {
        ++it;
        continue;
      }
      retired_links_.push_back(std::move(it->second));
      peers_.erase(it++);
    }
    // Held only here, a link cannot be taken again: the count stays 1.
    for (auto it = retired_links_.begin(); it != retired_links_.end();) {
      if (it->use_count() == 1) {
        unused.push_back(std::move(*it));
        it = retired_links_.erase(it);
      } else {
        ++it;
      }
    }
  }
  unused.clear();  // joins their threads, outside the lock
}

absl::Status IslandServer::AddReceivers(const std::vector<std::shared_ptr<Receiver>>& receivers) {
  absl::MutexLock lock(&mu_);
  for (const auto& r : receivers) {
    if (receivers_.contains(r->id())) {
      return absl::AlreadyExistsError(absl::StrCat("channel ", r->id(), " is in use on island '", options_.name,
                                                   "' by another program"));
    }
  }
  for (const auto& r : receivers) receivers_[r->id()] = r;
  return absl::OkStatus();
}

void IslandServer::RemoveReceivers(const std::vector<std::shared_ptr<Receiver>>& receivers) {
  absl::MutexLock lock(&mu_);
  for (const auto& r : receivers) {
    auto it = receivers_.find(r->id());
    if (it != receivers_.end() && it->second == r) {
      receivers_.erase(it);
      channel_links_.erase(r->id());
    }
  }
}

std::shared_ptr<IslandServer::Receiver> IslandServer::FindReceiver(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = receivers_.find(id);
  return it == receivers_.end() ? nullptr : it->second;
}

void IslandServer::OpenChannel(uint64_t channel, uint64_t session) {
  absl::MutexLock lock(&mu_);
  // Announcements ahead of their receivers are bounded (a peer could send
  // any number); one past the bound leaves its channel to the controller's
  // cancel and the run's deadline, should its link end.
  if (!receivers_.contains(channel) && !channel_links_.contains(channel) &&
      channel_links_.size() >= kMaxChannelLinks) {
    return;
  }
  channel_links_[channel] = session;
}

void IslandServer::LinkLost(uint64_t session, const std::string& peer_name, const absl::Status& why) {
  std::vector<std::shared_ptr<Receiver>> lost;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = channel_links_.begin(); it != channel_links_.end();) {
      if (it->second != session) {
        ++it;
        continue;
      }
      auto r = receivers_.find(it->first);
      if (r != receivers_.end() && r->second->peer() == peer_name) lost.push_back(r->second);
      channel_links_.erase(it++);
    }
  }
  for (auto& r : lost) r->inbox().Close(why);
}

absl::StatusOr<std::shared_ptr<IslandServer::PeerLink>> IslandServer::Peer(const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(address);
    if (it != peers_.end() && it->second->connection().status().ok()) return it->second;
  }
  CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress where, SocketAddress::Parse(address));
  ClientHandshakeOptions handshake;
  handshake.name = options_.name;
  handshake.secret = options_.secret;
  CAUSEWAY_ASSIGN_OR_RETURN(auto connection, Connection::Connect(where, handshake, options_.connection));
  auto link = std::make_shared<PeerLink>(std::move(connection));
  std::shared_ptr<PeerLink> spare;  // destroyed after the lock is released
  absl::MutexLock lock(&mu_);
  std::shared_ptr<PeerLink>& entry = peers_[address];
  if (entry != nullptr && entry->connection().status().ok()) {
    // Another program's load connected meanwhile: one link per peer.
    spare = std::move(link);
    return entry;
  }
  // A failed link at the same address (the peer restarted on its port) may
  // still be held by senders: the reaper destroys it.
  if (entry != nullptr) retired_links_.push_back(std::move(entry));
  entry = link;
  return link;
}

}  // namespace causeway::transport
