// The client API's contract, run on both implementations with the same test
// bodies: LocalClient over an island in this process, and RemoteClient over
// an island server (in this process too, on its own runtime).
#include "causeway/client/client.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "causeway/base/status.h"
#include "causeway/client/local_client.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/island_server.h"
#include "causeway/scheduler/program_def.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/program_defs.h"
#include "tests/testing/test_support.h"

namespace causeway::client {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RandomFloats;
using ::causeway::testing::TestOptions;
using ::causeway::testing::ValueOrThrow;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(60);
constexpr int kAccelerators = 2;

// y = x + b over a mesh "m" of two accelerators, each input and the output
// split by rows: [n, 4] f32.
ProgramDef AddRowsDef(int n) {
  return ValueOrThrow(ParseProgramDefText(absl::StrCat(R"(
    name: "add-rows"
    meshes { name: "m" dims: 2 }
    functions { name: "add" elementwise { op: "add" shape: [)",
                                                       n / 2, R"(, 4] } }
    parameters { value: "x" mesh: "m" shape: [)",
                                                       n, R"(, 4] sharding { split { array_axis: 0 } } }
    parameters { value: "b" mesh: "m" shape: [)",
                                                       n, R"(, 4] sharding { split { array_axis: 0 } } }
    nodes { name: "add" call { function: "add" mesh: "m" inputs: ["x", "b"] outputs: "y" } }
    outputs: "y")"),
                                          "add_rows.txt"));
}

// A client of either kind over two lavapipe accelerators, and what it runs on.
struct Rig {
  std::unique_ptr<Runtime> runtime;  // the island server's
  std::unique_ptr<transport::IslandServer> server;
  std::unique_ptr<Client> client;
};

Rig Make(const std::string& kind) {
  Rig s;
  if (kind == "local") {
    IslandOptions island;
    island.name = "here";
    s.client = ValueOrThrow(LocalClient::Create(TestOptions(kAccelerators), island));
  } else {
    s.runtime = MakeRuntime(kAccelerators);
    transport::IslandServerOptions options;
    options.name = "there";
    s.server = ValueOrThrow(transport::IslandServer::Create(s.runtime.get(), options));
    s.client = ValueOrThrow(RemoteClient::Connect({s.server->address().ToString()}));
  }
  return s;
}

class ClientTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setup_ = Make(GetParam());
    c_ = setup_.client.get();
    ASSERT_STREQ(c_->kind(), GetParam().c_str());
  }
  void TearDown() override {
    // The client before the server it talks to.
    setup_.client.reset();
    setup_.server.reset();
  }
  // The spinner (tests/testing/program_defs.h) on a mesh of one, about 3 s
  // a run, and its input.
  struct Spinner {
    std::shared_ptr<LoadedProgram> program;
    Array x;
  };
  absl::StatusOr<Spinner> LoadSpinner() {
    CAUSEWAY_ASSIGN_OR_RETURN(Mesh one, c_->AllocateMesh(0, {1}));
    Spinner s;
    CAUSEWAY_ASSIGN_OR_RETURN(
        s.program, c_->Load(::causeway::testing::SpinnerDef(4096, absl::Seconds(3)), {{"m", one}}));
    CAUSEWAY_ASSIGN_OR_RETURN(s.x, c_->CreateArray(one, {1}, DType::kI32));
    const int32_t zero = 0;
    CAUSEWAY_RETURN_IF_ERROR(c_->Upload(s.x, &zero, sizeof(zero)));
    return s;
  }
  Rig setup_;
  Client* c_ = nullptr;
};

// Tests that Devices lists every accelerator of the island with its index,
// the island's name, its type and compute limits, and its health.
TEST_P(ClientTest, DevicesListEveryAcceleratorWithItsLimits) {
  ASSERT_EQ(c_->island_count(), 1);
  ASSERT_OK_AND_ASSIGN(std::vector<Device> devices, c_->Devices());
  ASSERT_EQ(devices.size(), static_cast<size_t>(kAccelerators));
  for (int i = 0; i < kAccelerators; ++i) {
    SCOPED_TRACE(i);
    const Device& d = devices[i];
    EXPECT_EQ(d.island, 0);
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.island_name, GetParam() == "local" ? "here" : "there");
    const DeviceCapabilities& c = d.capabilities;
    EXPECT_THAT(c.name, HasSubstr("llvmpipe"));
    EXPECT_EQ(c.kind, DeviceKind::kCpu);
    EXPECT_EQ(c.subgroup_size, 8u);
    EXPECT_GE(c.max_workgroup_invocations, 128u);  // Vulkan's minimum
    EXPECT_GE(c.max_workgroup_size[0], 128u);
    EXPECT_GE(c.max_workgroup_count[0], 65535u);
    EXPECT_EQ(c.max_storage_buffers, 32u);  // lavapipe's pushed set
    // Remotely, what crossed the wire is what the island's runtime knows.
    if (setup_.runtime != nullptr) EXPECT_EQ(c, setup_.runtime->accelerator(i)->capabilities());
    EXPECT_OK(d.health);
  }
}

// Tests that an array split over a mesh of two comes back as uploaded, and
// that a released array is gone: not downloaded, not released twice.
TEST_P(ClientTest, ArraysComeBackAsUploadedAndGoWhenReleased) {
  ASSERT_OK_AND_ASSIGN(Mesh mesh, c_->AllocateMesh(0, {2}));
  EXPECT_EQ(mesh.dims, std::vector<int>{2});
  ASSERT_OK_AND_ASSIGN(Array a, c_->CreateArray(mesh, {64, 4}, DType::kF32, Sharding::Split(0)));
  EXPECT_EQ(a.shape, (Shape{64, 4}));
  EXPECT_EQ(a.bytes(), 64u * 4 * 4);
  const std::vector<float> host = RandomFloats(64 * 4, 1);
  ASSERT_OK(c_->Upload(a, host.data(), a.bytes()));
  std::vector<float> back(host.size());
  ASSERT_OK(c_->Download(a, back.data(), a.bytes(), absl::Now() + kRunTimeout));
  EXPECT_EQ(back, host);
  ASSERT_OK(c_->Release(a));
  EXPECT_ERROR(c_->Download(a, back.data(), a.bytes(), absl::Now() + kRunTimeout),
               absl::StatusCode::kNotFound, "no array");
  EXPECT_ERROR(c_->Release(a), absl::StatusCode::kNotFound, "no array");
}

// Tests that one tenant never reads what another left in memory: a second
// client of the same island creates an array where the first one's
// released array was (same shape, same accelerators) and reads zeros, never
// the first client's bytes, without having written it.
TEST_P(ClientTest, ATenantNeverReadsAnotherTenantsFreedBytes) {
  ASSERT_OK_AND_ASSIGN(Mesh mesh, c_->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(Array secret, c_->CreateArray(mesh, {64, 4}, DType::kF32, Sharding::Split(0)));
  std::vector<float> host = RandomFloats(64 * 4, 3);
  for (float& x : host) x += 2.0f;  // no zeros
  ASSERT_OK(c_->Upload(secret, host.data(), secret.bytes()));
  // Read back, so that the upload has retired and nothing holds the
  // array's buffers once it is released.
  std::vector<float> check(host.size());
  ASSERT_OK(c_->Download(secret, check.data(), secret.bytes(), absl::Now() + kRunTimeout));
  ASSERT_EQ(check, host);
  ASSERT_OK(c_->Release(secret));

  std::unique_ptr<Client> other;
  if (GetParam() == "local") {
    ASSERT_OK_AND_ASSIGN(other, LocalClient::Connect(static_cast<LocalClient*>(c_)->island(), "other"));
  } else {
    ASSERT_OK_AND_ASSIGN(other, RemoteClient::Connect({setup_.server->address().ToString()}));
  }
  ASSERT_OK_AND_ASSIGN(Mesh theirs, other->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(Array fresh, other->CreateArray(theirs, {64, 4}, DType::kF32, Sharding::Split(0)));
  std::vector<float> back(host.size(), -1.0f);
  ASSERT_OK(other->Download(fresh, back.data(), fresh.bytes(), absl::Now() + kRunTimeout));
  EXPECT_EQ(back, std::vector<float>(host.size(), 0.0f));
  ASSERT_OK(other->Release(fresh));
}

// Tests that runs return at once and chain: three runs each adding b to the
// last one's output, none awaited before the next is asked for, give
// x + 3b (checked against the CPU), and each run's future resolves OK.
TEST_P(ClientTest, RunsChainWithoutWaitingAndMatchTheCpu) {
  constexpr int kN = 256;
  ASSERT_OK_AND_ASSIGN(Mesh mesh, c_->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(auto program, c_->Load(AddRowsDef(kN), {{"m", mesh}}));
  EXPECT_EQ(program->name(), "add-rows");
  ASSERT_OK_AND_ASSIGN(Array x, c_->CreateArray(mesh, {kN, 4}, DType::kF32, Sharding::Split(0)));
  ASSERT_OK_AND_ASSIGN(Array b, c_->CreateArray(mesh, {kN, 4}, DType::kF32, Sharding::Split(0)));
  const std::vector<float> xh = RandomFloats(kN * 4, 2), bh = RandomFloats(kN * 4, 3);
  ASSERT_OK(c_->Upload(x, xh.data(), x.bytes()));
  ASSERT_OK(c_->Upload(b, bh.data(), b.bytes()));
  std::vector<client::Run> runs;
  Array last = x;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(client::Run run, c_->Execute(program, {last, b}));
    ASSERT_EQ(run.outputs.size(), 1u);
    EXPECT_EQ(run.outputs[0].shape, (Shape{kN, 4}));
    last = run.outputs[0];
    runs.push_back(run);
  }
  std::vector<float> got(kN * 4);
  ASSERT_OK(c_->Download(last, got.data(), last.bytes(), absl::Now() + kRunTimeout));
  for (int i = 0; i < kN * 4; ++i) {
    ASSERT_EQ(got[i], ((xh[i] + bh[i]) + bh[i]) + bh[i]) << "element " << i;
  }
  for (const client::Run& run : runs) ASSERT_OK(run.done.AwaitStatus(absl::Now() + kRunTimeout));
  EXPECT_NE(runs[0].tag, runs[1].tag);
}

// Tests that cancelled runs' futures fail with Cancelled, one running (its
// kernel runs on to its end: Vulkan cannot take it back) and one queued
// behind it, and that the client goes on serving.
TEST_P(ClientTest, CancelledRunFailsWithCancelled) {
  ASSERT_OK_AND_ASSIGN(Spinner spinner, LoadSpinner());
  // Two runs: the second is queued behind the first and never starts.
  ASSERT_OK_AND_ASSIGN(client::Run first, c_->Execute(spinner.program, {spinner.x}));
  ASSERT_OK_AND_ASSIGN(client::Run second, c_->Execute(spinner.program, {spinner.x}));
  ASSERT_OK(c_->Cancel(second));
  ASSERT_OK(c_->Cancel(first));
  EXPECT_ERROR(first.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled);
  EXPECT_ERROR(second.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kCancelled);
  // Served afterwards, on the other accelerator's mesh too.
  ASSERT_OK_AND_ASSIGN(Mesh two, c_->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(Array a, c_->CreateArray(two, {8, 4}, DType::kF32));
  const std::vector<float> host = RandomFloats(32, 4);
  ASSERT_OK(c_->Upload(a, host.data(), a.bytes()));
  std::vector<float> back(32);
  ASSERT_OK(c_->Download(a, back.data(), a.bytes(), absl::Now() + kRunTimeout));
  EXPECT_EQ(back, host);
}

// Tests that a run past its deadline fails with DeadlineExceeded naming the
// program's kernel.
TEST_P(ClientTest, RunPastItsDeadlineFails) {
  ASSERT_OK_AND_ASSIGN(Spinner spinner, LoadSpinner());
  ExecuteOptions options;
  options.deadline = absl::Milliseconds(500);
  ASSERT_OK_AND_ASSIGN(client::Run run, c_->Execute(spinner.program, {spinner.x}, options));
  EXPECT_ERROR(run.done.AwaitStatus(absl::Now() + kRunTimeout), absl::StatusCode::kDeadlineExceeded, "spin");
}

// Tests that handles this client does not hold are refused, naming what.
TEST_P(ClientTest, HandlesItDoesNotHoldAreRefused) {
  EXPECT_FALSE(c_->AllocateMesh(3, {1}).ok());
  ASSERT_OK_AND_ASSIGN(Mesh mesh, c_->AllocateMesh(0, {1}));
  Mesh unknown = mesh;
  unknown.id += 1000;
  EXPECT_ERROR(c_->CreateArray(unknown, {4}, DType::kF32).status(), absl::StatusCode::kNotFound, "mesh");
  Array stranger{0, 123456, {4}, DType::kF32};
  float host[4] = {};
  EXPECT_ERROR(c_->Download(stranger, host, sizeof(host), absl::Now() + kRunTimeout),
               absl::StatusCode::kNotFound, "no array");
  EXPECT_ERROR(c_->Release(stranger), absl::StatusCode::kNotFound, "no array");
  // A program loaded by a client of the other kind.
  Rig other = Make(GetParam() == "local" ? "remote" : "local");
  ASSERT_OK_AND_ASSIGN(Mesh theirs, other.client->AllocateMesh(0, {2}));
  ASSERT_OK_AND_ASSIGN(auto program, other.client->Load(AddRowsDef(8), {{"m", theirs}}));
  EXPECT_ERROR(c_->Execute(program, {}).status(), absl::StatusCode::kInvalidArgument, "was not loaded by a",
               GetParam());
  other.client.reset();
}

INSTANTIATE_TEST_SUITE_P(BothKinds, ClientTest, ::testing::Values("local", "remote"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace causeway::client
