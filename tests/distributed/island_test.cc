// Island servers in processes of their own, driven by a controller over
// loopback: programs over two islands against the same program in one
// process, islands killed and stopped mid-program, secrets.
#include "causeway/scheduler/island.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/distributed/controller.h"
#include "causeway/distributed/island.pb.h"
#include "causeway/distributed/island_process.h"
#include "causeway/distributed/island_server.h"
#include "causeway/kernels/reference.h"
#include "causeway/runtime/glsl_compiler.h"
#include "causeway/runtime/kernel.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/program_def.pb.h"
#include "causeway/scheduler/split.h"
#include "causeway/transport/connection.h"
#include "causeway/transport/control.pb.h"
#include "causeway/transport/frame.h"
#include "causeway/transport/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/program_defs.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using ::causeway::testing::AddAllReduce;
using ::causeway::testing::AddCall;
using ::causeway::testing::AddMesh;
using ::causeway::testing::AddParameter;
using ::causeway::testing::AwaitEntries;
using ::causeway::testing::CountEntries;
using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;
using ::causeway::testing::SettledEntries;
using ::causeway::testing::SpinnerDef;
using ::causeway::testing::ValueOrThrow;
using ::causeway::transport::testing::In;
using ::causeway::transport::testing::ListenOnLoopback;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(30);

// An island server process (`causeway island`) on this machine's CPU driver
// with validation on, or a failed test.
std::unique_ptr<IslandProcess> StartIsland(const std::string& name, int accelerators,
                                           std::vector<std::string> extra = {}, const char* secret = nullptr) {
  std::vector<std::string> args = {::causeway::testing::DeviceFlag(),
                                   absl::StrCat("--accelerators=", accelerators),
                                   ::causeway::testing::ValidationFlag()};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<std::string> env;
  if (secret != nullptr) env.push_back(absl::StrCat("CAUSEWAY_SECRET=", secret));
  auto p = IslandProcess::Start(::causeway::testing::CliPath(), name, args, env);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return nullptr;
  }
  return *std::move(p);
}

// A pipeline over meshes "a" and "b" of two devices each:
//   s = x + y, t = s / 2       on a, split by rows
//   u = t w, out = u + u       on b, t replicated there (it crosses over)
constexpr int kRows = 64, kCols = 64;
ProgramDef PipelineDef() {
  ProgramDef def;
  def.set_name("pipeline");
  for (const char* name : {"a", "b"}) AddMesh(def, name, {2});
  *def.add_functions() = ElementwiseDef("add-half", "add", {kRows / 2, kCols});
  *def.add_functions() = ScaleDef("half", {kRows / 2, kCols}, 0.5f);
  *def.add_functions() = MatmulDef("mm", kRows, kCols, kCols);
  *def.add_functions() = ElementwiseDef("add-full", "add", {kRows, kCols});
  AddParameter(def, "x", "a", {kRows, kCols}, Sharding::Split(0));
  AddParameter(def, "y", "a", {kRows, kCols}, Sharding::Split(0));
  AddParameter(def, "w", "b", {kCols, kCols}, Sharding::Replicated());
  AddCall(def, "sum", "add-half", "a", {"x", "y"}, {"s"});
  AddCall(def, "halve", "half", "a", {"s"}, {"t"});
  AddCall(def, "matmul", "mm", "b", {"t", "w"}, {"u"});
  AddCall(def, "double", "add-full", "b", {"u", "u"}, {"out"});
  def.add_outputs("out");
  return def;
}

struct Inputs {
  std::vector<float> x, y, w;
};
Inputs MakeInputs(int seed) {
  return {RandomFloats(kRows * kCols, seed), RandomFloats(kRows * kCols, seed + 1),
          RandomFloats(kCols * kCols, seed + 2)};
}

// The same program on one island of this process (four accelerators).
std::vector<float> RunInOneProcess(const ProgramDef& def, const Inputs& in) {
  auto rt = MakeRuntime(4);
  auto island = ValueOrThrow(Island::Create(rt.get()));
  auto client = ValueOrThrow(island->Connect("local"));
  auto a = ValueOrThrow(client->AllocateMesh({2}));
  auto b = ValueOrThrow(client->AllocateMesh({2}));
  auto program = BuildProgram(def, {{"a", a}, {"b", b}});
  EXPECT_TRUE(program.ok()) << program.status();
  auto exe = ValueOrThrow(client->Load(*program));
  auto x = ValueOrThrow(client->CreateArray(a, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
  auto y = ValueOrThrow(client->CreateArray(a, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
  auto w = ValueOrThrow(client->CreateArray(b, {kCols, kCols}, DType::kF32));
  EXPECT_OK(x->Upload(in.x.data(), in.x.size() * 4));
  EXPECT_OK(y->Upload(in.y.data(), in.y.size() * 4));
  EXPECT_OK(w->Upload(in.w.data(), in.w.size() * 4));
  auto run = ValueOrThrow(client->Execute(exe, {x, y, w}));
  EXPECT_OK(run.Await(absl::Now() + kRunTimeout));
  std::vector<float> out(kRows * kCols);
  EXPECT_OK(run.outputs[0]->Download(out.data(), out.size() * 4));
  client->Close();
  return out;
}

std::vector<float> Reference(const Inputs& in) {
  std::vector<float> t(kRows * kCols);
  for (size_t i = 0; i < t.size(); ++i) t[i] = (in.x[i] + in.y[i]) * 0.5f;
  std::vector<float> u = reference::Matmul(t, in.w, kRows, kCols, kCols);
  for (float& v : u) v = v + v;
  return u;
}

struct Cluster {
  std::unique_ptr<IslandProcess> a, b;
  std::unique_ptr<Controller> controller;
  RemoteMesh ma, mb;
  std::shared_ptr<RemoteProgram> program;
};

Cluster StartCluster(std::vector<std::string> extra = {}, ControllerOptions options = {}) {
  Cluster c;
  c.a = StartIsland("isl-a", 2, extra);
  c.b = StartIsland("isl-b", 2, extra);
  if (c.a == nullptr || c.b == nullptr) return c;
  auto controller = Controller::Connect({c.a->address(), c.b->address()}, options);
  EXPECT_TRUE(controller.ok()) << controller.status();
  if (!controller.ok()) return c;
  c.controller = *std::move(controller);
  c.ma = ValueOrThrow(c.controller->AllocateMesh(0, {2}));
  c.mb = ValueOrThrow(c.controller->AllocateMesh(1, {2}));
  auto program = c.controller->Load(PipelineDef(), {{"a", c.ma}, {"b", c.mb}});
  EXPECT_TRUE(program.ok()) << program.status();
  if (program.ok()) c.program = *program;
  return c;
}

struct RemoteInputs {
  RemoteArray x, y, w;
};
RemoteInputs Upload(Cluster& c, const Inputs& in) {
  RemoteInputs r;
  r.x = ValueOrThrow(c.controller->CreateArray(c.ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
  r.y = ValueOrThrow(c.controller->CreateArray(c.ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
  r.w = ValueOrThrow(c.controller->CreateArray(c.mb, {kCols, kCols}, DType::kF32));
  EXPECT_OK(c.controller->Upload(r.x, in.x.data(), in.x.size() * 4));
  EXPECT_OK(c.controller->Upload(r.y, in.y.data(), in.y.size() * 4));
  EXPECT_OK(c.controller->Upload(r.w, in.w.data(), in.w.size() * 4));
  return r;
}

// Tests that a program over two island processes gives, run after run with
// several in flight, the same bits as the same program in one process, and
// the CPU reference's values.
TEST(IslandServerTest, TwoIslandProgramMatchesOneProcess) {
  Cluster c = StartCluster();
  ASSERT_NE(c.program, nullptr);
  EXPECT_EQ(c.controller->island_name(0), "isl-a");
  EXPECT_EQ(c.controller->island_name(1), "isl-b");
  constexpr int kRuns = 6;
  std::vector<Inputs> inputs;
  std::vector<RemoteRun> runs;
  for (int r = 0; r < kRuns; ++r) {
    inputs.push_back(MakeInputs(10 * r));
    RemoteInputs in = Upload(c, inputs.back());
    ASSERT_OK_AND_ASSIGN(RemoteRun run, c.controller->Execute(c.program, {in.x, in.y, in.w}));
    runs.push_back(run);
  }
  for (int r = 0; r < kRuns; ++r) {
    ASSERT_OK(runs[r].done.AwaitStatus(absl::Now() + kRunTimeout));
    std::vector<float> got(kRows * kCols);
    ASSERT_OK(c.controller->Download(runs[r].outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
    std::vector<float> local = RunInOneProcess(PipelineDef(), inputs[r]);
    EXPECT_EQ(0, std::memcmp(got.data(), local.data(), got.size() * 4)) << "run " << r;
    std::vector<float> want = Reference(inputs[r]);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::abs(want[i])));
  }
}

// Tests that islands started without names, as processes or in this one,
// name themselves by their addresses, so that a program spans two of them
// (two islands of one name would be refused when it is loaded).
TEST(IslandServerTest, UnnamedIslandsAreNamedByTheirAddresses) {
  Cluster c;
  c.a = StartIsland("", 2);
  c.b = StartIsland("", 2);
  ASSERT_NE(c.a, nullptr);
  ASSERT_NE(c.b, nullptr);
  EXPECT_EQ(c.a->name(), c.a->address());
  EXPECT_EQ(c.b->name(), c.b->address());
  EXPECT_NE(c.a->name(), c.b->name());
  ASSERT_OK_AND_ASSIGN(c.controller, Controller::Connect({c.a->address(), c.b->address()}));
  EXPECT_EQ(c.controller->island_name(0), c.a->address());
  EXPECT_EQ(c.controller->island_name(1), c.b->address());
  ASSERT_OK_AND_ASSIGN(c.ma, c.controller->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(c.mb, c.controller->AllocateMesh(1, {2}));
  ASSERT_OK_AND_ASSIGN(c.program, c.controller->Load(PipelineDef(), {{"a", c.ma}, {"b", c.mb}}));
  const Inputs in = MakeInputs(7);
  RemoteInputs r = Upload(c, in);
  ASSERT_OK_AND_ASSIGN(RemoteRun run, c.controller->Execute(c.program, {r.x, r.y, r.w}));
  ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
  std::vector<float> got(kRows * kCols);
  ASSERT_OK(c.controller->Download(run.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
  const std::vector<float> want = Reference(in);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::abs(want[i])));

  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), IslandServerOptions()));
  EXPECT_EQ(server->name(), server->advertised_address());
}

// Tests that a server that cannot listen (the port is taken) is an error
// naming the address, not a crash.
TEST(IslandServerTest, PortInUseIsAnError) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto first, IslandServer::Create(rt.get(), IslandServerOptions()));
  IslandServerOptions options;
  options.listen = first->address().ToString();
  auto second = IslandServer::Create(rt.get(), options);
  EXPECT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(options.listen));
}

// Tests that two controllers running the same program over the same two
// islands at once each get their own results: the value that crosses from
// one island to the other goes to the run of the controller that sent it,
// though each controller numbers its channels and runs on its own.
TEST(IslandServerTest, ControllersSharingIslandsGetTheirOwnValues) {
  auto a = StartIsland("isl-a", 2), b = StartIsland("isl-b", 2);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  std::vector<Cluster> controllers(2);
  for (Cluster& c : controllers) {
    ASSERT_OK_AND_ASSIGN(c.controller, Controller::Connect({a->address(), b->address()}));
    ASSERT_OK_AND_ASSIGN(c.ma, c.controller->AllocateMesh(0, {2}));
    ASSERT_OK_AND_ASSIGN(c.mb, c.controller->AllocateMesh(1, {2}));
    ASSERT_OK_AND_ASSIGN(c.program, c.controller->Load(PipelineDef(), {{"a", c.ma}, {"b", c.mb}}));
  }
  constexpr int kRuns = 3;
  std::vector<Inputs> inputs;
  std::vector<RemoteRun> runs;
  for (int r = 0; r < kRuns; ++r) {
    for (size_t i = 0; i < controllers.size(); ++i) {
      inputs.push_back(MakeInputs(static_cast<int>(100 * i + 10 * r)));
      RemoteInputs in = Upload(controllers[i], inputs.back());
      ASSERT_OK_AND_ASSIGN(RemoteRun run, controllers[i].controller->Execute(controllers[i].program,
                                                                             {in.x, in.y, in.w}));
      runs.push_back(run);
    }
  }
  for (size_t k = 0; k < runs.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("run ", k));
    Controller& c = *controllers[k % controllers.size()].controller;
    ASSERT_OK(runs[k].done.AwaitStatus(absl::Now() + kRunTimeout));
    std::vector<float> got(kRows * kCols);
    ASSERT_OK(c.Download(runs[k].outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
    std::vector<float> want = Reference(inputs[k]);
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::abs(want[i]))) << "element " << i;
    }
  }
}

// An IslandRequest on a raw connection to an island, as a controller sends it.
absl::StatusOr<IslandResponse> CallIsland(Connection& connection, const IslandRequest& in) {
  Request request;
  request.set_island(in.SerializeAsString());
  CAUSEWAY_ASSIGN_OR_RETURN(Response response, connection.Call(request, absl::Now() + kRunTimeout));
  IslandResponse out;
  if (!out.ParseFromString(response.island())) return absl::DataLossError("an island response that does not decode");
  return out;
}

size_t AwaitSessions(const IslandServer& server, size_t want);

// Island b's part of the pipeline, its channel from isl-a numbered 777.
ProgramPart PipelinePartB() {
  ProgramDef whole = PipelineDef();
  whole.mutable_meshes(0)->set_island("isl-a");
  whole.mutable_meshes(1)->set_island("isl-b");
  SplitProgram split = ValueOrThrow(SplitByIsland(whole, /*first_channel_id=*/777));
  EXPECT_EQ(split.channels.size(), 1u);
  for (const ProgramPart& p : split.parts) {
    if (p.island == "isl-b") return p;
  }
  ADD_FAILURE() << "no part for isl-b";
  return {};
}

// A raw connection to the island at `where`, under `name`, as a controller
// or a peer island makes one.
absl::StatusOr<std::unique_ptr<Connection>> ConnectAs(const SocketAddress& where, const std::string& name,
                                                      RequestHandler handler = nullptr) {
  ClientHandshakeOptions handshake;
  handshake.name = name;
  return Connection::Connect(where, handshake, ConnectionOptions{}, std::move(handler));
}

// A mesh of 2 accelerators made on a raw connection; its id.
absl::StatusOr<uint64_t> AllocateMeshOf2(Connection& c) {
  IslandRequest mesh;
  mesh.mutable_allocate_mesh()->add_dims(2);
  CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse m, CallIsland(c, mesh));
  return m.id();
}

// Loads `part` (b's part of the pipeline) on `mesh` (or on a new mesh);
// returns the program's id.
absl::StatusOr<uint64_t> LoadPartB(Connection& c, const ProgramPart& part,
                                   std::optional<uint64_t> mesh = {}) {
  if (!mesh.has_value()) {
    CAUSEWAY_ASSIGN_OR_RETURN(uint64_t made, AllocateMeshOf2(c));
    mesh = made;
  }
  IslandRequest in;
  LoadProgram* lp = in.mutable_load_program();
  lp->set_program(part.def.SerializeAsString());
  (*lp->mutable_meshes())["b"] = *mesh;
  ChannelEnd* end = lp->add_channels();
  end->set_id(777);
  end->set_send(false);
  end->set_peer_name("isl-a");
  end->set_peer_address("127.0.0.1:1");
  CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse loaded, CallIsland(c, in));
  return loaded.loaded().id();
}

// Tests that an island refuses a program that would receive on a channel id
// another program there receives on (it would take that program's values),
// naming the channel, and that the id is free again once the session that
// held it has ended.
TEST(IslandServerTest, ChannelIdTakenByAnotherSessionIsRefused) {
  auto rt = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-b";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(server->address().ToString()));
  const ProgramPart part = PipelinePartB();
  ASSERT_OK_AND_ASSIGN(auto first, ConnectAs(where, "first"));
  ASSERT_OK_AND_ASSIGN(auto second, ConnectAs(where, "second"));
  ASSERT_OK(LoadPartB(*first, part).status());
  EXPECT_ERROR(LoadPartB(*second, part).status(), absl::StatusCode::kAlreadyExists, "channel 777", "isl-b");
  first.reset();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server->sessions() > 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(server->sessions(), 1u);
  EXPECT_OK(LoadPartB(*second, part).status());
}

// The RunDone notes a raw controller connection receives, by run tag.
class RunDoneNotes {
 public:
  RequestHandler handler() {
    return [this](const Request& r) -> absl::StatusOr<Response> {
      IslandRequest note;
      if (note.ParseFromString(r.island()) && note.has_run_done()) {
        absl::MutexLock lock(&mu_);
        done_[note.run_done().tag()] = StatusFromPeer(note.run_done().code(), note.run_done().message());
      }
      return Response();
    };
  }
  // Run `tag`'s outcome, or DeadlineExceeded if it did not come in time.
  absl::Status Await(uint64_t tag) {
    absl::MutexLock lock(&mu_);
    auto came = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_.contains(tag); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&came), kRunTimeout)) {
      return absl::DeadlineExceededError(absl::StrCat("no RunDone for run ", tag));
    }
    return done_[tag];
  }

 private:
  absl::Mutex mu_;
  std::map<uint64_t, absl::Status> done_ ABSL_GUARDED_BY(mu_);
};

// Island b's part of the pipeline loaded on an island server by a raw
// controller connection, with its input w made: runs are started by tag,
// and their values sent by whoever plays island a.
struct PartBOnIsland {
  RunDoneNotes notes;
  std::unique_ptr<Connection> controller;
  uint64_t program = 0;
  uint64_t w = 0;

  absl::Status Load(const SocketAddress& where) {
    CAUSEWAY_ASSIGN_OR_RETURN(controller, ConnectAs(where, "controller", notes.handler()));
    CAUSEWAY_ASSIGN_OR_RETURN(uint64_t mesh, AllocateMeshOf2(*controller));
    CAUSEWAY_ASSIGN_OR_RETURN(program, LoadPartB(*controller, PipelinePartB(), mesh));
    IslandRequest create;
    create.mutable_create_array()->set_mesh(mesh);
    create.mutable_create_array()->add_shape(kCols);
    create.mutable_create_array()->add_shape(kCols);
    create.mutable_create_array()->set_dtype(F32);
    create.mutable_create_array()->set_sharding(ShardingDef().SerializeAsString());
    CAUSEWAY_ASSIGN_OR_RETURN(IslandResponse made, CallIsland(*controller, create));
    w = made.id();
    return absl::OkStatus();
  }
  // Starts run `tag` (its deadline: the island's when infinite).
  absl::Status Execute(uint64_t tag, absl::Duration deadline = absl::InfiniteDuration()) {
    IslandRequest run;
    run.mutable_execute()->set_program(program);
    run.mutable_execute()->set_tag(tag);
    run.mutable_execute()->add_inputs(w);
    if (deadline != absl::InfiniteDuration())
      run.mutable_execute()->set_deadline_us(absl::ToInt64Microseconds(deadline));
    return CallIsland(*controller, run).status();
  }
  // Cancels run `tag`.
  absl::Status Cancel(uint64_t tag) {
    IslandRequest cancel;
    cancel.mutable_cancel_run()->set_program(program);
    cancel.mutable_cancel_run()->set_tag(tag);
    return CallIsland(*controller, cancel).status();
  }
};

// Tells the island at the other end of `link` (as island a) that channel
// 777's values come over it.
absl::Status OpenChannel777(Connection& link) {
  IslandRequest open;
  open.mutable_channel_open()->set_channel(777);
  Request request;
  request.set_island(open.SerializeAsString());
  return link.Notify(request, absl::Now() + kRunTimeout);
}

// Sends run `tag`'s value t on channel 777 over `link`.
absl::Status SendT(Connection& link, uint64_t tag) {
  const std::vector<float> t = RandomFloats(kRows * kCols, 3);
  const absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(t.data()), t.size() * 4);
  return link.SendData(777, tag, 0, bytes.size(), bytes, absl::Now() + kRunTimeout);
}

// Tests that the end of a peer island's connection fails the receives of
// the channels that peer opened on it, and only those: a connection under
// the peer's name that carried nothing (a spare link, or a link that broke
// before a later program was loaded) ends without failing a program whose
// values come over another, and a value that comes over the new link is
// received.
TEST(IslandServerTest, TheEndOfAPeerLinkFailsOnlyTheChannelsItCarried) {
  auto rt = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-b";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(server->address().ToString()));
  PartBOnIsland b;
  ASSERT_OK(b.Load(where));

  // A link from isl-a that opened nothing ends, and the island has reaped it.
  ASSERT_OK_AND_ASSIGN(auto spare, ConnectAs(where, "isl-a"));
  ASSERT_EQ(AwaitSessions(*server, 2), 2u);
  spare.reset();
  ASSERT_EQ(AwaitSessions(*server, 1), 1u);
  // The channel's values come over a new link: run 1 is served.
  ASSERT_OK_AND_ASSIGN(auto link, ConnectAs(where, "isl-a"));
  ASSERT_OK(OpenChannel777(*link));
  ASSERT_OK(b.Execute(1));
  ASSERT_OK(SendT(*link, 1));
  EXPECT_OK(b.notes.Await(1));
  // A session that neither sends on the channel nor loaded its program
  // cannot fail its runs.
  {
    ASSERT_OK_AND_ASSIGN(auto stranger, ConnectAs(where, "stranger"));
    IslandRequest failed;
    failed.mutable_channel_failed()->set_channel(777);
    failed.mutable_channel_failed()->set_tag(3);
    failed.mutable_channel_failed()->set_code(static_cast<int32_t>(absl::StatusCode::kAborted));
    failed.mutable_channel_failed()->set_message("failed by a stranger");
    Request request;
    request.set_island(failed.SerializeAsString());
    ASSERT_OK(stranger->Notify(request, absl::Now() + kRunTimeout));
    IslandRequest describe;
    describe.mutable_describe();
    ASSERT_OK(CallIsland(*stranger, describe).status());  // the note was handled before this answer
  }
  ASSERT_OK(b.Execute(3));
  ASSERT_OK(SendT(*link, 3));
  EXPECT_OK(b.notes.Await(3));
  // That link ends before run 2's value: run 2 fails, naming the link's end.
  ASSERT_OK(b.Execute(2));
  link->Close("isl-a is going away");
  const absl::Status lost = b.notes.Await(2);
  EXPECT_FALSE(lost.ok());
  EXPECT_FALSE(absl::IsDeadlineExceeded(lost)) << lost;
  EXPECT_THAT(std::string(lost.message()), HasSubstr("isl-a is going away"));
}

// Waits up to kRunTimeout for `c` to fail; its status.
absl::Status AwaitConnectionFailure(const Connection& c) {
  const absl::Time deadline = absl::Now() + kRunTimeout;
  while (c.status().ok() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  return c.status();
}

// Tests that bytes of a value sent twice are refused, not counted toward
// the value: a channel's run whose first half comes twice fails instead of
// completing with a second half never sent, and the link that sent it is
// closed naming the bytes (so the channel's later runs fail too, as when a
// peer is lost, while the controller's session goes on); an upload whose
// first half comes twice closes the controller's connection, naming the
// array, instead of writing it.
TEST(IslandServerTest, BytesSentTwiceAreRefusedNotCounted) {
  auto rt = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-b";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(server->address().ToString()));
  PartBOnIsland b;
  ASSERT_OK(b.Load(where));
  const std::vector<float> t = RandomFloats(kRows * kCols, 3);
  const absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(t.data()), t.size() * 4);
  const absl::Span<const uint8_t> half = bytes.first(bytes.size() / 2);
  {
    ASSERT_OK_AND_ASSIGN(auto link, ConnectAs(where, "isl-a"));
    ASSERT_OK(OpenChannel777(*link));
    ASSERT_OK(b.Execute(1));
    ASSERT_OK(link->SendData(777, 1, 0, bytes.size(), half, absl::Now() + kRunTimeout));
    ASSERT_OK(link->SendData(777, 1, 0, bytes.size(), half, absl::Now() + kRunTimeout));
    EXPECT_ERROR(
        AwaitConnectionFailure(*link), absl::StatusCode::kUnavailable, "closed the connection",
        "channel 777 from island 'isl-a': run 1 sent bytes [0, 8192) of its value, overlapping bytes [0, "
        "8192) it had sent already");
    EXPECT_ERROR(b.notes.Await(1), absl::StatusCode::kDataLoss, "overlapping bytes [0, 8192)");
  }
  ASSERT_OK(b.Execute(2));
  EXPECT_ERROR(b.notes.Await(2), absl::StatusCode::kDataLoss, "overlapping bytes [0, 8192)");
  EXPECT_OK(b.controller->status());
  // The upload: the controller's own connection.
  ASSERT_OK(b.controller->SendData(kUploadStream, b.w, 0, bytes.size(), half, absl::Now() + kRunTimeout));
  ASSERT_OK(b.controller->SendData(kUploadStream, b.w, 0, bytes.size(), half, absl::Now() + kRunTimeout));
  EXPECT_ERROR(
      AwaitConnectionFailure(*b.controller), absl::StatusCode::kUnavailable, "closed the connection",
      absl::StrCat("the upload to array ", b.w, " sent bytes [0, 8192) of its value, overlapping bytes [0, ",
                   "8192) it had sent already"));
}

// Tests that a controller's download refuses bytes an island sends twice:
// an island (here a raw one) that sends the first half of an array twice
// and says the fetch is done fails the download with DataLoss, instead of
// handing back a second half it never sent.
TEST(ControllerTest, DownloadRefusesBytesSentTwice) {
  ASSERT_OK_AND_ASSIGN(Socket listener, ListenOnLoopback());
  const std::vector<uint8_t> half(512, 7);
  std::unique_ptr<Connection> island;
  std::atomic<Connection*> self{nullptr};
  // Answers a fetch with the first half twice, then says it is done.
  auto handler = [&](const Request& r) -> absl::StatusOr<Response> {
    IslandRequest in;
    if (!in.ParseFromString(r.island()) || !in.has_fetch()) return absl::UnimplementedError("fetch only");
    const uint64_t fetch = in.fetch().fetch();
    for (int i = 0; i < 2; ++i)
      CAUSEWAY_RETURN_IF_ERROR(self.load()->SendData(kFetchStream, fetch, 0, 1024, half, In(kRunTimeout)));
    IslandRequest done;
    done.mutable_fetch_done()->set_fetch(fetch);
    Request note;
    note.set_island(done.SerializeAsString());
    CAUSEWAY_RETURN_IF_ERROR(self.load()->Notify(note, In(kRunTimeout)));
    Response ok;
    ok.set_island(IslandResponse().SerializeAsString());
    return ok;
  };
  std::thread acceptor([&] {
    absl::StatusOr<Socket> socket = listener.Accept(In(kRunTimeout));
    ASSERT_TRUE(socket.ok()) << socket.status();
    ServerHandshakeOptions handshake;
    handshake.name = "two-faced";
    absl::StatusOr<std::unique_ptr<Connection>> c =
        Connection::Accept(*std::move(socket), handshake, ConnectionOptions{}, handler);
    ASSERT_TRUE(c.ok()) << c.status();
    island = *std::move(c);
    self = island.get();
  });
  ASSERT_OK_AND_ASSIGN(auto controller, Controller::Connect({absl::StrCat("127.0.0.1:", listener.port())}));
  acceptor.join();
  ASSERT_NE(self.load(), nullptr);
  const RemoteArray array{0, 1, {256}, DType::kF32};
  std::vector<uint8_t> host(1024);
  EXPECT_ERROR(controller->Download(array, host.data(), host.size(), In(kRunTimeout)),
               absl::StatusCode::kUnavailable,
               "fetch 1 sent bytes [0, 512) of its value, overlapping bytes [0, 512)");
}

// SpinnerDef loaded on `mesh`, and its input x (zero).
struct Spinner {
  std::shared_ptr<RemoteProgram> program;
  RemoteArray x;
};
absl::StatusOr<Spinner> LoadSpinner(Controller& c, const RemoteMesh& mesh, absl::Duration length) {
  Spinner spinner;
  CAUSEWAY_ASSIGN_OR_RETURN(spinner.program, c.Load(SpinnerDef(4096, length), {{"m", mesh}}));
  CAUSEWAY_ASSIGN_OR_RETURN(spinner.x, c.CreateArray(mesh, {1}, DType::kI32));
  const int32_t zero = 0;
  CAUSEWAY_RETURN_IF_ERROR(c.Upload(spinner.x, &zero, sizeof(zero)));
  return spinner;
}

// The program `name`: y = x + b, n floats each, on a mesh "m" of one
// accelerator.
ProgramDef AddDef(const std::string& name, int n) {
  ProgramDef def;
  def.set_name(name);
  AddMesh(def, "m", {1});
  *def.add_functions() = ElementwiseDef("add", "add", {n});
  AddParameter(def, "x", "m", {n}, Sharding::Replicated());
  AddParameter(def, "b", "m", {n}, Sharding::Replicated());
  AddCall(def, "add", "add", "m", {"x", "b"}, {"y"});
  def.add_outputs("y");
  return def;
}

// Tests that a run naming one output id twice is refused (one output would
// replace the other silently), while distinct ids are served.
TEST(IslandServerTest, AnOutputIdGivenTwiceIsRefused) {
  auto rt = MakeRuntime(1);
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), IslandServerOptions{.name = "isl"}));
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(server->address().ToString()));
  RunDoneNotes notes;
  ASSERT_OK_AND_ASSIGN(auto c, ConnectAs(where, "controller", notes.handler()));
  IslandRequest mesh;
  mesh.mutable_allocate_mesh()->add_dims(1);
  ASSERT_OK_AND_ASSIGN(IslandResponse m, CallIsland(*c, mesh));
  // y = x + b and z = x + b: two outputs.
  constexpr int kN = 256;
  ProgramDef def = AddDef("two-outputs", kN);
  AddCall(def, "add-again", "add", "m", {"x", "b"}, {"z"});
  def.add_outputs("z");
  IslandRequest load;
  load.mutable_load_program()->set_program(def.SerializeAsString());
  (*load.mutable_load_program()->mutable_meshes())["m"] = m.id();
  ASSERT_OK_AND_ASSIGN(IslandResponse loaded, CallIsland(*c, load));
  std::vector<uint64_t> inputs;
  for (int i = 0; i < 2; ++i) {
    IslandRequest create;
    create.mutable_create_array()->set_mesh(m.id());
    create.mutable_create_array()->add_shape(kN);
    create.mutable_create_array()->set_dtype(F32);
    create.mutable_create_array()->set_sharding(ShardingDef().SerializeAsString());
    ASSERT_OK_AND_ASSIGN(IslandResponse made, CallIsland(*c, create));
    inputs.push_back(made.id());
  }
  auto execute = [&](uint64_t tag, std::vector<uint64_t> outputs) {
    IslandRequest run;
    run.mutable_execute()->set_program(loaded.loaded().id());
    run.mutable_execute()->set_tag(tag);
    for (uint64_t id : inputs) run.mutable_execute()->add_inputs(id);
    for (uint64_t id : outputs) run.mutable_execute()->add_outputs(id);
    return CallIsland(*c, run).status();
  };
  EXPECT_ERROR(execute(1, {kControllerIds + 5, kControllerIds + 5}), absl::StatusCode::kInvalidArgument,
               absl::StrCat("output id ", kControllerIds + 5, " is given twice"));
  ASSERT_OK(execute(2, {kControllerIds + 5, kControllerIds + 6}));
  EXPECT_OK(notes.Await(2));
}

// y = a + b on `mesh` through `c`, checked against the CPU; `seed` varies
// the inputs.
absl::Status RemoteAddAndCheck(Controller& c, const RemoteMesh& mesh, int seed) {
  constexpr int kN = 4096;
  CAUSEWAY_ASSIGN_OR_RETURN(auto program, c.Load(AddDef("add", kN), {{"m", mesh}}));
  const std::vector<float> ah = RandomFloats(kN, seed), bh = RandomFloats(kN, seed + 1);
  CAUSEWAY_ASSIGN_OR_RETURN(RemoteArray a, c.CreateArray(mesh, {kN}, DType::kF32));
  CAUSEWAY_ASSIGN_OR_RETURN(RemoteArray b, c.CreateArray(mesh, {kN}, DType::kF32));
  CAUSEWAY_RETURN_IF_ERROR(c.Upload(a, ah.data(), ah.size() * 4));
  CAUSEWAY_RETURN_IF_ERROR(c.Upload(b, bh.data(), bh.size() * 4));
  CAUSEWAY_ASSIGN_OR_RETURN(RemoteRun run, c.Execute(program, {a, b}));
  CAUSEWAY_RETURN_IF_ERROR(run.done.AwaitStatus(absl::Now() + kRunTimeout));
  std::vector<float> got(kN);
  CAUSEWAY_RETURN_IF_ERROR(c.Download(run.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
  for (int i = 0; i < kN; ++i) {
    if (got[i] != ah[i] + bh[i]) return absl::InternalError(absl::StrCat("wrong result at ", i));
  }
  return absl::OkStatus();
}

// Tests a remote run's deadline, with two tenants on an island process of
// two accelerators: the first's kernel fails at its 1 s deadline with
// DeadlineExceeded naming the island, program, gang call, kernel and
// accelerator, and the second tenant, on the other accelerator, gets
// correct results before and after (on lavapipe its dispatches wait for the
// kernel meanwhile: deadline_test.cc says why); the island refuses
// deadlines below its --min-deadline.
TEST(IslandServerTest, RemoteRunFailsAtItsDeadlineWhileAnotherTenantGoesOn) {
  auto started = IslandProcess::Start(::causeway::testing::CliPath(), "isl-d",
                                      {::causeway::testing::DeviceFlag(), "--accelerators=2",
                                       ::causeway::testing::ValidationFlag(), "--min-deadline=200ms"},
                                      {"LP_NUM_THREADS=0"});
  ASSERT_OK(started.status());
  std::unique_ptr<IslandProcess> island = *std::move(started);
  ControllerOptions spinner_options, other_options;
  spinner_options.name = "spinner";
  other_options.name = "other";
  ASSERT_OK_AND_ASSIGN(auto spinner, Controller::Connect({island->address()}, spinner_options));
  ASSERT_OK_AND_ASSIGN(auto other, Controller::Connect({island->address()}, other_options));
  ASSERT_OK_AND_ASSIGN(RemoteMesh spin_mesh, spinner->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh other_mesh, other->AllocateMesh(0, {1}));
  ASSERT_OK(RemoteAddAndCheck(*other, other_mesh, 1));
  ASSERT_OK_AND_ASSIGN(Spinner spinner_program, LoadSpinner(*spinner, spin_mesh, absl::Seconds(3)));
  const auto& [program, x] = spinner_program;

  ASSERT_OK_AND_ASSIGN(RemoteRun hurried,
                       spinner->Execute(program, {x}, {.deadline = absl::Milliseconds(50)}));
  EXPECT_ERROR(hurried.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kInvalidArgument,
               "below island 'isl-d''s least of 200ms");
  const absl::Time start = absl::Now();
  ASSERT_OK_AND_ASSIGN(RemoteRun run, spinner->Execute(program, {x}, {.deadline = absl::Seconds(1)}));
  // When the run ended, not when this thread came back from the other
  // tenant's runs to await it (a run it began at 799 ms may end seconds
  // later on a loaded machine).
  absl::Notification ended;
  absl::Time ended_at;
  run.done.OnReady([&](const auto&) {
    ended_at = absl::Now();
    ended.Notify();
  });
  int other_runs = 0;
  while (absl::Now() < start + absl::Milliseconds(800))
    ASSERT_OK(RemoteAddAndCheck(*other, other_mesh, 10 + ++other_runs));
  const absl::Status status = run.done.AwaitStatus(absl::Now() + kRunTimeout);
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(kRunTimeout));
  const absl::Duration waited = ended_at - start;
  EXPECT_ERROR(status, absl::StatusCode::kDeadlineExceeded, "island 'isl-d'", "program 'spinner",
               "deadline of 1.00 s", "gang call 'spin'", "kernel 'spin'", "accelerator");
  EXPECT_GE(waited, absl::Seconds(1));
  EXPECT_LT(waited, absl::Seconds(1) + causeway::testing::kSchedulingSlack);
  for (int r = 0; r < 3; ++r) ASSERT_OK(RemoteAddAndCheck(*other, other_mesh, 100 + r));
  EXPECT_GE(other_runs, 1);
  // Every tenant sees which accelerator is out of service, and why; new
  // meshes avoid it.
  ASSERT_OK_AND_ASSIGN(IslandDescription d, other->Describe(0));
  ASSERT_EQ(d.health.size(), 2u);
  EXPECT_EQ(d.health[0].ok() + d.health[1].ok(), 1) << d.health[0] << "; " << d.health[1];
  const absl::Status out = d.health[0].ok() ? d.health[1] : d.health[0];
  EXPECT_ERROR(out, absl::StatusCode::kUnavailable, "is quarantined", "kernel 'spin'",
               "past its limit of 1.00 s");
  EXPECT_ERROR(spinner->AllocateMesh(0, {2}).status(), absl::StatusCode::kResourceExhausted,
               "1 out of service");
  ASSERT_OK_AND_ASSIGN(RemoteMesh fresh, spinner->AllocateMesh(0, {1}));
  ASSERT_OK(RemoteAddAndCheck(*spinner, fresh, 200));
}

// Tests that an island whose accelerator is wedged by a kernel with no
// deadline (about a minute of work) still ends on SIGTERM once its own
// waits are over (it quarantines the accelerator after 2 s and abandons it a
// second later, naming it on stderr), not when the kernel ends, and that its
// controller is told.
TEST(IslandServerTest, SigtermEndsAnIslandWithAWedgedAccelerator) {
  auto started = IslandProcess::Start(
      ::causeway::testing::CliPath(), "isl-w",
      {::causeway::testing::DeviceFlag(), "--accelerators=1", ::causeway::testing::ValidationFlag()},
      {"LP_NUM_THREADS=0"});
  ASSERT_OK(started.status());
  std::unique_ptr<IslandProcess> island = *std::move(started);
  ASSERT_OK_AND_ASSIGN(auto spinner, Controller::Connect({island->address()}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, spinner->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(Spinner spinner_program, LoadSpinner(*spinner, mesh, absl::Seconds(60)));
  const auto& [program, x] = spinner_program;
  ASSERT_OK_AND_ASSIGN(RemoteRun run, spinner->Execute(program, {x}));
  // Running, not finished.
  EXPECT_ERROR(run.done.AwaitStatus(absl::Now() + absl::Milliseconds(500)),
               absl::StatusCode::kDeadlineExceeded);
  const absl::Time stopping = absl::Now();
  const int wait_status = island->Stop(/*limit=*/absl::Seconds(30));
  // The island's own waits are 3 s; the process exit (a sanitizer's at
  // exit) and a loaded machine add the slack. The kernel would hold it for
  // about a minute.
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(3) + ::causeway::testing::kSchedulingSlack);
  EXPECT_TRUE(WIFEXITED(wait_status)) << wait_status;
  // The controller hears that the island is gone.
  EXPECT_ERROR(run.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kUnavailable, "isl-w");
}

// Island b's part on an island server "isl-b" of two accelerators, and a
// peer playing island a: connected, its channel opened, and silent (its
// heartbeats go on) until the test sends.
struct SilentPeer {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<IslandServer> server;
  PartBOnIsland b;
  std::unique_ptr<Connection> peer;

  absl::Status Set() {
    rt = MakeRuntime(2);
    IslandServerOptions options;
    options.name = "isl-b";
    CAUSEWAY_ASSIGN_OR_RETURN(server, IslandServer::Create(rt.get(), options));
    CAUSEWAY_ASSIGN_OR_RETURN(SocketAddress where, SocketAddress::Parse(server->address().ToString()));
    CAUSEWAY_RETURN_IF_ERROR(b.Load(where));
    CAUSEWAY_ASSIGN_OR_RETURN(peer, ConnectAs(where, "isl-a"));
    return OpenChannel777(*peer);
  }
};

// Tests that a peer island that stays connected but never sends a run's
// value cannot hold the receiving island: the run fails at its deadline,
// saying that the value had not come, and nothing is quarantined (the next
// run, whose value comes, is served).
TEST(IslandServerTest, APeerThatNeverSendsFailsTheRunAtItsDeadline) {
  SilentPeer t;
  ASSERT_OK(t.Set());
  PartBOnIsland& b = t.b;
  Connection* peer = t.peer.get();

  const absl::Time start = absl::Now();
  ASSERT_OK(b.Execute(1, absl::Milliseconds(500)));
  EXPECT_ERROR(b.notes.Await(1), absl::StatusCode::kDeadlineExceeded, "deadline of 0.50 s", "had not come");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500) + causeway::testing::kSchedulingSlack);
  ASSERT_OK(b.Execute(2, absl::Seconds(30)));
  ASSERT_OK(SendT(*peer, 2));
  EXPECT_OK(b.notes.Await(2));
  for (int i = 0; i < 2; ++i) EXPECT_OK(t.rt->accelerator(i)->health());
}

// Tests that a controller can cancel a run waiting for a value from a peer
// that never sends it (no deadline: without the cancel it would wait as long
// as the peer lives): it is reported Cancelled at once, and the island serves
// the next runs, whose values come. A run's tag names one run at a time.
TEST(IslandServerTest, CancelledRunWaitingForAPeerEndsAndTheNextIsServed) {
  SilentPeer t;
  ASSERT_OK(t.Set());
  PartBOnIsland& b = t.b;
  Connection* peer = t.peer.get();

  ASSERT_OK(b.Execute(1));
  EXPECT_ERROR(b.Execute(1), absl::StatusCode::kInvalidArgument, "run 1 of program", "already in progress");
  ASSERT_OK(b.Cancel(1));
  // Execute answers once the run is queued on the session's worker, so the
  // cancel may find it not yet started, started, or waiting for its value
  // ("cancelled by its controller before it started", or "by client ...
  // (its value from another island had not come)"): each way it ends now.
  EXPECT_ERROR(b.notes.Await(1), absl::StatusCode::kCancelled, "run 1 of program 'pipeline@isl-b'",
               "cancelled by");
  // Cancels right behind their runs meet them queued on the session's
  // worker, being started or started (once, a cancel that came while its run
  // was being started was lost, and the run waited for ever).
  for (uint64_t tag = 10; tag < 30; ++tag) {
    ASSERT_OK(b.Execute(tag));
    ASSERT_OK(b.Cancel(tag));
    EXPECT_ERROR(b.notes.Await(tag), absl::StatusCode::kCancelled, "cancelled");
  }
  ASSERT_OK(b.Execute(2));
  ASSERT_OK(SendT(*peer, 2));
  EXPECT_OK(b.notes.Await(2));
  // Cancelling a run that has ended, or one never started, changes nothing.
  ASSERT_OK(b.Cancel(2));
  ASSERT_OK(b.Cancel(99));
  ASSERT_OK(b.Execute(3));
  ASSERT_OK(SendT(*peer, 3));
  EXPECT_OK(b.notes.Await(3));
  EXPECT_OK(b.notes.Await(2));
  for (int i = 0; i < 2; ++i) EXPECT_OK(t.rt->accelerator(i)->health());
}

// Tests Controller::Cancel on a run whose kernel runs for seconds: the run
// fails with Cancelled naming the island, program, gang call and kernel
// (without the cancel it would succeed once the kernel ends), the
// accelerator is not quarantined, and the controller's next run there gets
// correct results.
TEST(IslandServerTest, ControllerCancelsItsRun) {
  auto rt = MakeRuntime(1);
  IslandServerOptions options;
  options.name = "isl-c";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  ControllerOptions controller_options;
  controller_options.name = "canceller";
  ASSERT_OK_AND_ASSIGN(auto controller,
                       Controller::Connect({server->address().ToString()}, controller_options));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, controller->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(Spinner spinner_program, LoadSpinner(*controller, mesh, absl::Seconds(3)));
  const auto& [program, x] = spinner_program;
  ASSERT_OK_AND_ASSIGN(RemoteRun run, controller->Execute(program, {x}));
  // Running, not finished.
  EXPECT_ERROR(run.done.AwaitStatus(absl::Now() + absl::Milliseconds(300)),
               absl::StatusCode::kDeadlineExceeded);
  ASSERT_OK(controller->Cancel(run));
  EXPECT_ERROR(run.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled,
               "island 'isl-c'", "program 'spinner", "cancelled by client 'canceller'", "gang call 'spin'",
               "kernel 'spin'");
  EXPECT_ERROR(controller->Cancel(RemoteRun{}), absl::StatusCode::kInvalidArgument, "not a run");
  ASSERT_OK(RemoteAddAndCheck(*controller, mesh, 1));
  EXPECT_OK(rt->accelerator(0)->health());
}

// Tests that a run the island cannot start (an input released before it)
// fails with the island's reason, though runs are sent without waiting for
// an answer, and that the island goes on with the next.
TEST(IslandServerTest, RunRefusedByTheIslandFailsWithItsReason) {
  Cluster c = StartCluster();
  ASSERT_NE(c.program, nullptr);
  Inputs in = MakeInputs(6);
  RemoteInputs remote = Upload(c, in);
  RemoteArray gone =
      ValueOrThrow(c.controller->CreateArray(c.ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
  ASSERT_OK(c.controller->Release(gone));
  // Bytes for a released array are dropped; the connection stays up.
  ASSERT_OK(c.controller->Upload(gone, in.x.data(), in.x.size() * 4));
  ASSERT_OK_AND_ASSIGN(RemoteRun bad, c.controller->Execute(c.program, {gone, remote.y, remote.w}));
  EXPECT_ERROR(bad.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kNotFound, "isl-a",
               absl::StrCat("no array ", gone.id));
  ASSERT_OK_AND_ASSIGN(RemoteRun good, c.controller->Execute(c.program, {remote.x, remote.y, remote.w}));
  ASSERT_OK(good.done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_OK(c.controller->island_status(0));
  std::vector<float> got(kRows * kCols);
  ASSERT_OK(c.controller->Download(good.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
  std::vector<float> want = Reference(in);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::abs(want[i])));
}

// Tests that kill -9 of an island in the middle of a stream of runs fails
// the controller's pending runs within the deadline, and that the other
// island keeps serving. Every error that the loss causes (the runs in flight,
// whichever island's part saw it first; runs, downloads and calls after it)
// is the one form naming the island, its name and address.
TEST(IslandServerTest, KilledIslandFailsRunsWithinTheDeadline) {
  Cluster c = StartCluster();
  ASSERT_NE(c.program, nullptr);
  Inputs in = MakeInputs(1);
  RemoteInputs remote = Upload(c, in);
  const std::string lost = absl::StrCat("island 1 ('isl-b' at ", c.b->address(), ") lost: ");
  auto expect_lost = [&](const absl::Status& s, const std::string& what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << what << ": " << s;
    EXPECT_TRUE(absl::StartsWith(s.message(), lost)) << what << ": " << s;
  };
  std::vector<RemoteRun> runs;
  for (int r = 0; r < 3; ++r) runs.push_back(*c.controller->Execute(c.program, {remote.x, remote.y, remote.w}));
  ASSERT_OK(runs[0].done.AwaitStatus(absl::Now() + kRunTimeout));
  for (int r = 0; r < 20; ++r) {
    auto run = c.controller->Execute(c.program, {remote.x, remote.y, remote.w});
    if (run.ok()) runs.push_back(*run);
  }
  c.b->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  int failed = 0;
  for (RemoteRun& run : runs) {
    absl::Status s = run.done.AwaitStatus(killed + absl::Seconds(5) + absl::Seconds(2));
    ASSERT_FALSE(absl::IsDeadlineExceeded(s)) << "a run still pending 7 s after the kill";
    if (!s.ok()) {
      ++failed;
      expect_lost(s, absl::StrCat("run ", failed));
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(absl::Now() - killed, absl::Seconds(7));
  EXPECT_FALSE(c.controller->island_status(1).ok());
  // After the loss: a run, a download and a call that need island 1.
  expect_lost(c.controller->Execute(c.program, {remote.x, remote.y, remote.w}).status(), "execute");
  std::vector<float> w(kCols * kCols);
  expect_lost(c.controller->Download(remote.w, w.data(), w.size() * 4, absl::Now() + kRunTimeout),
              "download");
  expect_lost(c.controller->CreateArray(c.mb, {4}, DType::kF32).status(), "create an array");
  // Island a still works: a program on it alone.
  ProgramDef local;
  local.set_name("local");
  AddMesh(local, "a", {2});
  *local.add_functions() = ScaleDef("half", {kRows / 2, kCols}, 0.5f);
  AddParameter(local, "x", "a", {kRows, kCols}, Sharding::Split(0));
  AddCall(local, "halve", "half", "a", {"x"}, {"h"});
  local.add_outputs("h");
  ASSERT_OK_AND_ASSIGN(auto program, c.controller->Load(local, {{"a", c.ma}}));
  ASSERT_OK_AND_ASSIGN(RemoteRun run, c.controller->Execute(program, {remote.x}));
  ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
  std::vector<float> got(kRows * kCols);
  ASSERT_OK(c.controller->Download(run.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], in.x[i] * 0.5f);
}

// Tests that a stopped (SIGSTOP) island is caught by the heartbeat: the
// controller's runs fail within the peer timeout, naming it.
TEST(IslandServerTest, StoppedIslandIsCaughtByTheHeartbeat) {
  // 3 s of silence (15 heartbeats) is a stopped island, not a loaded one.
  ControllerOptions options;
  options.connection.peer_timeout = absl::Seconds(3);
  options.connection.heartbeat_interval = absl::Milliseconds(200);
  Cluster c = StartCluster({"--peer-timeout-ms=3000"}, options);
  ASSERT_NE(c.program, nullptr);
  RemoteInputs remote = Upload(c, MakeInputs(2));
  ASSERT_OK(c.controller->Execute(c.program, {remote.x, remote.y, remote.w})->done.AwaitStatus(
      absl::Now() + kRunTimeout));
  c.b->Signal(SIGSTOP);
  int wait_status = 0;
  ASSERT_EQ(waitpid(c.b->pid(), &wait_status, WUNTRACED), c.b->pid());  // it is stopped now
  ASSERT_TRUE(WIFSTOPPED(wait_status));
  const absl::Time stopped = absl::Now();
  auto run = c.controller->Execute(c.program, {remote.x, remote.y, remote.w});
  const absl::Duration bound = options.connection.peer_timeout + causeway::testing::kSchedulingSlack;
  absl::Status s = run.ok() ? run->done.AwaitStatus(stopped + bound) : run.status();
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("isl-b"));
  EXPECT_LT(absl::Now() - stopped, bound);
}

// Tests that Release waits for no answer: an array on a stopped (SIGSTOP)
// island is released at once (a round trip would wait for the island to
// go on), and once the island goes on the array is gone, and a second
// release is refused by the controller itself.
TEST(IslandServerTest, ReleaseWaitsForNoAnswer) {
  ControllerOptions options;
  options.call_timeout = absl::Minutes(5);
  options.connection.peer_timeout = absl::Minutes(5);
  Cluster c = StartCluster({}, options);
  ASSERT_NE(c.program, nullptr);
  ASSERT_OK_AND_ASSIGN(RemoteArray x, c.controller->CreateArray(c.mb, {kRows, kCols}, DType::kF32));
  c.b->Signal(SIGSTOP);
  int wait_status = 0;
  ASSERT_EQ(waitpid(c.b->pid(), &wait_status, WUNTRACED), c.b->pid());  // it is stopped now
  ASSERT_TRUE(WIFSTOPPED(wait_status));
  auto released = std::async(std::launch::async, [&] { return c.controller->Release(x); });
  const bool returned = released.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  c.b->Signal(SIGCONT);
  ASSERT_TRUE(returned) << "Release waited for the stopped island";
  ASSERT_OK(released.get());
  std::vector<float> got(kRows * kCols);
  EXPECT_ERROR(c.controller->Download(x, got.data(), got.size() * 4, absl::Now() + kRunTimeout),
               absl::StatusCode::kNotFound, "no array");
  EXPECT_ERROR(c.controller->Release(x), absl::StatusCode::kNotFound, "no array");
}

// Tests that an island with a secret refuses a controller without it or
// with another, and serves one that holds it.
TEST(IslandServerTest, SecretIsRequiredAndChecked) {
  const char* secret = "a-shared-secret-of-32-characters";
  auto island = StartIsland("isl-s", 1, {}, secret);
  ASSERT_NE(island, nullptr);
  auto none = Controller::Connect({island->address()});
  EXPECT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("secret"));
  ControllerOptions wrong;
  wrong.secret = ValueOrThrow(Secret::FromBytes("another-secret-of-32-characters!", "test"));
  auto bad = Controller::Connect({island->address()}, wrong);
  EXPECT_ERROR(bad, absl::StatusCode::kUnauthenticated,
               "failed to prove that it holds the shared secret (a different secret?)");
  ControllerOptions right;
  right.secret = ValueOrThrow(Secret::FromBytes(secret, "test"));
  auto good = Controller::Connect({island->address()}, right);
  ASSERT_TRUE(good.ok()) << good.status();
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, (*good)->AllocateMesh(0, {1}));
  EXPECT_EQ(mesh.dims, std::vector<int>{1});
}

// Tests that SIGTERM ends an island cleanly (exit 0).
TEST(IslandServerTest, SigtermEndsTheIslandCleanly) {
  auto island = StartIsland("isl-t", 1);
  ASSERT_NE(island, nullptr);
  auto controller = Controller::Connect({island->address()});
  ASSERT_TRUE(controller.ok()) << controller.status();
  int status = island->Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Tests data parallelism across islands: each island all-reduces its
// gradient over its own mesh (ICI), then adds the other island's (DCN), both
// ways in one program; against the CPU, several runs in flight.
TEST(IslandServerTest, DataParallelAcrossIslands) {
  constexpr int kN = 4096;
  auto a = StartIsland("isl-a", 2), b = StartIsland("isl-b", 2);
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_OK_AND_ASSIGN(auto c, Controller::Connect({a->address(), b->address()}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh ma, c->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mb, c->AllocateMesh(1, {2}));
  ProgramDef def;
  def.set_name("data-parallel");
  for (const char* name : {"a", "b"}) AddMesh(def, name, {2});
  *def.add_functions() = ElementwiseDef("add", "add", {kN / 2});
  AddParameter(def, "ga", "a", {kN}, Sharding::Split(0));
  AddParameter(def, "gb", "b", {kN}, Sharding::Split(0));
  for (const char* side : {"a", "b"}) {
    AddAllReduce(def, absl::StrCat("allreduce-", side), side, absl::StrCat("g", side),
                 absl::StrCat("r", side));
  }
  AddCall(def, "total-a", "add", "a", {"ra", "rb"}, {"ta"});
  AddCall(def, "total-b", "add", "b", {"rb", "ra"}, {"tb"});
  def.add_outputs("ta");
  def.add_outputs("tb");
  ASSERT_OK_AND_ASSIGN(auto program, c->Load(def, {{"a", ma}, {"b", mb}}));
  std::vector<std::vector<float>> ga, gb;
  std::vector<RemoteRun> runs;
  for (int r = 0; r < 4; ++r) {
    ga.push_back(RandomFloats(kN, 10 + r));
    gb.push_back(RandomFloats(kN, 20 + r));
    ASSERT_OK_AND_ASSIGN(RemoteArray xa, c->CreateArray(ma, {kN}, DType::kF32, Sharding::Split(0)));
    ASSERT_OK_AND_ASSIGN(RemoteArray xb, c->CreateArray(mb, {kN}, DType::kF32, Sharding::Split(0)));
    ASSERT_OK(c->Upload(xa, ga.back().data(), kN * 4));
    ASSERT_OK(c->Upload(xb, gb.back().data(), kN * 4));
    ASSERT_OK_AND_ASSIGN(RemoteRun run, c->Execute(program, {xa, xb}));
    runs.push_back(run);
  }
  for (int r = 0; r < 4; ++r) {
    ASSERT_OK(runs[r].done.AwaitStatus(absl::Now() + kRunTimeout));
    for (int side = 0; side < 2; ++side) {
      std::vector<float> got(kN / 2);
      ASSERT_OK(c->Download(runs[r].outputs[side], got.data(), kN * 2, absl::Now() + kRunTimeout));
      for (int i = 0; i < kN / 2; ++i) {
        const float ra = ga[r][i] + ga[r][i + kN / 2], rb = gb[r][i] + gb[r][i + kN / 2];
        ASSERT_EQ(got[i], side == 0 ? ra + rb : rb + ra) << "run " << r << " side " << side << " element " << i;
      }
    }
  }
}

// Tests that a run's outputs can be the next run's inputs and be released
// at once, before the island has started the run that makes them (the
// island takes requests as they come and runs on a worker): a chain of 24
// runs x = x + b, each releasing the x before it, ends at x0 + 24 b.
TEST(IslandServerTest, ChainedRunsUseAndReleaseOutputsNotYetMade) {
  constexpr int kN = 1024, kRuns = 24;
  auto a = StartIsland("isl-a", 1);
  ASSERT_TRUE(a != nullptr);
  ASSERT_OK_AND_ASSIGN(auto c, Controller::Connect({a->address()}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, c->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(auto program, c->Load(AddDef("step", kN), {{"m", mesh}}));
  const std::vector<float> x0 = RandomFloats(kN, 1), b = RandomFloats(kN, 2);
  ASSERT_OK_AND_ASSIGN(RemoteArray x, c->CreateArray(mesh, {kN}, DType::kF32));
  ASSERT_OK_AND_ASSIGN(RemoteArray bias, c->CreateArray(mesh, {kN}, DType::kF32));
  ASSERT_OK(c->Upload(x, x0.data(), kN * 4));
  ASSERT_OK(c->Upload(bias, b.data(), kN * 4));
  std::vector<RemoteRun> runs;
  for (int r = 0; r < kRuns; ++r) {
    ASSERT_OK_AND_ASSIGN(RemoteRun run, c->Execute(program, {x, bias}));
    ASSERT_OK(c->Release(x));
    x = run.outputs[0];
    runs.push_back(std::move(run));
  }
  for (RemoteRun& run : runs) ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
  std::vector<float> got(kN), want = x0;
  ASSERT_OK(c->Download(x, got.data(), kN * 4, absl::Now() + kRunTimeout));
  for (int r = 0; r < kRuns; ++r) {
    for (int i = 0; i < kN; ++i) want[i] += b[i];
  }
  EXPECT_EQ(got, want);
  // A released id is gone.
  EXPECT_ERROR(c->Release(runs[0].outputs[0]), absl::StatusCode::kNotFound, "no array");
}

// Tests that an island does not outlive a parent killed before it could stop
// it (a crashed test or tool): the island dies with it.
TEST(IslandServerTest, IslandDiesWithAKilledParent) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t parent = fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    close(fds[0]);
    auto island = IslandProcess::Start(::causeway::testing::CliPath(), "orphan",
                                       {::causeway::testing::DeviceFlag(), "--accelerators=1"});
    const pid_t pid = island.ok() ? (*island)->pid() : -1;
    if (write(fds[1], &pid, sizeof(pid)) != sizeof(pid)) _exit(1);
    pause();  // until killed
    _exit(0);
  }
  close(fds[1]);
  pid_t island = -1;
  ASSERT_EQ(read(fds[0], &island, sizeof(island)), static_cast<ssize_t>(sizeof(island)));
  close(fds[0]);
  ASSERT_GT(island, 0);
  ASSERT_EQ(kill(parent, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(waitpid(parent, &status, 0), parent);
  // Gone, or a zombie left for init to reap.
  auto alive = [island] {
    std::FILE* f = std::fopen(absl::StrCat("/proc/", island, "/stat").c_str(), "r");
    if (f == nullptr) return false;
    char state = '?';
    const int read = std::fscanf(f, "%*d (%*[^)]) %c", &state);
    std::fclose(f);
    return read == 1 && state != 'Z' && state != 'X';
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (alive() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(alive()) << "island " << island << " outlived its killed parent";
  if (alive()) kill(island, SIGKILL);
}

// Tests that garbage sent to an island (random bytes, an oversized frame)
// closes only that connection: the island keeps serving its controller.
TEST(IslandServerTest, MalformedTrafficLeavesOtherPeersServed) {
  Cluster c = StartCluster();
  ASSERT_NE(c.program, nullptr);
  RemoteInputs remote = Upload(c, MakeInputs(3));
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(c.a->address()));
  std::mt19937 rng(7);
  for (int attempt = 0; attempt < 4; ++attempt) {
    ASSERT_OK_AND_ASSIGN(Socket raw, Socket::Connect(where, absl::Now() + absl::Seconds(5)));
    std::vector<uint8_t> junk(attempt < 2 ? 64 : 16);
    for (auto& byte : junk) byte = static_cast<uint8_t>(rng());
    if (attempt >= 2) {  // a well-formed header of a control frame far over its bound
      std::array<uint8_t, kFrameHeaderSize> h = EncodeFrameHeader(FrameType::kControl, uint64_t{1} << 40);
      junk.assign(h.begin(), h.end());
    }
    absl::Span<const uint8_t> piece(junk);
    ASSERT_OK(raw.WriteAll({piece}, absl::Now() + absl::Seconds(5)));
    // The island hangs up.
    uint8_t byte;
    absl::Status read = absl::OkStatus();
    for (int i = 0; i < 1024 && read.ok(); ++i) read = raw.ReadExact(&byte, 1, absl::Now() + absl::Seconds(10));
    EXPECT_FALSE(absl::IsDeadlineExceeded(read)) << "the island kept a garbage connection open";
    // Meanwhile the controller's runs go on.
    ASSERT_OK_AND_ASSIGN(RemoteRun run, c.controller->Execute(c.program, {remote.x, remote.y, remote.w}));
    ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
  }
}

// Tests that a controller can connect again after another went away, and
// that connecting, running and closing leaves no descriptor or thread behind
// in the controller's process.
TEST(IslandServerTest, ControllerReconnectsAndLeaksNothing) {
  auto a = StartIsland("isl-a", 1);
  ASSERT_NE(a, nullptr);
  auto run_once = [&] {
    ASSERT_OK_AND_ASSIGN(auto c, Controller::Connect({a->address()}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh m, c->AllocateMesh(0, {1}));
    ProgramDef def;
    def.set_name("scale");
    AddMesh(def, "m", {1});
    *def.add_functions() = ScaleDef("twice", {256}, 2.0f);
    AddParameter(def, "x", "m", {256}, Sharding::Replicated());
    AddCall(def, "scale", "twice", "m", {"x"}, {"y"});
    def.add_outputs("y");
    ASSERT_OK_AND_ASSIGN(auto program, c->Load(def, {{"m", m}}));
    std::vector<float> x = RandomFloats(256, 5), y(256);
    ASSERT_OK_AND_ASSIGN(RemoteArray xa, c->CreateArray(m, {256}, DType::kF32));
    ASSERT_OK(c->Upload(xa, x.data(), x.size() * 4));
    ASSERT_OK_AND_ASSIGN(RemoteRun run, c->Execute(program, {xa}));
    ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
    ASSERT_OK(c->Download(run.outputs[0], y.data(), y.size() * 4, absl::Now() + kRunTimeout));
    for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], 2.0f * x[i]);
  };
  run_once();  // warms what stays (the protobuf runtime, the resolver)
  // A thread of the closed controller may still be ending: the baseline is
  // taken once the counts have settled, and compared once they settle again.
  const int threads = SettledEntries("/proc/self/task"), fds = SettledEntries("/proc/self/fd");
  for (int i = 0; i < 3; ++i) run_once();
  EXPECT_EQ(AwaitEntries("/proc/self/fd", fds), fds);
  EXPECT_EQ(AwaitEntries("/proc/self/task", threads), threads);
}

// Tests that an island server gives back every descriptor, thread and byte of
// device memory of the sessions of controllers that came, ran and went
// (closed or dropped).
TEST(IslandServerTest, ServerLeaksNothingAcrossSessions) {
  auto rt = MakeRuntime(1);
  IslandServerOptions options;
  options.name = "isl-in";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  const std::string address = server->address().ToString();
  auto cycle = [&](bool run) {
    ASSERT_OK_AND_ASSIGN(auto c, Controller::Connect({address}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh m, c->AllocateMesh(0, {1}));
    ASSERT_OK_AND_ASSIGN(RemoteArray x, c->CreateArray(m, {1024}, DType::kF32));
    std::vector<float> host = RandomFloats(1024, 1), back(1024);
    ASSERT_OK(c->Upload(x, host.data(), host.size() * 4));
    if (run) {
      ASSERT_OK(c->Download(x, back.data(), back.size() * 4, absl::Now() + kRunTimeout));
      ASSERT_EQ(back, host);
    }
  };
  auto settle = [&] {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (server->sessions() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    ASSERT_EQ(server->sessions(), 0u);
  };
  cycle(true);
  settle();
  ASSERT_OK(rt->accelerator(0)->Flush(absl::Now() + kRunTimeout));
  const int fds = SettledEntries("/proc/self/fd"), threads = SettledEntries("/proc/self/task");
  const uint64_t memory = rt->accelerator(0)->memory_in_use();
  for (int i = 0; i < 4; ++i) cycle(i % 2 == 0);
  settle();
  // A session's threads end after it has left the server's count.
  EXPECT_EQ(AwaitEntries("/proc/self/fd", fds), fds);
  EXPECT_EQ(AwaitEntries("/proc/self/task", threads), threads);
  // Device memory too, with no later work to retire the uploads no one
  // awaited: the island has them retired once its tenant has left.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (rt->accelerator(0)->memory_in_use() != memory && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(rt->accelerator(0)->memory_in_use(), memory);
}

// Tests that an island ends at once, not when a stalled write gives up, while
// a controller has stopped reading in the middle of a fetch: the goodbye does
// not wait behind the blocked write, and the fetch job, which holds the
// connection, ends before the connection is destroyed (a sanitizer build
// catches a use after free).
TEST(IslandServerTest, IslandEndsAtOnceWhileAControllerStallsAFetch) {
  auto rt = MakeRuntime(1);
  IslandServerOptions options;
  options.name = "isl-f";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(server->address().ToString()));
  absl::Notification stalled, release;
  ConnectionOptions stalling;
  stalling.peer_timeout = absl::Seconds(120);  // this side never gives up first
  stalling.data_sink.begin = [&](const DataHeader&) -> absl::StatusOr<uint8_t*> {
    if (!stalled.HasBeenNotified()) stalled.Notify();
    release.WaitForNotificationWithTimeout(absl::Seconds(120));
    return nullptr;  // read and dropped
  };
  ClientHandshakeOptions handshake;
  handshake.name = "stalling";
  ASSERT_OK_AND_ASSIGN(auto controller, Connection::Connect(where, handshake, stalling));
  IslandRequest mesh;
  mesh.mutable_allocate_mesh()->add_dims(1);
  ASSERT_OK_AND_ASSIGN(IslandResponse m, CallIsland(*controller, mesh));
  IslandRequest create;
  create.mutable_create_array()->set_mesh(m.id());
  create.mutable_create_array()->add_shape(int64_t{8} << 20);  // 32 MiB: more than the socket buffers
  create.mutable_create_array()->set_dtype(F32);
  create.mutable_create_array()->set_sharding(ShardingDef().SerializeAsString());
  ASSERT_OK_AND_ASSIGN(IslandResponse array, CallIsland(*controller, create));
  IslandRequest fetch;
  fetch.mutable_fetch()->set_array(array.id());
  fetch.mutable_fetch()->set_fetch(1);
  Request request;
  request.set_island(fetch.SerializeAsString());
  ASSERT_OK(controller->Notify(request, absl::Now() + kRunTimeout));
  ASSERT_TRUE(stalled.WaitForNotificationWithTimeout(kRunTimeout));
  absl::SleepFor(absl::Milliseconds(200));  // the island's write fills the buffers and blocks
  const absl::Time start = absl::Now();
  server.reset();
  // The goodbye waits at most 1 s for the write lock.
  EXPECT_LT(absl::Now() - start, absl::Seconds(1) + causeway::testing::kSchedulingSlack);
  release.Notify();
}

// server.sessions() once it equals `want`, or after 10 s.
size_t AwaitSessions(const IslandServer& server, size_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server.sessions() != want && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return server.sessions();
}

// server.handshakes() once it equals `want`, or after 10 s.
size_t AwaitHandshakes(const IslandServer& server, size_t want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (server.handshakes() != want && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  return server.handshakes();
}

// Connects to `address` and returns the socket, holding the connection in
// its handshake (nothing is sent).
Socket HoldHandshake(const SocketAddress& address) {
  return ValueOrThrow(Socket::Connect(address, absl::Now() + causeway::testing::kSchedulingSlack));
}

// Whether the island closed `socket` without a word: a read ends at once
// with the connection closed, rather than at its deadline.
void ExpectClosedAtOnce(Socket& socket, const std::string& what) {
  uint8_t byte;
  const absl::Time start = absl::Now();
  absl::Status s = socket.ReadExact(&byte, 1, start + absl::Seconds(60));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << what << ": " << s;
  EXPECT_LT(absl::Now() - start, causeway::testing::kSchedulingSlack) << what;
}

// Tests connection admission: connections in their handshake are capped
// overall and per source address; one past a cap is closed at once, the
// admitted ones are served, and once they are gone a controller is served.
TEST(IslandServerTest, ConnectionsInTheirHandshakeAreCapped) {
  auto rt = MakeRuntime(1);
  for (bool per_address : {true, false}) {
    SCOPED_TRACE(per_address ? "per address" : "overall");
    IslandServerOptions options;
    options.name = "capped";
    options.max_unauthenticated = per_address ? 100 : 3;
    options.max_unauthenticated_per_address = per_address ? 3 : 100;
    options.handshake_timeout = absl::Seconds(60);  // the held connections stay held
    ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
    std::vector<Socket> held;
    for (int i = 0; i < 3; ++i) held.push_back(HoldHandshake(server->address()));
    EXPECT_EQ(AwaitHandshakes(*server, 3), 3u);
    // Past the cap: closed at once, however many come.
    for (int i = 0; i < 5; ++i) {
      Socket extra = HoldHandshake(server->address());
      ExpectClosedAtOnce(extra, absl::StrCat("connection ", 4 + i));
    }
    EXPECT_EQ(server->handshakes(), 3u);
    EXPECT_EQ(server->sessions(), 0u);
    // A controller is refused too while the cap is reached, ...
    EXPECT_FALSE(Controller::Connect({server->address().ToString()}).ok());
    // ... and served once the held connections are gone.
    held.clear();
    EXPECT_EQ(AwaitHandshakes(*server, 0), 0u);
    ASSERT_OK_AND_ASSIGN(auto controller, Controller::Connect({server->address().ToString()}));
    ASSERT_OK_AND_ASSIGN(IslandDescription d, controller->Describe(0));
    EXPECT_EQ(d.name, "capped");
  }
}

// Tests the session host budget: an upload larger than a session may hold
// in host memory is refused, the connection closing with the budget named,
// while another tenant's uploads and fetches go on with the right values;
// uploads within it complete.
TEST(IslandServerTest, AnUploadPastTheSessionsHostBudgetIsRefused) {
  auto rt = MakeRuntime(1);
  IslandServerOptions options;
  options.name = "isl-hb";
  options.session_host_budget = 64 << 10;
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  const std::string address = server->address().ToString();
  ASSERT_OK_AND_ASSIGN(auto other, Controller::Connect({address}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh other_mesh, other->AllocateMesh(0, {1}));
  auto round_trip = [&](int seed) {
    std::vector<float> host = RandomFloats(8 << 10, seed), back(host.size());  // 32 KiB: within
    ASSERT_OK_AND_ASSIGN(RemoteArray x, other->CreateArray(other_mesh, {8 << 10}, DType::kF32));
    ASSERT_OK(other->Upload(x, host.data(), host.size() * 4));
    ASSERT_OK(other->Download(x, back.data(), back.size() * 4, absl::Now() + kRunTimeout));
    ASSERT_EQ(back, host);
  };
  round_trip(1);

  ASSERT_OK_AND_ASSIGN(auto hog, Controller::Connect({address}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, hog->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(RemoteArray big, hog->CreateArray(mesh, {32 << 10}, DType::kF32));  // 128 KiB
  std::vector<float> host = RandomFloats(32 << 10, 2);
  absl::Status upload = hog->Upload(big, host.data(), host.size() * 4);
  // The island closes the connection as the upload begins: the upload, or
  // the next call, fails with the reason.
  absl::Status next = upload.ok() ? hog->Describe(0).status() : upload;
  EXPECT_EQ(next.code(), absl::StatusCode::kUnavailable) << next;
  EXPECT_THAT(next.message(), AllOf(HasSubstr("needs 128 KiB of host memory, past the budget of session"),
                                    HasSubstr("0 B of 64 KiB in use")));
  round_trip(3);
}

// Tests that connections in their handshake hold no thread of the island:
// 60 held at once (under the caps) leave its thread count where it was,
// and a controller is served meanwhile, correctly. Before, each held a
// thread for up to the handshake deadline (1500 idle connections made an
// island of over 1200 threads).
TEST(IslandServerTest, HandshakesInProgressHoldNoThreads) {
  auto rt = MakeRuntime(1);
  IslandServerOptions options;
  options.name = "threadless";
  options.max_unauthenticated = 64;
  options.max_unauthenticated_per_address = 64;
  options.handshake_timeout = absl::Seconds(60);  // the held connections stay held
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  const int threads = SettledEntries("/proc/self/task");
  std::vector<Socket> held;
  for (int i = 0; i < 60; ++i) held.push_back(HoldHandshake(server->address()));
  // Half of them have begun: a hello's first bytes, then nothing.
  for (int i = 0; i < 30; ++i) {
    const std::array<uint8_t, kFrameHeaderSize> header = EncodeFrameHeader(FrameType::kHello, 50);
    ASSERT_OK(held[i].WriteAll({absl::MakeConstSpan(header).first(i % kFrameHeaderSize + 1)},
                               absl::Now() + causeway::testing::kSchedulingSlack));
  }
  ASSERT_EQ(AwaitHandshakes(*server, 60), 60u);
  EXPECT_EQ(SettledEntries("/proc/self/task"), threads);
  // Served meanwhile (its connection's threads come and go with it).
  {
    ASSERT_OK_AND_ASSIGN(auto controller, Controller::Connect({server->address().ToString()}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, controller->AllocateMesh(0, {1}));
    std::vector<float> host = RandomFloats(1024, 7), back(host.size());
    ASSERT_OK_AND_ASSIGN(RemoteArray x, controller->CreateArray(mesh, {1024}, DType::kF32));
    ASSERT_OK(controller->Upload(x, host.data(), host.size() * 4));
    ASSERT_OK(controller->Download(x, back.data(), back.size() * 4, absl::Now() + kRunTimeout));
    EXPECT_EQ(back, host);
  }
  EXPECT_EQ(server->handshakes(), 60u);
  held.clear();
  EXPECT_EQ(AwaitHandshakes(*server, 0), 0u);
  EXPECT_EQ(AwaitSessions(*server, 0), 0u);
}

// Tests that a program's transfer plans are charged to the loading
// session's host budget: splitting the columns of a [4096, 2] array over two
// accelerators plans a region per row per target (192 KiB), refused under a
// 64 KiB budget with ResourceExhausted naming the node and the budget; the
// same session then loads and runs a [512, 2] one (24 KiB) with the right
// result.
TEST(IslandServerTest, ProgramPlansAreChargedToTheSessionsHostBudget) {
  auto rt = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-plans";
  options.session_host_budget = 64 << 10;
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  ASSERT_OK_AND_ASSIGN(auto controller, Controller::Connect({server->address().ToString()}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, controller->AllocateMesh(0, {2}));
  auto columns = [](int64_t rows) {
    return ValueOrThrow(ParseProgramDefText(absl::StrCat(R"(
      name: "columns"
      meshes { name: "m" dims: 2 }
      parameters { value: "x" mesh: "m" shape: [)",
                                                         rows, R"(, 2] }
      nodes { name: "split" reshard { mesh: "m" input: "x" output: "y" sharding { split { array_axis: 1 } } } }
      outputs: "y")"),
                                            "columns.txt"));
  };
  EXPECT_ERROR(controller->Load(columns(4096), {{"m", mesh}}).status(), absl::StatusCode::kResourceExhausted,
               "node 'split'", "(8192 copy regions)", "past the budget of session");

  const std::vector<float> host = RandomFloats(512 * 2, 11);
  ASSERT_OK_AND_ASSIGN(auto program, controller->Load(columns(512), {{"m", mesh}}));
  ASSERT_OK_AND_ASSIGN(RemoteArray x, controller->CreateArray(mesh, {512, 2}, DType::kF32));
  ASSERT_OK(controller->Upload(x, host.data(), host.size() * 4));
  ASSERT_OK_AND_ASSIGN(RemoteRun run, controller->Execute(program, {x}));
  std::vector<float> back(host.size());
  ASSERT_OK(controller->Download(run.outputs[0], back.data(), back.size() * 4, absl::Now() + kRunTimeout));
  EXPECT_EQ(back, host);
}

// Tests that `causeway island` takes its handshake caps from the command
// line (overall, then per address: every connection here comes from
// loopback). CliTest.IslandRefusesHandshakeCapsAndHostBudgetsOutOfRange has the refusals.
TEST(IslandServerTest, HandshakeCapsComeFromTheCommandLine) {
  for (const std::string flag : {"--max-handshakes=2", "--max-handshakes-per-address=2"}) {
    SCOPED_TRACE(flag);
    auto island = StartIsland("capped", 1, {flag});
    ASSERT_NE(island, nullptr);
    ASSERT_OK_AND_ASSIGN(SocketAddress address, SocketAddress::Parse(island->address()));
    // Accepted in order: the first two are held in their handshake (5 s
    // deadline), the third is past the cap.
    std::vector<Socket> held;
    for (int i = 0; i < 2; ++i) held.push_back(HoldHandshake(address));
    Socket extra = HoldHandshake(address);
    ExpectClosedAtOnce(extra, "connection 3");
    held.clear();
    // Once they are gone, a controller is served. The island sees the two
    // closes on its handshake threads a moment after they happen (longer on
    // a loaded machine): until then a connection may still meet the cap.
    absl::StatusOr<std::unique_ptr<Controller>> controller;
    for (const absl::Time deadline = absl::Now() + absl::Seconds(10);;) {
      controller = Controller::Connect({island->address()});
      if (controller.ok() || absl::Now() > deadline) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_OK(controller.status());
    ASSERT_OK_AND_ASSIGN(IslandDescription d, (*controller)->Describe(0));
    EXPECT_EQ(d.name, "capped");
  }
}

// Tests that an island lets go of its links to peer islands that died: a
// peer killed and started again on another port, run after run, leaves no
// descriptor or thread of its old links behind on the island that sent to
// it.
TEST(IslandServerTest, LinksToDeadPeersAreLetGo) {
  auto rt = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-a";
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  const std::string address = server->address().ToString();
  auto cycle = [&] {
    auto b = StartIsland("isl-b", 2);
    ASSERT_NE(b, nullptr);
    {
      Cluster c;
      ASSERT_OK_AND_ASSIGN(c.controller, Controller::Connect({address, b->address()}));
      ASSERT_OK_AND_ASSIGN(c.ma, c.controller->AllocateMesh(0, {2}));
      ASSERT_OK_AND_ASSIGN(c.mb, c.controller->AllocateMesh(1, {2}));
      ASSERT_OK_AND_ASSIGN(c.program, c.controller->Load(PipelineDef(), {{"a", c.ma}, {"b", c.mb}}));
      Inputs in = MakeInputs(7);
      RemoteInputs remote = Upload(c, in);
      ASSERT_OK_AND_ASSIGN(RemoteRun run, c.controller->Execute(c.program, {remote.x, remote.y, remote.w}));
      ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
    }
    b->Signal(SIGKILL);
    b.reset();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (server->sessions() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    ASSERT_EQ(server->sessions(), 0u);
  };
  // Descriptors and threads settle once the reaper has seen the peer go.
  auto settle_at = [](int fds, int threads) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while ((CountEntries("/proc/self/fd") != fds || CountEntries("/proc/self/task") != threads) &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  };
  cycle();
  const int fds = SettledEntries("/proc/self/fd", absl::Seconds(1)),
            threads = SettledEntries("/proc/self/task", absl::Seconds(1));
  for (int i = 0; i < 3; ++i) cycle();
  settle_at(fds, threads);
  EXPECT_EQ(CountEntries("/proc/self/fd"), fds);
  EXPECT_EQ(CountEntries("/proc/self/task"), threads);
}

// Tests that one connection from a peer island closing, while the peer
// lives and its other connection still carries values, fails no receive:
// an island links to a peer once per address, so a second link (two loads
// that connected at once; one given up when no sender holds it) ends while
// the first serves on.
TEST(IslandServerTest, AClosedSpareLinkFromALivePeerFailsNoReceive) {
  auto rt_a = MakeRuntime(2), rt_b = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-a";
  ASSERT_OK_AND_ASSIGN(auto a, IslandServer::Create(rt_a.get(), options));
  options.name = "isl-b";
  ASSERT_OK_AND_ASSIGN(auto b, IslandServer::Create(rt_b.get(), options));
  Cluster c;
  ASSERT_OK_AND_ASSIGN(c.controller, Controller::Connect({a->address().ToString(), b->address().ToString()}));
  ASSERT_OK_AND_ASSIGN(c.ma, c.controller->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(c.mb, c.controller->AllocateMesh(1, {2}));
  ASSERT_OK_AND_ASSIGN(c.program, c.controller->Load(PipelineDef(), {{"a", c.ma}, {"b", c.mb}}));
  Inputs in = MakeInputs(8);
  RemoteInputs remote = Upload(c, in);
  ASSERT_OK_AND_ASSIGN(RemoteRun first, c.controller->Execute(c.program, {remote.x, remote.y, remote.w}));
  ASSERT_OK(first.done.AwaitStatus(absl::Now() + kRunTimeout));
  const size_t sessions = b->sessions();  // the controller's and island a's link
  {
    // Another connection from island a's name, closed: as a spare link goes.
    ClientHandshakeOptions handshake;
    handshake.name = "isl-a";
    ASSERT_OK_AND_ASSIGN(auto spare, Connection::Connect(b->address(), handshake, ConnectionOptions{}));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (b->sessions() == sessions && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (b->sessions() > sessions && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(b->sessions(), sessions);
  ASSERT_OK_AND_ASSIGN(RemoteRun second, c.controller->Execute(c.program, {remote.x, remote.y, remote.w}));
  ASSERT_OK(second.done.AwaitStatus(absl::Now() + kRunTimeout));
  std::vector<float> got(kRows * kCols);
  ASSERT_OK(c.controller->Download(second.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
  std::vector<float> want = Reference(in);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::abs(want[i])));
}

// Tests `causeway launch -n 2`: two islands register with the coordinator, a
// controller finds them through it and runs a program across both; SIGTERM
// to the launcher stops them.
TEST(IslandServerTest, LaunchedIslandsAreFoundThroughTheCoordinator) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string cli = ::causeway::testing::CliPath();
  const std::string device = ::causeway::testing::DeviceFlag();
  const std::string validation = ::causeway::testing::ValidationFlag();
  pid_t launcher = fork();
  if (launcher == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl(cli.c_str(), "causeway", "launch", "-n", "2", "--", device.c_str(), "--accelerators=2",
          validation.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (text.find("coordinator ") == std::string::npos && absl::Now() < deadline) {
    pollfd pfd{out[0], POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, n);
  }
  const size_t at = text.find("coordinator ");
  ASSERT_NE(at, std::string::npos) << "launch printed: " << text;
  std::string coordinator = text.substr(at + 12);
  coordinator = coordinator.substr(0, coordinator.find('\n'));
  {
    ASSERT_OK_AND_ASSIGN(auto c, Controller::ConnectToLaunch(coordinator, {}, absl::Now() + absl::Seconds(60)));
    ASSERT_EQ(c->island_count(), 2);
    EXPECT_EQ(c->island_name(0), "island-0");
    EXPECT_EQ(c->island_name(1), "island-1");
    ASSERT_OK_AND_ASSIGN(RemoteMesh ma, c->AllocateMesh(0, {2}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh mb, c->AllocateMesh(1, {2}));
    ASSERT_OK_AND_ASSIGN(auto program, c->Load(PipelineDef(), {{"a", ma}, {"b", mb}}));
    Inputs in = MakeInputs(4);
    RemoteArray x = ValueOrThrow(c->CreateArray(ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
    RemoteArray y = ValueOrThrow(c->CreateArray(ma, {kRows, kCols}, DType::kF32, Sharding::Split(0)));
    RemoteArray w = ValueOrThrow(c->CreateArray(mb, {kCols, kCols}, DType::kF32));
    ASSERT_OK(c->Upload(x, in.x.data(), in.x.size() * 4));
    ASSERT_OK(c->Upload(y, in.y.data(), in.y.size() * 4));
    ASSERT_OK(c->Upload(w, in.w.data(), in.w.size() * 4));
    ASSERT_OK_AND_ASSIGN(RemoteRun run, c->Execute(program, {x, y, w}));
    ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
    std::vector<float> got(kRows * kCols);
    ASSERT_OK(c->Download(run.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
    std::vector<float> want = Reference(in);
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::abs(want[i])));
  }
  kill(launcher, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  close(out[0]);
  EXPECT_TRUE(WIFEXITED(status)) << status;
}

// Tests tenant isolation end to end on one island of two accelerators: while
// one tenant runs y = x + b over and over, every result checked against the
// CPU, another sends each hostile input the threat model names, from
// sessions of its own: a kernel that reads memory through a pointer; an
// array whose element count wraps 2^64; an upload past the session's host
// budget; a program whose transfer plan is past it; values sent before their
// receives past it; a value larger than its receive and bytes sent twice;
// garbage and an oversized frame; connections held in their handshake past
// the caps. Each is refused, naming why. Once the hostile sessions are gone,
// the island's device memory, host memory, descriptors and threads are back
// where they were.
TEST(IslandServerTest, OneTenantIsServedWhileAnotherSendsEveryHostileInput) {
  auto rt = MakeRuntime(2);
  IslandServerOptions options;
  options.name = "isl-b";  // the pipeline's part b runs here
  options.session_host_budget = 64 << 10;
  options.max_unauthenticated = 8;
  options.max_unauthenticated_per_address = 4;
  options.handshake_timeout = absl::Seconds(60);  // held connections stay held
  ASSERT_OK_AND_ASSIGN(auto server, IslandServer::Create(rt.get(), options));
  const std::string address = server->address().ToString();
  ASSERT_OK_AND_ASSIGN(SocketAddress where, SocketAddress::Parse(address));

  // The tenant that is to be served throughout.
  constexpr int kN = 4096;
  ASSERT_OK_AND_ASSIGN(auto good, Controller::Connect({address}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh good_mesh, good->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(auto add, good->Load(AddDef("add", kN), {{"m", good_mesh}}));
  ASSERT_OK_AND_ASSIGN(RemoteArray x, good->CreateArray(good_mesh, {kN}, DType::kF32));
  ASSERT_OK_AND_ASSIGN(RemoteArray b, good->CreateArray(good_mesh, {kN}, DType::kF32));
  auto round = [&](int seed) -> absl::Status {
    const std::vector<float> xh = RandomFloats(kN, seed), bh = RandomFloats(kN, seed + 1);
    CAUSEWAY_RETURN_IF_ERROR(good->Upload(x, xh.data(), xh.size() * 4));
    CAUSEWAY_RETURN_IF_ERROR(good->Upload(b, bh.data(), bh.size() * 4));
    CAUSEWAY_ASSIGN_OR_RETURN(RemoteRun run, good->Execute(add, {x, b}));
    std::vector<float> got(kN);
    CAUSEWAY_RETURN_IF_ERROR(
        good->Download(run.outputs[0], got.data(), got.size() * 4, absl::Now() + kRunTimeout));
    CAUSEWAY_RETURN_IF_ERROR(good->Release(run.outputs[0]));
    for (int i = 0; i < kN; ++i) {
      if (got[i] != xh[i] + bh[i]) {
        return absl::InternalError(
            absl::StrCat("round ", seed, ": y[", i, "] = ", got[i], ", not ", xh[i] + bh[i]));
      }
    }
    return absl::OkStatus();
  };
  // A fetch runs on the island's worker after the release before it: once
  // it is back, the round's output is gone.
  auto settle_good = [&] {
    std::vector<float> back(kN);
    ASSERT_OK(good->Download(x, back.data(), back.size() * 4, absl::Now() + kRunTimeout));
    for (int a = 0; a < 2; ++a) ASSERT_OK(rt->accelerator(a)->Flush(absl::Now() + kRunTimeout));
  };
  ASSERT_OK(round(0));
  // Empty blocks the pools keep for reuse hold a descriptor each on
  // lavapipe (its memory is a memfd): none is kept when fds are counted.
  auto release_unused = [&] {
    for (int a = 0; a < 2; ++a) rt->accelerator(a)->ReleaseUnusedMemory();
  };
  settle_good();
  release_unused();
  const int fds = SettledEntries("/proc/self/fd"), threads = SettledEntries("/proc/self/task");
  const uint64_t memory0 = rt->accelerator(0)->memory_in_use(), memory1 = rt->accelerator(1)->memory_in_use();
  ASSERT_EQ(server->host_memory_in_use(), 0u);

  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  absl::Status good_status;
  std::thread served([&] {
    for (int seed = 10; !stop.load() && good_status.ok(); seed += 2) {
      good_status = round(seed);
      rounds.fetch_add(1);
    }
  });

  {
    SCOPED_TRACE("a kernel that reads memory through a pointer");
    ASSERT_OK_AND_ASSIGN(auto bad, Controller::Connect({address}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, bad->AllocateMesh(0, {1}));
    ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> words,
                         CompileGlsl("peek", ::causeway::testing::kPointerKernelGlsl));
    ProgramDef def;
    def.set_name("peek");
    AddMesh(def, "m", {1});
    FunctionDef* f = def.add_functions();
    f->set_name("peek");
    f->mutable_custom()->add_outputs()->add_shape(4);
    KernelStepDef* step = f->mutable_custom()->add_steps();
    step->set_spirv(std::string(reinterpret_cast<const char*>(words.data()), words.size() * 4));
    step->add_args(0);
    step->set_push_constants(std::string(8, '\0'));
    AddCall(def, "peek", "peek", "m", {}, {"y"});
    def.add_outputs("y");
    EXPECT_ERROR(bad->Load(def, {{"m", mesh}}).status(), absl::StatusCode::kInvalidArgument,
                 "PhysicalStorageBufferAddresses");
  }
  {
    SCOPED_TRACE("an element count that wraps 2^64");
    ASSERT_OK_AND_ASSIGN(auto bad, Controller::Connect({address}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, bad->AllocateMesh(0, {1}));
    EXPECT_ERROR(bad->CreateArray(mesh, {int64_t{1} << 32, int64_t{1} << 32, 16}, DType::kF32).status(),
                 absl::StatusCode::kInvalidArgument, "has more than 9223372036854775807 elements");
  }
  {
    SCOPED_TRACE("an upload past the session's host budget");
    ASSERT_OK_AND_ASSIGN(auto bad, Controller::Connect({address}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, bad->AllocateMesh(0, {1}));
    ASSERT_OK_AND_ASSIGN(RemoteArray big, bad->CreateArray(mesh, {32 << 10}, DType::kF32));  // 128 KiB
    const std::vector<float> host = RandomFloats(32 << 10, 2);
    absl::Status upload = bad->Upload(big, host.data(), host.size() * 4);
    absl::Status next = upload.ok() ? bad->Describe(0).status() : upload;
    EXPECT_ERROR(next, absl::StatusCode::kUnavailable,
                 "needs 128 KiB of host memory, past the budget of session");
  }
  {
    SCOPED_TRACE("a transfer plan past the session's host budget");
    ASSERT_OK_AND_ASSIGN(auto bad, Controller::Connect({address}));
    ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, bad->AllocateMesh(0, {2}));
    ASSERT_OK_AND_ASSIGN(ProgramDef columns, ParseProgramDefText(R"(
      name: "columns"
      meshes { name: "m" dims: 2 }
      parameters { value: "x" mesh: "m" shape: [4096, 2] }
      nodes { name: "split" reshard { mesh: "m" input: "x" output: "y" sharding { split { array_axis: 1 } } } }
      outputs: "y")",
                                                                 "columns.txt"));
    EXPECT_ERROR(bad->Load(columns, {{"m", mesh}}).status(), absl::StatusCode::kResourceExhausted,
                 "past the budget of session");
  }
  {
    SCOPED_TRACE("values from a peer: before their receives past the budget, larger than the receive, twice");
    const std::vector<float> t = RandomFloats(kRows * kCols, 3);
    const absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(t.data()), t.size() * 4);
    // Each case on a program of its own: a link that the island closes fails
    // the channels opened on it for good.
    auto with_part = [&](const std::function<void(PartBOnIsland&, Connection&)>& body) {
      ASSERT_EQ(AwaitSessions(*server, 1), 1u);  // channel 777 is free again
      PartBOnIsland part;
      ASSERT_OK(part.Load(where));
      ASSERT_OK_AND_ASSIGN(auto link, ConnectAs(where, "isl-a"));
      ASSERT_OK(OpenChannel777(*link));
      body(part, *link);
    };
    with_part([&](PartBOnIsland& part, Connection& link) {
      // 16 KiB values for runs not started: the fifth is past 64 KiB.
      for (uint64_t tag = 1; tag <= 5; ++tag) {
        if (!link.SendData(777, tag, 0, bytes.size(), bytes, absl::Now() + kRunTimeout).ok()) break;
      }
      ASSERT_OK(part.Execute(5));
      // Its bytes are past the budget whether they come before its receive
      // or after (then straddling the two devices' parts).
      EXPECT_ERROR(part.notes.Await(5), absl::StatusCode::kResourceExhausted, "run 5's",
                   "past the budget of session", "64 KiB of 64 KiB in use");
    });
    with_part([&](PartBOnIsland&, Connection& link) {
      ASSERT_OK(link.SendData(777, 6, 0, uint64_t{1} << 40, bytes, absl::Now() + kRunTimeout));
      EXPECT_ERROR(AwaitConnectionFailure(link), absl::StatusCode::kUnavailable, "1099511627776 bytes",
                   "at most 16384");
    });
    with_part([&](PartBOnIsland& part, Connection& link) {
      ASSERT_OK(part.Execute(7));
      const absl::Span<const uint8_t> half = bytes.first(bytes.size() / 2);
      ASSERT_OK(link.SendData(777, 7, 0, bytes.size(), half, absl::Now() + kRunTimeout));
      ASSERT_OK(link.SendData(777, 7, 0, bytes.size(), half, absl::Now() + kRunTimeout));
      EXPECT_ERROR(part.notes.Await(7), absl::StatusCode::kDataLoss, "overlapping bytes [0, 8192)");
    });
  }
  {
    SCOPED_TRACE("garbage, and a control frame far over its bound");
    for (bool oversized : {false, true}) {
      ASSERT_OK_AND_ASSIGN(Socket raw, Socket::Connect(where, absl::Now() + absl::Seconds(5)));
      std::vector<uint8_t> junk(64, 0xa5);
      if (oversized) {
        const std::array<uint8_t, kFrameHeaderSize> h =
            EncodeFrameHeader(FrameType::kControl, uint64_t{1} << 40);
        junk.assign(h.begin(), h.end());
      }
      ASSERT_OK(raw.WriteAll({absl::Span<const uint8_t>(junk)}, absl::Now() + absl::Seconds(5)));
      ExpectClosedAtOnce(raw, oversized ? "an oversized frame" : "garbage");
    }
  }
  {
    SCOPED_TRACE("connections held in their handshake past the caps");
    std::vector<Socket> held;
    for (int i = 0; i < 4; ++i) held.push_back(HoldHandshake(server->address()));
    EXPECT_EQ(AwaitHandshakes(*server, 4), 4u);
    for (int i = 0; i < 3; ++i) {
      Socket extra = HoldHandshake(server->address());
      ExpectClosedAtOnce(extra, absl::StrCat("connection ", 5 + i));
    }
  }

  // The served tenant was right every time, and went on throughout (at
  // least one more round, however slow the machine).
  for (const absl::Time until = absl::Now() + kRunTimeout; rounds.load() == 0 && absl::Now() < until;) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  stop.store(true);
  served.join();
  ASSERT_OK(good_status);
  EXPECT_GT(rounds.load(), 0);
  ASSERT_OK(round(1000));
  settle_good();
  // Everything the hostile sessions held is back.
  EXPECT_EQ(AwaitHandshakes(*server, 0), 0u);
  EXPECT_EQ(AwaitSessions(*server, 1), 1u);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto settled = [&] {
    return server->host_memory_in_use() == 0 && rt->accelerator(0)->memory_in_use() == memory0 &&
           rt->accelerator(1)->memory_in_use() == memory1;
  };
  while (!settled() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(server->host_memory_in_use(), 0u);
  EXPECT_EQ(rt->accelerator(0)->memory_in_use(), memory0);
  EXPECT_EQ(rt->accelerator(1)->memory_in_use(), memory1);
  release_unused();
  EXPECT_EQ(AwaitEntries("/proc/self/fd", fds), fds);
  EXPECT_EQ(AwaitEntries("/proc/self/task", threads), threads);
}

}  // namespace
}  // namespace causeway::transport
