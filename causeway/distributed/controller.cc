#include "causeway/distributed/controller.h"

#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/base/byte_ranges.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/distributed/island.pb.h"
#include "causeway/distributed/island_server.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/program_def.pb.h"
#include "causeway/scheduler/split.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/launch.h"

namespace causeway::transport {
struct Controller::Island {
  std::string address;
  std::unique_ptr<Connection> connection;
  // The fetch whose bytes the reader is writing (reader thread only): kept
  // alive through the write even if its Download has given up.
  std::shared_ptr<PendingFetch> writing;
};

struct Controller::PendingRun {
  std::shared_ptr<Promise<>> promise = std::make_shared<Promise<>>();
  int remaining = 0;  // parts not yet done; guarded by the controller's lock
  absl::Status status;
  std::vector<int> islands;
  // Each part: its island, its id there, and the channels it receives on.
  struct Part {
    int island = 0;
    uint64_t id = 0;
    std::vector<uint64_t> receives;
  };
  std::vector<Part> parts;
  bool receives_failed = false;  // guarded by the controller's lock
};

// The bytes land in memory of the fetch's own, not the caller's: a Download
// that gives up at its deadline returns while the reader may still be
// writing.
struct Controller::PendingFetch {
  int island = 0;
  std::vector<uint8_t> bytes;
  ByteRanges begun;       // guarded by the controller's lock: each byte once
  uint64_t received = 0;  // guarded by the controller's lock: bytes in place
  std::shared_ptr<Promise<>> promise = std::make_shared<Promise<>>();
};

class RemoteProgram {
 public:
  struct Part {
    int island = 0;
    uint64_t id = 0;
    int parameters = 0;
    std::vector<RemoteArray> outputs;  // types (ids unset)
    std::vector<uint64_t> receives;    // channels this part receives on
  };
  std::vector<Part> parts;
  std::vector<std::pair<int, int>> parameters, outputs;
};

Controller::Controller(ControllerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<Controller>> Controller::Connect(const std::vector<std::string>& islands,
                                                                ControllerOptions options) {
  if (islands.empty()) return absl::InvalidArgumentError("a controller needs at least one island");
  std::unique_ptr<Controller> c(new Controller(std::move(options)));
  {
    uint64_t random = 0;
    CAUSEWAY_RETURN_IF_ERROR(FillRandom(absl::MakeSpan(reinterpret_cast<uint8_t*>(&random), sizeof(random))));
    absl::MutexLock lock(&c->mu_);
    c->next_channel_ = (uint64_t{1} << 32) | (random >> 2);
  }
  for (size_t i = 0; i < islands.size(); ++i) {
    auto island = std::make_unique<Island>();
    island->address = islands[i];
    c->islands_.push_back(std::move(island));
  }
  {
    absl::MutexLock lock(&c->mu_);
    c->lost_.assign(islands.size(), false);
    c->arrays_.resize(islands.size());
  }
  for (size_t i = 0; i < islands.size(); ++i) {
    Controller* self = c.get();
    const int index = static_cast<int>(i);
    CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress where, SocketAddress::Parse(islands[i]));
    ClientHandshakeOptions handshake;
    handshake.name = c->options_.name;
    handshake.secret = c->options_.secret;
    ConnectionOptions options = c->options_.connection;
    options.data_sink.begin = [self, index](const DataHeader& h) -> absl::StatusOr<uint8_t*> {
      if (h.stream() != kFetchStream) {
        return absl::InvalidArgumentError(absl::StrCat("a controller takes no data on stream ", h.stream()));
      }
      absl::MutexLock lock(&self->mu_);
      auto it = self->fetches_.find(h.tag());
      if (it == self->fetches_.end()) return nullptr;  // given up at its deadline
      PendingFetch& f = *it->second;
      if (f.island != index || h.total() != f.bytes.size()) {
        return absl::InvalidArgumentError(absl::StrCat("fetch ", h.tag(), " of ", f.bytes.size(),
                                                       " bytes got an object of ", h.total()));
      }
      // Bytes sent twice would count toward the size with others missing.
      CAUSEWAY_RETURN_IF_ERROR(f.begun.Add(h.offset(), h.length(), absl::StrCat("fetch ", h.tag())));
      self->islands_[index]->writing = it->second;
      return f.bytes.data() + h.offset();
    };
    options.data_sink.end = [self, index](const DataHeader& h) {
      absl::MutexLock lock(&self->mu_);
      if (auto& f = self->islands_[index]->writing; f != nullptr) f->received += h.length();
      self->islands_[index]->writing.reset();
    };
    auto connection = Connection::Connect(where, handshake, options,
                                          [self, index](const Request& r) -> absl::StatusOr<Response> {
                                            if (r.kind_case() == Request::kIsland) self->HandleNote(index, r.island());
                                            Response ok;
                                            ok.mutable_ok();
                                            return ok;
                                          });
    if (!connection.ok()) {
      return absl::Status(connection.status().code(), absl::StrCat("connecting to island ", i, " at ", islands[i],
                                                                   ": ", connection.status().message()));
    }
    c->islands_[i]->connection = *std::move(connection);
  }
  c->watcher_ = std::thread([self = c.get()] {
    Tracer::NameThread("controller watcher");
    self->WatchLoop();
  });
  return c;
}

absl::StatusOr<std::unique_ptr<Controller>> Controller::ConnectToLaunch(const std::string& coordinator,
                                                                        ControllerOptions options,
                                                                        absl::Time deadline) {
  CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress where, SocketAddress::Parse(coordinator));
  ClientHandshakeOptions handshake;
  handshake.name = options.name;
  handshake.secret = options.secret;
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<RegisterIsland> islands, WaitForIslands(where, handshake, deadline));
  std::vector<std::string> addresses;
  for (const RegisterIsland& island : islands) addresses.push_back(island.address());
  return Connect(addresses, std::move(options));
}

Controller::~Controller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watcher_.joinable()) watcher_.join();  // not started when Connect failed
  for (auto& island : islands_) {
    if (island->connection != nullptr) island->connection->Close("the controller is done");
  }
  for (size_t i = 0; i < islands_.size(); ++i) {
    if (islands_[i]->connection != nullptr) {
      IslandLost(static_cast<int>(i), absl::CancelledError("the controller was destroyed"));
    }
  }
  islands_.clear();
}

const std::string& Controller::island_name(int i) const { return islands_[i]->connection->peer().name; }

absl::Status Controller::island_status(int i) const { return islands_[i]->connection->status(); }

absl::Status Controller::LostError(int i, const absl::Status& why) const {
  return absl::UnavailableError(absl::StrCat("island ", i, " ('", island_name(i), "' at ",
                                             islands_[i]->address, ") lost: ", why.message()));
}

absl::Status Controller::LostIfDown(int i) const {
  absl::Status s = islands_[i]->connection->status();
  return s.ok() ? s : LostError(i, s);
}

absl::StatusOr<std::string> Controller::Call(int island, const std::string& request) {
  if (island < 0 || island >= island_count()) {
    return absl::InvalidArgumentError(absl::StrCat("no island ", island, " (the controller has ", island_count(), ")"));
  }
  Request r;
  r.set_island(request);
  absl::StatusOr<Response> called =
      islands_[island]->connection->Call(r, absl::Now() + options_.call_timeout);
  if (!called.ok()) {
    // A call that failed because the connection did is the island's loss.
    // (The watch loop fails the island's pending work.)
    if (absl::Status down = islands_[island]->connection->status(); !down.ok())
      return LostError(island, down);
    return called.status();
  }
  const Response& response = *called;
  if (response.kind_case() != Response::kIsland) {
    return absl::DataLossError(absl::StrCat("island ", island_name(island), " answered with no island response"));
  }
  return response.island();
}

namespace {
absl::StatusOr<IslandResponse> Decode(const std::string& bytes) {
  IslandResponse r;
  if (!r.ParseFromString(bytes)) return absl::DataLossError("an island response that does not decode");
  return r;
}
}  // namespace

absl::StatusOr<IslandDescription> Controller::Describe(int island) {
  IslandRequest in;
  in.mutable_describe();
  CAUSEWAY_ASSIGN_OR_RETURN(std::string bytes, Call(island, in.SerializeAsString()));
  CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse out, Decode(bytes));
  const IslandInfo& info = out.info();
  IslandDescription d;
  d.name = info.name();
  d.accelerators = info.accelerators();
  d.device.name = info.device();
  // A kind this controller does not know plans as "other" (the portable paths).
  d.device.kind = DeviceKindFromValue(info.device_type()).value_or(DeviceKind::kOther);
  d.device.subgroup_size = info.subgroup_size();
  d.device.max_workgroup_invocations = info.max_workgroup_invocations();
  d.device.max_storage_buffers = info.max_storage_buffers();
  for (int i = 0; i < 3 && i < info.max_workgroup_size().size(); ++i) {
    d.device.max_workgroup_size[i] = info.max_workgroup_size(i);
  }
  for (int i = 0; i < 3 && i < info.max_workgroup_count().size(); ++i) {
    d.device.max_workgroup_count[i] = info.max_workgroup_count(i);
  }
  for (const std::string& why : info.out_of_service()) {
    d.health.push_back(why.empty() ? absl::OkStatus() : absl::UnavailableError(why));
  }
  return d;
}

absl::StatusOr<RemoteMesh> Controller::AllocateMesh(int island, std::vector<int> dims) {
  IslandRequest in;
  for (int d : dims) in.mutable_allocate_mesh()->add_dims(d);
  CAUSEWAY_ASSIGN_OR_RETURN(std::string bytes, Call(island, in.SerializeAsString()));
  CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse out, Decode(bytes));
  return RemoteMesh{island, out.id(), std::move(dims)};
}

absl::StatusOr<RemoteArray> Controller::CreateArray(const RemoteMesh& mesh, Shape shape, DType dtype,
                                                    Sharding sharding) {
  IslandRequest in;
  auto* ca = in.mutable_create_array();
  ca->set_mesh(mesh.id);
  for (int64_t d : shape) ca->add_shape(d);
  ca->set_dtype(static_cast<int32_t>(ToDef(dtype)));
  ca->set_sharding(ToDef(sharding).SerializeAsString());
  CAUSEWAY_ASSIGN_OR_RETURN(std::string bytes, Call(mesh.island, in.SerializeAsString()));
  CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse out, Decode(bytes));
  {
    absl::MutexLock lock(&mu_);
    arrays_[mesh.island].insert(out.id());
  }
  return RemoteArray{mesh.island, out.id(), std::move(shape), dtype};
}

absl::Status Controller::Upload(const RemoteArray& array, const void* host, uint64_t size) {
  if (size != array.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("upload of ", size, " bytes to an array of ", array.bytes()));
  }
  if (array.island < 0 || array.island >= island_count()) return absl::InvalidArgumentError("no such island");
  return islands_[array.island]->connection->SendData(
      kUploadStream, array.id, 0, size, absl::Span<const uint8_t>(static_cast<const uint8_t*>(host), size),
      absl::Now() + options_.call_timeout);
}

absl::Status Controller::Download(const RemoteArray& array, void* host, uint64_t size, absl::Time deadline) {
  if (size != array.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("download of ", size, " bytes from an array of ", array.bytes()));
  }
  auto fetch = std::make_shared<PendingFetch>();
  fetch->island = array.island;
  fetch->bytes.resize(size);
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    if (array.island < 0 || array.island >= island_count()) return absl::InvalidArgumentError("no such island");
    if (lost_[array.island]) return LostIfDown(array.island);
    id = next_fetch_++;
    fetches_[id] = fetch;
  }
  IslandRequest in;
  in.mutable_fetch()->set_array(array.id);
  in.mutable_fetch()->set_fetch(id);
  absl::Status s = Call(array.island, in.SerializeAsString()).status();
  if (s.ok()) s = fetch->promise->future().AwaitStatus(deadline);
  absl::MutexLock lock(&mu_);
  fetches_.erase(id);
  if (s.ok() && fetch->received != size) {
    s = absl::DataLossError(absl::StrCat("download got ", fetch->received, " of ", size, " bytes"));
  }
  if (s.ok()) std::memcpy(host, fetch->bytes.data(), size);
  return s;
}

absl::Status Controller::Release(const RemoteArray& array) {
  {
    absl::MutexLock lock(&mu_);
    if (array.island < 0 || array.island >= island_count())
      return absl::InvalidArgumentError("no such island");
    if (lost_[array.island]) return LostIfDown(array.island);
    if (arrays_[array.island].erase(array.id) == 0) {
      return absl::NotFoundError(
          absl::StrCat("no array ", array.id, " on island ", island_name(array.island)));
    }
  }
  // No answer to wait for: the island refuses only ids it does not hold,
  // and this controller has just checked that it holds this one.
  IslandRequest in;
  in.mutable_release_array()->set_array(array.id);
  Request r;
  r.set_island(in.SerializeAsString());
  absl::Status sent = islands_[array.island]->connection->Notify(r, absl::Now() + options_.call_timeout);
  return sent.ok() ? sent : LostError(array.island, sent);
}

absl::StatusOr<std::shared_ptr<RemoteProgram>> Controller::Load(
    const ProgramDef& def, const absl::flat_hash_map<std::string, RemoteMesh>& meshes) {
  // Each mesh on its island, by the island's own name.
  ProgramDef bound = def;
  for (MeshDef& m : *bound.mutable_meshes()) {
    auto it = meshes.find(m.name());
    if (it == meshes.end()) {
      return absl::InvalidArgumentError(absl::StrCat("program '", def.name(), "': mesh '", m.name(), "' is not bound"));
    }
    if (it->second.island < 0 || it->second.island >= island_count()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh '", m.name(), "' is on no island of this controller"));
    }
    m.set_island(island_name(it->second.island));
  }
  absl::flat_hash_map<std::string, int> by_name;
  for (int i = 0; i < island_count(); ++i) {
    if (!by_name.emplace(island_name(i), i).second) {
      return absl::FailedPreconditionError(absl::StrCat("two islands are named '", island_name(i),
                                                        "'; islands of one program need distinct names"));
    }
  }
  uint64_t first_channel;
  {
    absl::MutexLock lock(&mu_);
    first_channel = next_channel_;
  }
  CAUSEWAY_ASSIGN_OR_RETURN(SplitProgram split, SplitByIsland(bound, first_channel));
  {
    absl::MutexLock lock(&mu_);
    for (const ChannelSpec& c : split.channels) next_channel_ = std::max(next_channel_, c.id + 1);
  }
  auto program = std::make_shared<RemoteProgram>();
  program->parameters = split.parameters;
  program->outputs = split.outputs;
  for (const ProgramPart& part : split.parts) {
    auto island = by_name.find(part.island);
    if (island == by_name.end()) return absl::InternalError(absl::StrCat("a part on unknown island ", part.island));
    IslandRequest in;
    LoadProgram* load = in.mutable_load_program();
    load->set_program(part.def.SerializeAsString());
    for (const MeshDef& m : part.def.meshes()) (*load->mutable_meshes())[m.name()] = meshes.at(m.name()).id;
    std::vector<uint64_t> receives;
    for (const ChannelSpec& c : split.channels) {
      if (c.from_island != part.island && c.to_island != part.island) continue;
      if (c.to_island == part.island) receives.push_back(c.id);
      ChannelEnd* end = load->add_channels();
      end->set_id(c.id);
      end->set_send(c.from_island == part.island);
      const std::string& peer = end->send() ? c.to_island : c.from_island;
      end->set_peer_name(peer);
      end->set_peer_address(islands_[by_name.at(peer)]->address);
    }
    CAUSEWAY_ASSIGN_OR_RETURN(std::string bytes, Call(island->second, in.SerializeAsString()));
    CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse out, Decode(bytes));
    RemoteProgram::Part p;
    p.island = island->second;
    p.id = out.loaded().id();
    p.parameters = part.def.parameters_size();
    p.receives = std::move(receives);
    for (const ArrayType& t : out.loaded().outputs()) {
      RemoteArray a;
      a.island = p.island;
      a.shape.assign(t.shape().begin(), t.shape().end());
      CAUSEWAY_ASSIGN_OR_RETURN(a.dtype, FromDef(static_cast<DTypeDef>(t.dtype())));
      p.outputs.push_back(std::move(a));
    }
    program->parts.push_back(std::move(p));
  }
  absl::MutexLock lock(&mu_);
  programs_.push_back(program);
  return program;
}

absl::StatusOr<RemoteRun> Controller::Execute(const std::shared_ptr<RemoteProgram>& program,
                                              const std::vector<RemoteArray>& inputs,
                                              const RemoteExecuteOptions& options) {
  if (program == nullptr) return absl::InvalidArgumentError("no program");
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a run's deadline must be > 0, got ", absl::FormatDuration(options.deadline)));
  }
  // Whole microseconds, rounded up (a deadline never shrinks to 0, "none").
  const uint64_t deadline_us = options.deadline == absl::InfiniteDuration()
                                   ? 0
                                   : static_cast<uint64_t>(absl::ToInt64Microseconds(
                                         absl::Ceil(options.deadline, absl::Microseconds(1))));
  if (inputs.size() != program->parameters.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the program takes ", program->parameters.size(),
                                                   " inputs, given ", inputs.size()));
  }
  std::vector<std::vector<uint64_t>> part_inputs(program->parts.size());
  for (size_t p = 0; p < program->parts.size(); ++p) part_inputs[p].resize(program->parts[p].parameters);
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto [part, index] = program->parameters[i];
    if (inputs[i].island != program->parts[part].island) {
      return absl::InvalidArgumentError(absl::StrCat("input ", i, " is on island ", island_name(inputs[i].island),
                                                     "; the program wants it on ",
                                                     island_name(program->parts[part].island)));
    }
    part_inputs[part][index] = inputs[i].id;
  }
  auto pending = std::make_shared<PendingRun>();
  uint64_t tag;
  {
    absl::MutexLock lock(&mu_);
    tag = next_tag_++;
    for (const auto& part : program->parts) {
      if (lost_[part.island]) return LostIfDown(part.island);
      pending->islands.push_back(part.island);
      pending->parts.push_back({part.island, part.id, part.receives});
      pending->remaining++;
      runs_[{part.island, part.id, tag}] = pending;
    }
  }
  RemoteRun run;
  run.done = pending->promise->future();
  // Output ids are this controller's to choose, so a run is dispatched to
  // every island without waiting for a round trip; errors come back as the
  // run's (RunDone).
  std::vector<std::vector<uint64_t>> part_outputs(program->parts.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t p = 0; p < program->parts.size(); ++p) {
      for (size_t o = 0; o < program->parts[p].outputs.size(); ++o) part_outputs[p].push_back(next_array_++);
    }
  }
  for (size_t p = 0; p < program->parts.size(); ++p) {
    const auto& part = program->parts[p];
    IslandRequest in;
    in.mutable_execute()->set_program(part.id);
    in.mutable_execute()->set_tag(tag);
    in.mutable_execute()->set_deadline_us(deadline_us);
    for (uint64_t id : part_inputs[p]) in.mutable_execute()->add_inputs(id);
    for (uint64_t id : part_outputs[p]) in.mutable_execute()->add_outputs(id);
    Request r;
    r.set_island(in.SerializeAsString());
    absl::Status sent = islands_[part.island]->connection->Notify(r, absl::Now() + options_.call_timeout);
    if (!sent.ok()) {
      if (absl::Status down = islands_[part.island]->connection->status(); !down.ok()) {
        sent = LostError(part.island, down);
      }
      // The parts already sent will fail or finish; this run is failed.
      absl::ReleasableMutexLock lock(&mu_);
      for (size_t q = p; q < program->parts.size(); ++q) {
        runs_.erase({program->parts[q].island, program->parts[q].id, tag});
      }
      if (pending->status.ok()) pending->status = sent;
      pending->remaining -= static_cast<int>(program->parts.size() - p);
      if (pending->remaining == 0) pending->promise->Set(pending->status);
      std::vector<std::pair<int, std::string>> notes = FailReceivesLocked(*pending, tag, sent);
      lock.Release();
      SendNotes(notes);
      return sent;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (size_t p = 0; p < program->parts.size(); ++p) {
      arrays_[program->parts[p].island].insert(part_outputs[p].begin(), part_outputs[p].end());
    }
  }
  for (auto [part, index] : program->outputs) {
    RemoteArray a = program->parts[part].outputs[index];
    a.id = part_outputs[part][index];
    run.outputs.push_back(std::move(a));
  }
  run.program = program;
  run.tag = tag;
  return run;
}

absl::Status Controller::Cancel(const RemoteRun& run) {
  if (run.program == nullptr)
    return absl::InvalidArgumentError("not a run of this controller's (no program)");
  absl::Status first_error;
  bool told = false;
  for (const auto& part : run.program->parts) {
    if (part.island < 0 || part.island >= island_count()) {
      return absl::InvalidArgumentError("not a run of this controller's (an island it does not know)");
    }
  }
  for (const auto& part : run.program->parts) {
    IslandRequest in;
    in.mutable_cancel_run()->set_program(part.id);
    in.mutable_cancel_run()->set_tag(run.tag);
    Request r;
    r.set_island(in.SerializeAsString());
    absl::Status sent = islands_[part.island]->connection->Notify(r, absl::Now() + options_.call_timeout);
    // An island that is down fails its part anyway (IslandLost).
    if (!sent.ok() && first_error.ok()) first_error = LostError(part.island, sent);
    told |= sent.ok();
  }
  return told ? absl::OkStatus() : first_error;
}

void Controller::HandleNote(int island, const std::string& note) {
  IslandRequest in;
  if (!in.ParseFromString(note)) return;
  if (in.kind_case() == IslandRequest::kRunDone) {
    const RunDone& d = in.run_done();
    std::shared_ptr<Promise<>> finished;
    absl::Status status;
    std::vector<std::pair<int, std::string>> notes;
    {
      absl::MutexLock lock(&mu_);
      auto it = runs_.find({island, d.program(), d.tag()});
      if (it == runs_.end()) return;
      std::shared_ptr<PendingRun> run = it->second;
      runs_.erase(it);
      absl::Status s = StatusFromPeer(d.code(), absl::StrCat("island '", island_name(island), "': ", d.message()));
      if (!s.ok()) {
        // A part that failed because another island of the run went down
        // (its channel closed) reports that island's loss.
        for (int other : run->islands) {
          if (absl::Status down = LostIfDown(other); !down.ok()) {
            s = down;
            break;
          }
        }
      }
      if (run->status.ok() && !s.ok()) run->status = s;
      if (--run->remaining == 0) {
        finished = run->promise;
        status = run->status;
      } else if (!s.ok()) {
        notes = FailReceivesLocked(*run, d.tag(), s);
      }
    }
    SendNotes(notes);
    if (finished != nullptr) finished->Set(status);
    return;
  }
  if (in.kind_case() == IslandRequest::kFetchDone) {
    const FetchDone& d = in.fetch_done();
    std::shared_ptr<Promise<>> promise;
    {
      absl::MutexLock lock(&mu_);
      auto it = fetches_.find(d.fetch());
      if (it == fetches_.end()) return;
      promise = it->second->promise;
    }
    promise->Set(StatusFromPeer(d.code(), absl::StrCat("island '", island_name(island), "': ", d.message())));
  }
}

std::vector<std::pair<int, std::string>> Controller::FailReceivesLocked(PendingRun& run, uint64_t tag,
                                                                           const absl::Status& why) {
  std::vector<std::pair<int, std::string>> notes;
  if (run.receives_failed) return notes;
  run.receives_failed = true;
  for (const PendingRun::Part& part : run.parts) {
    if (lost_[part.island] || !runs_.contains({part.island, part.id, tag})) continue;
    for (uint64_t channel : part.receives) {
      IslandRequest in;
      ChannelFailed* f = in.mutable_channel_failed();
      f->set_channel(channel);
      f->set_tag(tag);
      StatusToPeer(why, f);
      notes.emplace_back(part.island, in.SerializeAsString());
    }
  }
  return notes;
}

void Controller::SendNotes(const std::vector<std::pair<int, std::string>>& notes) {
  for (const auto& [island, in] : notes) {
    Request r;
    r.set_island(in);
    (void)islands_[island]->connection->Notify(r, absl::Now() + options_.call_timeout);
  }
}

void Controller::WatchLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50))) return;
    }
    for (int i = 0; i < island_count(); ++i) {
      absl::Status s = islands_[i]->connection->status();
      if (!s.ok()) IslandLost(i, s);
    }
  }
}

void Controller::IslandLost(int i, const absl::Status& why) {
  std::vector<std::pair<std::shared_ptr<Promise<>>, absl::Status>> failed;
  std::vector<std::pair<int, uint64_t>> cancel;  // other islands' parts of affected programs
  {
    absl::MutexLock lock(&mu_);
    if (lost_[i]) return;
    lost_[i] = true;
    const absl::Status status = LostError(i, why);
    for (auto it = runs_.begin(); it != runs_.end();) {
      std::shared_ptr<PendingRun> run = it->second;
      bool involved = false;
      for (int island : run->islands) involved |= island == i;
      if (!involved) {
        ++it;
        continue;
      }
      if (std::get<0>(it->first) != i) cancel.emplace_back(std::get<0>(it->first), std::get<1>(it->first));
      runs_.erase(it++);
      // The loss is the cause of whatever else the run's other parts saw
      // (a channel from the lost island closed).
      run->status = status;
      if (--run->remaining == 0) failed.emplace_back(run->promise, run->status);
    }
    for (auto& [id, fetch] : fetches_) {
      if (fetch->island == i) failed.emplace_back(fetch->promise, status);
    }
  }
  for (auto& [promise, status] : failed) promise->Set(status);
  // The other islands stop waiting for the lost one's values.
  std::sort(cancel.begin(), cancel.end());
  cancel.erase(std::unique(cancel.begin(), cancel.end()), cancel.end());
  for (auto [island, program] : cancel) {
    IslandRequest in;
    in.mutable_cancel_runs()->set_program(program);
    in.mutable_cancel_runs()->set_message(absl::StrCat("island '", island_name(i), "' was lost: ", why.message()));
    Request r;
    r.set_island(in.SerializeAsString());
    (void)islands_[island]->connection->Notify(r, absl::Now() + options_.call_timeout);
  }
}

}  // namespace causeway::transport
