// Fuzz target over an island's sessions: each input is a script that one
// authenticated controller plays against an island server (two lavapipe
// accelerators, made once per process) over a real connection. The script's
// bytes choose requests and their fields: meshes, arrays, uploads (data
// frames at any offset and total), programs (one local, one with a
// collective, one that receives a channel from this controller, or bytes),
// runs (as calls and as notifications with chosen output ids, with
// deadlines), fetches, releases, cancels, channel values and failures,
// notes only an island sends, and raw bytes as a request. Ids are drawn
// mostly from the few the island has handed out, so that requests meet real
// objects.
//
// Beyond not crashing (under ASan and UBSan), the island must answer every
// call within kAnswerWithin, still answer after the script, end the session
// once the controller has gone (everything it made released), and serve
// the next controller. A violation aborts.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "causeway/distributed/island.pb.h"
#include "causeway/distributed/island_server.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/runtime/memory.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/program_def.pb.h"
#include "causeway/scheduler/split.h"
#include "causeway/transport/connection.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/socket.h"
#include "google/protobuf/text_format.h"
#include "tests/fuzz/fuzz_require.h"

namespace causeway::transport {
namespace {

void Require(bool condition, const char* what) { fuzz::Require(condition, "session_fuzzer", what); }

// Far beyond what any request takes on lavapipe (a call here makes small
// arrays and programs): an unanswered call is a hang.
constexpr absl::Duration kAnswerWithin = absl::Seconds(4);
constexpr char kController[] = "fuzz-controller";
constexpr uint64_t kChannel = 777;
constexpr int kMostSteps = 48;

// y = x + b on a mesh "m" of 2 accelerators, 8 floats, x split by rows.
constexpr char kLocalProgram[] = R"pb(
  name: "local"
  meshes { name: "m" dims: 2 }
  functions {
    name: "add"
    elementwise {
      op: "add"
      shape: [ 4 ]
    }
  }
  parameters {
    value: "x"
    mesh: "m"
    shape: [ 8 ]
    sharding { split { array_axis: 0 } }
  }
  parameters {
    value: "b"
    mesh: "m"
    shape: [ 8 ]
    sharding { split { array_axis: 0 } }
  }
  nodes {
    name: "sum"
    call {
      function: "add"
      mesh: "m"
      inputs: [ "x", "b" ]
      outputs: "y"
    }
  }
  outputs: [ "y" ]
)pb";

// An all-reduce over a mesh of 2.
constexpr char kCollectiveProgram[] = R"pb(
  name: "collective"
  meshes { name: "m" dims: 2 }
  parameters {
    value: "g"
    mesh: "m"
    shape: [ 4 ]
  }
  nodes {
    name: "ar"
    collective { kind: ALL_REDUCE mesh: "m" input: "g" output: "s" op: SUM }
  }
  outputs: [ "s" ]
)pb";

// x + b on island "elsewhere", then scaled here: this island's part
// receives the sum over a channel (from the controller, in the script).
constexpr char kTwoIslandProgram[] = R"pb(
  name: "two-islands"
  meshes { name: "a" island: "elsewhere" dims: 1 }
  meshes { name: "m" island: "fuzz-island" dims: 1 }
  functions {
    name: "add"
    elementwise {
      op: "add"
      shape: [ 16 ]
    }
  }
  functions {
    name: "half"
    scale {
      shape: [ 16 ]
      alpha: 0.5
    }
  }
  parameters {
    value: "x"
    mesh: "a"
    shape: [ 16 ]
  }
  parameters {
    value: "b"
    mesh: "a"
    shape: [ 16 ]
  }
  nodes {
    name: "sum"
    call {
      function: "add"
      mesh: "a"
      inputs: [ "x", "b" ]
      outputs: "s"
    }
  }
  nodes {
    name: "halve"
    call { function: "half" mesh: "m" inputs: "s" outputs: "t" }
  }
  outputs: [ "t" ]
)pb";

ProgramDef Parse(const char* text) {
  ProgramDef def;
  Require(google::protobuf::TextFormat::ParseFromString(text, &def), "a seed program does not parse");
  return def;
}

// The island, made once: runs go on between inputs, as on a long-lived
// island serving one controller after another.
struct Island {
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<IslandServer> server;
  SocketAddress address;
  std::string local, collective, received;  // serialized defs
};

Island& TheIsland() {
  static Island* island = [] {
    auto* i = new Island;
    RuntimeOptions options;
    options.accelerators = 2;
    const char* device = std::getenv("CAUSEWAY_DEVICE");
    options.device = device != nullptr ? device : "cpu";
    options.memory_budget = uint64_t{64} << 20;
    absl::StatusOr<std::unique_ptr<Runtime>> runtime = Runtime::Create(options);
    Require(runtime.ok(), "no runtime (is lavapipe installed?)");
    i->runtime = *std::move(runtime);
    IslandServerOptions server;
    server.name = "fuzz-island";
    absl::StatusOr<std::unique_ptr<IslandServer>> made = IslandServer::Create(i->runtime.get(), server);
    Require(made.ok(), "no island server");
    i->server = *std::move(made);
    absl::StatusOr<SocketAddress> address = SocketAddress::Parse(i->server->address().ToString());
    Require(address.ok(), "the island's address does not parse");
    i->address = *address;
    i->local = Parse(kLocalProgram).SerializeAsString();
    i->collective = Parse(kCollectiveProgram).SerializeAsString();
    absl::StatusOr<SplitProgram> split = SplitByIsland(Parse(kTwoIslandProgram), kChannel);
    Require(split.ok() && split->channels.size() == 1, "the two-island seed does not split");
    for (const ProgramPart& part : split->parts) {
      if (part.island == server.name) i->received = part.def.SerializeAsString();
    }
    Require(!i->received.empty(), "no part for this island");
    return i;
  }();
  return *island;
}

// The script's bytes, read front to back; zeros once they run out.
class Script {
 public:
  explicit Script(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  uint8_t Byte() { return done() ? 0 : bytes_[at_++]; }
  uint64_t Below(uint64_t n) { return Byte() % n; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | Byte();
    return v;
  }
  std::string Text() {
    const size_t n = std::min<size_t>(Byte() % 32, bytes_.size() - std::min(at_, bytes_.size()));
    std::string s(reinterpret_cast<const char*>(bytes_.data()) + at_, n);
    at_ += n;
    return s;
  }
  // An id: mostly one the island could have handed out (they count up from
  // 1 per session), else a controller's (2^62 up) or anything.
  uint64_t Id() {
    switch (Below(8)) {
      case 6:
        return kControllerIds + Below(4);
      case 7:
        return U64();
      default:
        return Below(12);
    }
  }
  // A size: mostly small, sometimes anything (overflow, huge).
  int64_t Dim() {
    const uint8_t b = Byte();
    if (b < 240) return b % 17;
    return static_cast<int64_t>(U64());
  }

 private:
  absl::Span<const uint8_t> bytes_;
  size_t at_ = 0;
};

// CAUSEWAY_FUZZ_TRACE=1: each step and the island's answer on stderr (to
// see what a corpus input does).
bool Tracing() {
  static const bool on = std::getenv("CAUSEWAY_FUZZ_TRACE") != nullptr;
  return on;
}
void Trace(const std::string& step, const absl::Status& answer) {
  if (Tracing()) std::fprintf(stderr, "session_fuzzer: %s -> %s\n", step.c_str(), answer.ToString().c_str());
}

Request AsRequest(const IslandRequest& in) {
  Request request;
  request.set_island(in.SerializeAsString());
  return request;
}

// One step of the script on `c`.
void Step(Script& s, Connection& c) {
  Island& island = TheIsland();
  IslandRequest in;
  bool notify = false;
  const uint64_t op = s.Below(16);
  switch (op) {
    case 0:
      in.mutable_describe();
      break;
    case 1: {
      AllocateMesh* m = in.mutable_allocate_mesh();
      for (uint64_t n = s.Below(4); n > 0; --n) m->add_dims(static_cast<int32_t>(s.Below(5)));
      break;
    }
    case 2: {
      CreateArray* a = in.mutable_create_array();
      a->set_mesh(s.Id());
      for (uint64_t n = s.Below(4); n > 0; --n) a->add_shape(s.Dim());
      a->set_dtype(static_cast<int32_t>(s.Below(6)));
      ShardingDef sharding;
      if (s.Below(2) == 1) sharding.mutable_split()->set_array_axis(static_cast<int32_t>(s.Below(3)));
      a->set_sharding(s.Below(8) == 0 ? s.Text() : sharding.SerializeAsString());
      break;
    }
    case 3:
      in.mutable_release_array()->set_array(s.Id());
      break;
    case 4: {
      LoadProgram* lp = in.mutable_load_program();
      const uint64_t which = s.Below(4);
      lp->set_program(which == 0   ? island.local
                      : which == 1 ? island.collective
                      : which == 2 ? island.received
                                   : s.Text());
      const std::string mesh_name = s.Below(8) == 0 ? s.Text() : "m";
      (*lp->mutable_meshes())[mesh_name] = s.Id();
      if (which == 2 || s.Below(8) == 0) {
        ChannelEnd* end = lp->add_channels();
        end->set_id(s.Below(4) == 0 ? s.U64() : kChannel);
        end->set_send(s.Below(8) == 0);
        end->set_peer_name(kController);
        end->set_peer_address("127.0.0.1:1");
      }
      break;
    }
    case 5: {
      Execute* ex = in.mutable_execute();
      ex->set_program(s.Id());
      ex->set_tag(s.Below(8));
      for (uint64_t n = s.Below(4); n > 0; --n) ex->add_inputs(s.Id());
      if (s.Below(2) == 1) {
        // A notification with the controller's output ids.
        notify = true;
        for (uint64_t n = s.Below(3); n > 0; --n) ex->add_outputs(kControllerIds + s.Below(8));
      }
      if (s.Below(4) == 0) ex->set_deadline_us(s.Below(4) == 0 ? s.U64() : 1000 * s.Below(200));
      break;
    }
    case 6:
      in.mutable_fetch()->set_array(s.Id());
      in.mutable_fetch()->set_fetch(s.Below(16));
      break;
    case 7:
      in.mutable_cancel_run()->set_program(s.Id());
      in.mutable_cancel_run()->set_tag(s.Below(8));
      break;
    case 8:
      in.mutable_cancel_runs()->set_program(s.Id());
      in.mutable_cancel_runs()->set_message(s.Text());
      break;
    case 9: {
      ChannelFailed* f = in.mutable_channel_failed();
      f->set_channel(s.Below(4) == 0 ? s.U64() : kChannel);
      f->set_tag(s.Below(8));
      f->set_code(static_cast<int32_t>(s.Below(20)));
      f->set_message(s.Text());
      notify = true;
      break;
    }
    case 10:
      in.mutable_channel_open()->set_channel(s.Below(4) == 0 ? s.U64() : kChannel);
      notify = true;
      break;
    case 11:
    case 12: {
      // Bulk bytes: an upload to an array, or a channel's value.
      const bool upload = op == 11;
      const uint64_t total = s.Below(8) == 0 ? s.U64() : 4 * s.Below(65);
      const uint64_t offset = s.Below(8) == 0 ? s.U64() : 4 * s.Below(33);
      const uint64_t length = std::min<uint64_t>(s.Below(8) == 0 ? s.U64() : 4 * s.Below(33), 1 << 16);
      const std::vector<uint8_t> bytes(length, s.Byte());
      // Refused here when outside the value: the island sees only frames a
      // sender could send.
      const uint64_t tag = upload ? s.Id() : s.Below(8);
      Trace(absl::StrCat(upload ? "upload to " : "channel value of run ", tag, ": bytes [", offset, ", +",
                         length, ") of ", total),
            c.SendData(upload ? kUploadStream : kChannel, tag, offset, total, bytes,
                       absl::Now() + kAnswerWithin));
      return;
    }
    case 13: {
      // What only an island sends a controller.
      if (s.Below(2) == 0) {
        in.mutable_run_done()->set_program(s.Id());
        in.mutable_run_done()->set_tag(s.Below(8));
      } else {
        in.mutable_fetch_done()->set_fetch(s.Below(16));
      }
      notify = s.Below(2) == 0;
      break;
    }
    case 14: {
      // Raw bytes as the request.
      Request raw;
      raw.set_island(s.Text());
      const absl::Status answered = c.Call(raw, absl::Now() + kAnswerWithin).status();
      Trace("raw bytes", answered);
      Require(!absl::IsDeadlineExceeded(answered), "a raw request went unanswered");
      return;
    }
    default: {
      // The same request again, as a notification (errors come back, if at
      // all, as notes).
      in.mutable_describe();
      notify = true;
      break;
    }
  }
  if (notify) {
    Trace(absl::StrCat("note ", in.ShortDebugString()), c.Notify(AsRequest(in), absl::Now() + kAnswerWithin));
    return;
  }
  const absl::Status answered = c.Call(AsRequest(in), absl::Now() + kAnswerWithin).status();
  Trace(in.ShortDebugString().substr(0, 200), answered);
  // An error is an answer; silence is a hang (unless the connection failed,
  // which the checks after the script catch if the island went with it).
  Require(!absl::IsDeadlineExceeded(answered) || !c.status().ok(), "an island request went unanswered");
}

// A connection to the island as the fuzzing controller: notes are taken,
// fetched bytes dropped.
std::unique_ptr<Connection> Connect() {
  ClientHandshakeOptions handshake;
  handshake.name = kController;
  ConnectionOptions options;
  options.data_sink.begin = [](const DataHeader&) -> absl::StatusOr<uint8_t*> { return nullptr; };
  options.data_sink.end = [](const DataHeader&) {};
  absl::StatusOr<std::unique_ptr<Connection>> c =
      Connection::Connect(TheIsland().address, handshake, options,
                          [](const Request&) -> absl::StatusOr<Response> { return Response(); });
  Require(c.ok(), "the island refused a controller");
  return *std::move(c);
}

bool Describes(Connection& c) {
  IslandRequest in;
  in.mutable_describe();
  return c.Call(AsRequest(in), absl::Now() + kAnswerWithin).ok();
}

void FuzzOne(absl::Span<const uint8_t> bytes) {
  Island& island = TheIsland();
  Script script(bytes);
  {
    std::unique_ptr<Connection> c = Connect();
    for (int i = 0; i < kMostSteps && !script.done() && c->status().ok(); ++i) Step(script, *c);
    // A script may close its own connection (a malformed request does);
    // while it is open, the island still answers.
    if (c->status().ok()) Require(Describes(*c), "the island stopped answering its controller");
  }
  // The controller has gone: its session ends, releasing what it made.
  const absl::Time deadline = absl::Now() + kAnswerWithin;
  while (island.server->sessions() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  Require(island.server->sessions() == 0, "a session outlived its controller");
  // ... and with it every buffer it made.
  auto in_use = [&island] {
    uint64_t bytes = 0;
    for (Accelerator* a : island.runtime->accelerators()) bytes += a->device_pool().bytes_in_use();
    return bytes;
  };
  while (in_use() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
  if (in_use() > 0)
    std::fprintf(stderr, "session_fuzzer: %llu bytes still in use\n", (unsigned long long)in_use());
  Require(in_use() == 0, "device memory outlived the session that made it");
  std::unique_ptr<Connection> next = Connect();
  Require(Describes(*next), "the island stopped serving new controllers");
}

}  // namespace
}  // namespace causeway::transport

// LeakSanitizer cannot see every reference lavapipe keeps to its own
// allocations (its compiled shaders hold some in memory it maps itself), so a
// runtime that lives across inputs shows a few of lavapipe's allocations as
// leaked after each input that first compiles a kernel. The sanitizer suite,
// which makes and destroys its runtimes, checks lavapipe's objects for real
// leaks; leaks from Causeway's own code are still reported here.
extern "C" const char* __lsan_default_suppressions() { return "leak:libvulkan_lvp.so\n"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  causeway::transport::FuzzOne(absl::MakeConstSpan(data, size));
  return 0;
}
