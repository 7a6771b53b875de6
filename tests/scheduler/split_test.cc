// Programs split over islands by a controller (SplitByIsland): each part
// built and loaded on its island of one process, the parts joined by local
// channels, computes bit for bit what the whole program computes on one
// island, with many runs in flight and no deadlock; the parts follow one
// global order; layouts a channel cannot carry are resharded on both sides;
// malformed defs are refused with errors that name the offender.
#include "causeway/scheduler/split.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/local_channel.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/testing/program_defs.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::RunConcurrently;
using ::causeway::testing::ValueOrThrow;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kRunTimeout = absl::Seconds(30);
constexpr absl::Duration kDeadlockLimit = absl::Seconds(60);
using MeshMap = absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>;
using HostValues = std::map<std::string, std::vector<float>>;

// --- building defs ---------------------------------------------------------------------

using ::causeway::testing::AddAllReduce;
using ::causeway::testing::AddCall;
using ::causeway::testing::AddMesh;
using ::causeway::testing::AddParameter;
using ::causeway::testing::AddReshard;

std::vector<std::string> NodeNames(const ProgramDef& def) {
  std::vector<std::string> out;
  for (const NodeDef& n : def.nodes()) out.push_back(n.name());
  return out;
}

const NodeDef* FindNode(const ProgramDef& def, const std::string& name) {
  for (const NodeDef& n : def.nodes()) {
    if (n.name() == name) return &n;
  }
  return nullptr;
}

// --- running ---------------------------------------------------------------------------

// Islands of one process, each over a runtime of its own, and a client of
// each for every controller (controllers of their own load and run the same
// programs side by side).
class Islands {
 public:
  explicit Islands(const std::vector<std::pair<std::string, int>>& islands, int controllers = 1) {
    for (const auto& [name, devices] : islands) {
      runtimes_.push_back(MakeRuntime(devices));
      IslandOptions options;
      options.name = name;
      islands_.push_back(*Island::Create(runtimes_.back().get(), options));
      for (int c = 0; c < controllers; ++c) {
        clients_[{name, c}] = ValueOrThrow(islands_.back()->Connect(absl::StrCat("controller ", c)));
      }
    }
  }
  ~Islands() {
    for (auto& [name, client] : clients_) client->Close();
  }
  const std::shared_ptr<Client>& client(const std::string& island, int controller = 0) {
    return clients_.at({island, controller});
  }

 private:
  std::vector<std::unique_ptr<Runtime>> runtimes_;
  std::vector<std::unique_ptr<Island>> islands_;
  std::map<std::pair<std::string, int>, std::shared_ptr<Client>> clients_;
};

// A program ready to run: either one program on one island, or the parts of
// a split program on theirs, joined by local channels (one per ChannelSpec).
struct Loaded {
  std::vector<std::shared_ptr<Client>> clients;  // per part
  std::vector<std::shared_ptr<const Program>> programs;
  std::vector<std::shared_ptr<Executable>> executables;
  std::vector<std::shared_ptr<LocalChannel>> channels;
  // Where each output of the whole program comes from: (part, index).
  std::vector<std::pair<int, int>> outputs;
  std::vector<std::string> output_names;
};

absl::Status LoadPart(Loaded& loaded, const std::shared_ptr<Client>& client, const ProgramDef& def,
                      const absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>>& channels) {
  MeshMap meshes;
  for (const MeshDef& m : def.meshes()) {
    CAUSEWAY_ASSIGN_OR_RETURN(meshes[m.name()], client->AllocateMesh({m.dims().begin(), m.dims().end()}));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(auto program, BuildProgram(def, meshes, channels));
  CAUSEWAY_ASSIGN_OR_RETURN(auto executable, client->Load(program));
  loaded.clients.push_back(client);
  loaded.programs.push_back(std::move(program));
  loaded.executables.push_back(std::move(executable));
  return absl::OkStatus();
}

absl::StatusOr<Loaded> LoadSplit(const ProgramDef& def, const SplitProgram& split, Islands& islands,
                                 int controller = 0) {
  Loaded loaded;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Channel>> channels;
  for (const ChannelSpec& c : split.channels) {
    auto channel = LocalChannel::Create(absl::StrCat("channel ", c.id, " from island '", c.from_island, "'"));
    channels[c.id] = channel;
    loaded.channels.push_back(std::move(channel));
  }
  for (const ProgramPart& part : split.parts) {
    CAUSEWAY_RETURN_IF_ERROR(LoadPart(loaded, islands.client(part.island, controller), part.def, channels));
  }
  loaded.outputs = split.outputs;
  loaded.output_names = {def.outputs().begin(), def.outputs().end()};
  return loaded;
}

// `def` as one program on `client`'s island: every mesh there.
absl::StatusOr<Loaded> LoadWhole(ProgramDef def, const std::shared_ptr<Client>& client) {
  for (MeshDef& m : *def.mutable_meshes()) m.clear_island();
  Loaded loaded;
  CAUSEWAY_RETURN_IF_ERROR(LoadPart(loaded, client, def, {}));
  for (int o = 0; o < def.outputs_size(); ++o) loaded.outputs.emplace_back(0, o);
  loaded.output_names = {def.outputs().begin(), def.outputs().end()};
  return loaded;
}

// Runs `loaded` once per entry of `inputs` (by parameter name), every run in
// flight, all from this thread: for each run, each part's run is queued under
// the run's tag, the parts in reverse order so that a pipeline's receiving
// run is queued right before its sender (with two runs in flight per
// executable, Execute waits for the run before last, which is queued by
// then). The outputs of each run by name. A deadlock never returns: call it
// under RunConcurrently.
absl::StatusOr<std::vector<HostValues>> RunAll(const Loaded& loaded, const std::vector<HostValues>& inputs,
                                               uint64_t first_tag) {
  const int parts = static_cast<int>(loaded.programs.size());
  std::vector<std::vector<Execution>> runs(inputs.size(), std::vector<Execution>(parts));
  for (size_t r = 0; r < inputs.size(); ++r) {
    for (int p = parts - 1; p >= 0; --p) {
      const Program& program = *loaded.programs[p];
      Client& client = *loaded.clients[p];
      std::vector<ArrayRef> arrays;
      for (int id : program.parameters()) {
        const ProgramValue& v = program.values()[id];
        CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef array,
                                  client.CreateArray(v.mesh, v.shape, v.dtype, v.sharding, v.name));
        const std::vector<float>& host = inputs[r].at(v.name);
        CAUSEWAY_RETURN_IF_ERROR(array->Upload(host.data(), host.size() * sizeof(float)));
        arrays.push_back(std::move(array));
      }
      CAUSEWAY_ASSIGN_OR_RETURN(runs[r][p],
                                client.Execute(loaded.executables[p], arrays, {.tag = first_tag + r}));
    }
  }
  std::vector<HostValues> out(inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r) {
    for (int p = 0; p < parts; ++p) {
      absl::Status status = runs[r][p].Await(absl::Now() + kRunTimeout);
      if (!status.ok()) {
        return absl::Status(status.code(), absl::StrCat("run ", r, " part ", p, ": ", status.message()));
      }
    }
    for (size_t o = 0; o < loaded.outputs.size(); ++o) {
      const auto [p, i] = loaded.outputs[o];
      const ArrayRef& array = runs[r][p].outputs[i];
      std::vector<float> host(NumElements(array->shape()));
      CAUSEWAY_RETURN_IF_ERROR(array->Download(host.data(), host.size() * sizeof(float)));
      out[r][loaded.output_names[o]] = std::move(host);
    }
  }
  return out;
}

// RunAll, failing the test (and ending the process) if it deadlocks.
std::vector<HostValues> RunOrDie(const Loaded& loaded, const std::vector<HostValues>& inputs,
                                 uint64_t first_tag, const std::string& what) {
  std::vector<HostValues> out;
  RunConcurrently({[&] {
                    auto got = RunAll(loaded, inputs, first_tag);
                    EXPECT_OK(got.status());
                    if (got.ok()) out = *std::move(got);
                  }},
                  kDeadlockLimit, what);
  return out;
}

void ExpectBitIdentical(const std::vector<HostValues>& got, const std::vector<HostValues>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << "run " << r;
    for (const auto& [name, values] : want[r]) {
      ASSERT_TRUE(got[r].contains(name)) << name;
      ASSERT_EQ(got[r].at(name).size(), values.size()) << name;
      EXPECT_EQ(std::memcmp(got[r].at(name).data(), values.data(), values.size() * sizeof(float)), 0)
          << "run " << r << " output '" << name << "'";
    }
  }
}

// --- tests -----------------------------------------------------------------------------

// The pipeline: on island a (2 devices, rows split), h = x * w; on island b
// (2 devices), z = h + bias and out = 2 z. Outputs out and h.
ProgramDef PipelineDef() {
  ProgramDef def;
  def.set_name("pipeline");
  AddMesh(def, "ma", {2}, "a");
  AddMesh(def, "mb", {2}, "b");
  *def.add_functions() = MatmulDef("mm", 8, 16, 16);
  *def.add_functions() = ElementwiseDef("add", "add", {8, 16});
  *def.add_functions() = ScaleDef("double", {8, 16}, 2.0f);
  *def.add_functions() = ScaleDef("unused", {3}, 2.0f);
  AddParameter(def, "x", "ma", {16, 16}, Sharding::Split(0));
  AddParameter(def, "w", "ma", {16, 16});
  AddParameter(def, "bias", "mb", {16, 16}, Sharding::Split(0));
  AddCall(def, "stage1", "mm", "ma", {"x", "w"}, {"h"});
  AddCall(def, "stage2", "add", "mb", {"h", "bias"}, {"z"});
  AddCall(def, "stage2b", "double", "mb", {"z"}, {"out"});
  def.add_outputs("out");
  def.add_outputs("h");
  return def;
}

// Tests that a two-stage pipeline over islands a and b splits into a part
// per island (only the meshes and functions each uses; a send after stage 1,
// a receive before stage 2) whose runs, 6 in flight, equal bit for bit the
// same def run whole on one island, and the CPU reference.
TEST(SplitTest, PipelineOverTwoIslandsMatchesWholeProgram) {
  const ProgramDef def = PipelineDef();
  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 100));
  ASSERT_EQ(split.parts.size(), 2u);
  const ProgramDef& a = split.parts[0].def;
  const ProgramDef& b = split.parts[1].def;
  EXPECT_EQ(split.parts[0].island, "a");
  EXPECT_EQ(split.parts[1].island, "b");
  EXPECT_THAT(NodeNames(a), ElementsAre("stage1", "send:h:b"));
  EXPECT_THAT(NodeNames(b), ElementsAre("recv:h", "stage2", "stage2b"));
  ASSERT_EQ(split.channels.size(), 1u);
  EXPECT_EQ(split.channels[0].id, 100u);
  EXPECT_EQ(split.channels[0].from_island, "a");
  EXPECT_EQ(split.channels[0].to_island, "b");
  EXPECT_EQ(split.channels[0].value, "h");
  EXPECT_EQ(a.nodes(1).send().channel(), 100u);
  const ReceiveDef& recv = b.nodes(0).receive();
  EXPECT_EQ(recv.channel(), 100u);
  EXPECT_EQ(recv.mesh(), "mb");
  EXPECT_THAT(recv.shape(), ElementsAre(16, 16));
  EXPECT_EQ(recv.sharding().split().array_axis(), 0);  // h is split by rows, and 16 divides by 2
  ASSERT_TRUE(recv.sharding().has_split());
  ASSERT_EQ(a.meshes_size(), 1);
  EXPECT_EQ(a.meshes(0).name(), "ma");
  ASSERT_EQ(b.meshes_size(), 1);
  EXPECT_EQ(b.meshes(0).name(), "mb");
  ASSERT_EQ(a.functions_size(), 1);
  EXPECT_EQ(a.functions(0).name(), "mm");
  ASSERT_EQ(b.functions_size(), 2);
  EXPECT_EQ(split.parameters, (std::vector<std::pair<int, int>>{{0, 0}, {0, 1}, {1, 0}}));
  EXPECT_EQ(split.outputs, (std::vector<std::pair<int, int>>{{1, 0}, {0, 0}}));

  Islands islands({{"a", 2}, {"b", 2}, {"whole", 4}});
  ASSERT_OK_AND_ASSIGN(Loaded parts, LoadSplit(def, split, islands));
  ASSERT_OK_AND_ASSIGN(Loaded whole, LoadWhole(def, islands.client("whole")));
  constexpr int kRuns = 6;
  std::vector<HostValues> inputs;
  for (int r = 0; r < kRuns; ++r) {
    inputs.push_back({{"x", reference::RandomFloats(256, 10 * r)},
                      {"w", reference::RandomFloats(256, 10 * r + 1, -0.5f, 0.5f)},
                      {"bias", reference::RandomFloats(256, 10 * r + 2)}});
  }
  const std::vector<HostValues> got = RunOrDie(parts, inputs, 1000, "the split pipeline");
  const std::vector<HostValues> want = RunOrDie(whole, inputs, 0, "the whole pipeline");
  ExpectBitIdentical(got, want);
  ASSERT_EQ(got.size(), static_cast<size_t>(kRuns));
  for (int r = 0; r < kRuns; ++r) {
    const std::vector<float> h = reference::Matmul(inputs[r].at("x"), inputs[r].at("w"), 16, 16, 16);
    std::vector<float> out(256);
    for (int i = 0; i < 256; ++i) out[i] = 2.0f * (h[i] + inputs[r].at("bias")[i]);
    EXPECT_LE(reference::MaxRelativeError(got[r].at("h"), h), 1e-5) << "run " << r;
    EXPECT_LE(reference::MaxRelativeError(got[r].at("out"), out), 1e-5) << "run " << r;
  }
  for (const auto& channel : parts.channels) EXPECT_EQ(channel->inbox().pending(), 0u);
}

// Tests data parallelism over islands: each island all-reduces its gradient
// over its own mesh and adds the other island's sum (a value crossing each
// way in every run); 8 runs in flight finish without deadlock and equal the
// CPU reference exactly (every element is one sum of two, then one of two).
TEST(SplitTest, DataParallelBothWaysEqualsCpu) {
  constexpr int64_t kShard = 2048;
  ProgramDef def;
  def.set_name("data-parallel");
  AddMesh(def, "ga", {2}, "a");
  AddMesh(def, "gb", {2}, "b");
  *def.add_functions() = ElementwiseDef("add", "add", {kShard});
  // Each device holds its own gradient: a shard of [2 * kShard].
  AddParameter(def, "grad_a", "ga", {2 * kShard}, Sharding::Split(0));
  AddParameter(def, "grad_b", "gb", {2 * kShard}, Sharding::Split(0));
  AddAllReduce(def, "reduce_a", "ga", "grad_a", "sum_a");
  AddAllReduce(def, "reduce_b", "gb", "grad_b", "sum_b");
  AddCall(def, "total_a", "add", "ga", {"sum_a", "sum_b"}, {"t_a"});
  AddCall(def, "total_b", "add", "gb", {"sum_b", "sum_a"}, {"t_b"});
  def.add_outputs("t_a");
  def.add_outputs("t_b");

  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 1));
  ASSERT_EQ(split.parts.size(), 2u);
  ASSERT_EQ(split.channels.size(), 2u);
  // The global order is reduce_a, reduce_b, total_a, total_b; each send is
  // appended when its consumer is met.
  EXPECT_THAT(NodeNames(split.parts[0].def),
              ElementsAre("reduce_a", "recv:sum_b", "total_a", "send:sum_a:b"));
  EXPECT_THAT(NodeNames(split.parts[1].def),
              ElementsAre("reduce_b", "send:sum_b:a", "recv:sum_a", "total_b"));

  Islands islands({{"a", 2}, {"b", 2}});
  ASSERT_OK_AND_ASSIGN(Loaded parts, LoadSplit(def, split, islands));
  constexpr int kRuns = 8;
  std::vector<HostValues> inputs;
  for (int r = 0; r < kRuns; ++r) {
    inputs.push_back({{"grad_a", reference::RandomFloats(2 * kShard, 100 + r)},
                      {"grad_b", reference::RandomFloats(2 * kShard, 200 + r)}});
  }
  const std::vector<HostValues> got = RunOrDie(parts, inputs, 1, "data parallel over islands");
  ASSERT_EQ(got.size(), static_cast<size_t>(kRuns));
  for (int r = 0; r < kRuns; ++r) {
    const std::vector<float>& ga = inputs[r].at("grad_a");
    const std::vector<float>& gb = inputs[r].at("grad_b");
    for (int64_t i = 0; i < kShard; ++i) {
      const float want = (ga[i] + ga[kShard + i]) + (gb[i] + gb[kShard + i]);
      ASSERT_EQ(got[r].at("t_a")[i], want) << "run " << r << " element " << i;
      ASSERT_EQ(got[r].at("t_b")[i], want) << "run " << r << " element " << i;
    }
  }
}

// Tests that two controllers' runs of a program whose values cross both ways
// between two islands all finish, though each island takes them in the
// other's order (each controller reaches each island on its own, so nothing
// orders their runs across islands): on island a controller 0's run comes
// first, on island b controller 1's. Were a run's receive placed on its
// island's devices before its value had come, island a's devices would wait
// for controller 0's value from b, which b computes only after controller
// 1's receive, whose value a sends only after controller 0's receive.
TEST(SplitTest, ControllersQueuedInOppositeOrdersOnTwoIslandsDoNotDeadlock) {
  constexpr int64_t kShard = 1024;
  ProgramDef def;
  def.set_name("data-parallel");
  AddMesh(def, "ga", {2}, "a");
  AddMesh(def, "gb", {2}, "b");
  *def.add_functions() = ElementwiseDef("add", "add", {kShard});
  AddParameter(def, "grad_a", "ga", {2 * kShard}, Sharding::Split(0));
  AddParameter(def, "grad_b", "gb", {2 * kShard}, Sharding::Split(0));
  AddAllReduce(def, "reduce_a", "ga", "grad_a", "sum_a");
  AddAllReduce(def, "reduce_b", "gb", "grad_b", "sum_b");
  AddCall(def, "total_a", "add", "ga", {"sum_a", "sum_b"}, {"t_a"});
  AddCall(def, "total_b", "add", "gb", {"sum_b", "sum_a"}, {"t_b"});
  def.add_outputs("t_a");
  def.add_outputs("t_b");
  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 1));
  ASSERT_EQ(split.parts[0].island, "a");
  Islands islands({{"a", 2}, {"b", 2}}, /*controllers=*/2);
  std::vector<Loaded> controllers;
  for (int c = 0; c < 2; ++c) {
    ASSERT_OK_AND_ASSIGN(Loaded loaded, LoadSplit(def, split, islands, c));
    controllers.push_back(std::move(loaded));
  }
  constexpr int kRounds = 4;
  // [round][controller][part]
  std::vector<std::vector<std::vector<Execution>>> runs(kRounds, std::vector<std::vector<Execution>>(2));
  std::vector<std::vector<HostValues>> inputs(kRounds, std::vector<HostValues>(2));
  auto queue = [&](int round, int c, int part) -> absl::Status {
    const Loaded& loaded = controllers[c];
    const Program& program = *loaded.programs[part];
    Client& client = *loaded.clients[part];
    std::vector<ArrayRef> arrays;
    for (int id : program.parameters()) {
      const ProgramValue& v = program.values()[id];
      CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef array,
                                client.CreateArray(v.mesh, v.shape, v.dtype, v.sharding, v.name));
      const std::vector<float>& host = inputs[round][c].at(v.name);
      CAUSEWAY_RETURN_IF_ERROR(array->Upload(host.data(), host.size() * sizeof(float)));
      arrays.push_back(std::move(array));
    }
    runs[round][c].resize(2);
    CAUSEWAY_ASSIGN_OR_RETURN(runs[round][c][part],
                              client.Execute(loaded.executables[part], arrays, {.tag = uint64_t(round + 1)}));
    return absl::OkStatus();
  };
  RunConcurrently(
      {[&] {
        for (int round = 0; round < kRounds; ++round) {
          for (int c = 0; c < 2; ++c) {
            inputs[round][c] = {{"grad_a", reference::RandomFloats(2 * kShard, 100 * c + round)},
                                {"grad_b", reference::RandomFloats(2 * kShard, 100 * c + 50 + round)}};
          }
          // Island a (part 0): controller 0, then 1; island b: 1, then 0.
          ASSERT_OK(queue(round, 0, 0));
          ASSERT_OK(queue(round, 1, 1));
          ASSERT_OK(queue(round, 1, 0));
          ASSERT_OK(queue(round, 0, 1));
        }
        for (int round = 0; round < kRounds; ++round) {
          for (int c = 0; c < 2; ++c) {
            for (int part = 0; part < 2; ++part) {
              ASSERT_OK(runs[round][c][part].Await(absl::Now() + kRunTimeout));
            }
            const std::vector<float>& ga = inputs[round][c].at("grad_a");
            const std::vector<float>& gb = inputs[round][c].at("grad_b");
            for (int part = 0; part < 2; ++part) {
              std::vector<float> got(kShard);
              ASSERT_OK(runs[round][c][part].outputs[0]->Download(got.data(), got.size() * sizeof(float)));
              for (int64_t i = 0; i < kShard; ++i) {
                ASSERT_EQ(got[i], (ga[i] + ga[kShard + i]) + (gb[i] + gb[kShard + i]))
                    << "round " << round << " controller " << c << " part " << part << " element " << i;
              }
            }
          }
        }
      }},
      kDeadlockLimit, "two controllers over two islands, queued in opposite orders");
}

// Tests the layouts across islands: x, split along axis 1, is resharded on
// its island to split(0) ("x@dcn") and received split(0), then resharded
// after the receive to the split(1) its consumer's function wants; u, split
// along axis 1 with a dim 0 (3) that does not divide, goes replicated and
// needs nothing after; c, split along axis 1 and read by an all-reduce,
// travels as x does and is resharded back to split(1) for the collective
// (which in the whole program sums its column halves). The runs equal the
// whole program and the CPU.
TEST(SplitTest, ReshardsBeforeSendingAndAfterReceiving) {
  ProgramDef def;
  def.set_name("layouts");
  AddMesh(def, "ma", {2}, "a");
  AddMesh(def, "mb", {2}, "b");
  *def.add_functions() = ScaleDef("triple_cols", {6, 4}, 3.0f);  // wants x split(1) on mb
  *def.add_functions() = ScaleDef("halve", {3, 8}, 0.5f);        // wants u whole
  AddParameter(def, "x", "ma", {6, 8}, Sharding::Split(1));
  AddParameter(def, "u", "ma", {3, 8}, Sharding::Split(1));
  AddCall(def, "use_x", "triple_cols", "mb", {"x"}, {"y"});
  AddCall(def, "use_u", "halve", "mb", {"u"}, {"v"});
  AddParameter(def, "c", "ma", {4, 4}, Sharding::Split(1));
  AddAllReduce(def, "reduce_c", "mb", "c", "c_sum");
  def.add_outputs("y");
  def.add_outputs("v");
  def.add_outputs("c_sum");

  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 1));
  ASSERT_EQ(split.parts.size(), 2u);
  const ProgramDef& a = split.parts[0].def;
  const ProgramDef& b = split.parts[1].def;
  EXPECT_THAT(NodeNames(a), ElementsAre("x@dcn", "send:x:b", "u@dcn", "send:u:b", "c@dcn", "send:c:b"));
  EXPECT_THAT(NodeNames(b), ElementsAre("recv:x", "x@mb:split(1,0)", "use_x", "recv:u", "use_u", "recv:c",
                                        "c@mb:split(1,0)", "reduce_c"));
  ASSERT_EQ(a.outputs_size(), 0);  // a only sends
  // Before sending: x to split(0) (6 rows over 2), u to replicated (3 rows).
  const ReshardDef& x_dcn = FindNode(a, "x@dcn")->reshard();
  EXPECT_EQ(x_dcn.input(), "x");
  ASSERT_TRUE(x_dcn.sharding().has_split());
  EXPECT_EQ(x_dcn.sharding().split().array_axis(), 0);
  EXPECT_FALSE(FindNode(a, "u@dcn")->reshard().sharding().has_split());
  EXPECT_EQ(FindNode(a, "send:x:b")->send().input(), "x@dcn");
  // After receiving: x arrives split(0) and goes to split(1) for use_x; u
  // arrives replicated, as halve wants it.
  ASSERT_TRUE(FindNode(b, "recv:x")->receive().sharding().has_split());
  EXPECT_EQ(FindNode(b, "recv:x")->receive().output(), "x");
  const ReshardDef& x_cols = FindNode(b, "x@mb:split(1,0)")->reshard();
  EXPECT_EQ(x_cols.input(), "x");
  EXPECT_EQ(x_cols.sharding().split().array_axis(), 1);
  EXPECT_EQ(FindNode(b, "use_x")->call().inputs(0), "x@mb:split(1,0)");
  EXPECT_FALSE(FindNode(b, "recv:u")->receive().sharding().has_split());
  EXPECT_EQ(FindNode(b, "use_u")->call().inputs(0), "u");
  EXPECT_EQ(FindNode(b, "reduce_c")->collective().input(), "c@mb:split(1,0)");

  Islands islands({{"a", 2}, {"b", 2}, {"whole", 4}});
  ASSERT_OK_AND_ASSIGN(Loaded parts, LoadSplit(def, split, islands));
  ASSERT_OK_AND_ASSIGN(Loaded whole, LoadWhole(def, islands.client("whole")));
  std::vector<HostValues> inputs;
  for (int r = 0; r < 3; ++r) {
    inputs.push_back({{"x", reference::RandomFloats(48, 7 + r)},
                      {"u", reference::RandomFloats(24, 70 + r)},
                      {"c", reference::RandomFloats(16, 700 + r)}});
  }
  const std::vector<HostValues> got = RunOrDie(parts, inputs, 1, "layouts over islands");
  ExpectBitIdentical(got, RunOrDie(whole, inputs, 0, "layouts whole"));
  ASSERT_EQ(got.size(), inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r) {
    for (int i = 0; i < 48; ++i) ASSERT_EQ(got[r].at("y")[i], 3.0f * inputs[r].at("x")[i]) << i;
    for (int i = 0; i < 24; ++i) ASSERT_EQ(got[r].at("v")[i], 0.5f * inputs[r].at("u")[i]) << i;
    const std::vector<float>& c = inputs[r].at("c");
    ASSERT_EQ(got[r].at("c_sum").size(), 8u);  // [4, 2]: the column halves summed
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 2; ++j)
        ASSERT_EQ(got[r].at("c_sum")[i * 2 + j], c[i * 4 + j] + c[i * 4 + j + 2]) << i;
    }
  }
}

// Tests the order rule: the def lists b's consumer of a's value before the
// independent node of b that produces what a needs (and a's consumer first
// of all). Each part follows the global order (a_make, b_use, b_make,
// a_use), not its island's listed order (which would have each island
// receive before it sends: a deadlock), and 4 runs in flight finish.
// Tests that a reshard moving a value to another island in a layout a
// channel fills (replicated, or split by rows) becomes the receive itself:
// no copy after it; and that the moved values match the whole program.
TEST(SplitTest, ReshardAcrossIslandsIsTheReceive) {
  ProgramDef def;
  def.set_name("move");
  AddMesh(def, "a", {2}, "a");
  AddMesh(def, "b", {3}, "b");
  AddParameter(def, "x", "a", {12, 6}, Sharding::Split(0));
  for (auto [name, sharding] : {std::pair<std::string, Sharding>{"rows", Sharding::Split(0)},
                                std::pair<std::string, Sharding>{"all", Sharding::Replicated()},
                                std::pair<std::string, Sharding>{"cols", Sharding::Split(1)}}) {
    AddReshard(def, "move-" + name, "b", "x", name, sharding);
    def.add_outputs(name);
  }
  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 1));
  ASSERT_EQ(split.parts.size(), 2u);
  const ProgramDef& b = split.parts[1].def;
  // x crosses once: the first reshard (rows) is the receive, and the others
  // copy from it on island b.
  int receives = 0, reshards = 0;
  for (const NodeDef& n : b.nodes()) {
    receives += n.has_receive();
    reshards += n.has_reshard();
    if (n.has_receive() && n.receive().output() == "rows") {
      EXPECT_EQ(FromDef(n.receive().sharding())->array_axis, 0);
    }
  }
  EXPECT_EQ(receives, 1) << ProgramDefToText(b);
  EXPECT_EQ(split.channels.size(), 1u);
  EXPECT_EQ(reshards, 2) << ProgramDefToText(b);
  EXPECT_EQ(FindNode(b, "move-rows"), nullptr);
  ASSERT_NE(FindNode(b, "move-all"), nullptr);
  EXPECT_EQ(FindNode(b, "move-all")->reshard().input(), "rows");
  EXPECT_NE(FindNode(b, "move-cols"), nullptr);

  Islands islands({{"a", 2}, {"b", 3}, {"whole", 5}});
  ASSERT_OK_AND_ASSIGN(Loaded parts, LoadSplit(def, split, islands));
  ASSERT_OK_AND_ASSIGN(Loaded whole, LoadWhole(def, islands.client("whole")));
  std::vector<HostValues> inputs;
  for (int r = 0; r < 3; ++r) inputs.push_back({{"x", reference::RandomFloats(72, 40 + r)}});
  std::vector<HostValues> got = RunOrDie(parts, inputs, 1, "reshard across islands");
  std::vector<HostValues> want = RunOrDie(whole, inputs, 1, "the whole program");
  ExpectBitIdentical(got, want);
  for (const HostValues& out : got) EXPECT_EQ(out.at("all"), inputs[&out - got.data()].at("x"));
}

TEST(SplitTest, PartsFollowTheGlobalOrder) {
  constexpr int64_t n = 1024;
  ProgramDef def;
  def.set_name("crossing");
  AddMesh(def, "ma", {1}, "a");
  AddMesh(def, "mb", {1}, "b");
  *def.add_functions() = ElementwiseDef("add", "add", {n});
  *def.add_functions() = ScaleDef("double", {n}, 2.0f);
  *def.add_functions() = ScaleDef("triple", {n}, 3.0f);
  AddParameter(def, "x", "ma", {n});
  AddParameter(def, "y", "mb", {n});
  AddCall(def, "a_use", "add", "ma", {"q", "x"}, {"s"});
  AddCall(def, "b_use", "add", "mb", {"p", "y"}, {"t"});
  AddCall(def, "a_make", "double", "ma", {"x"}, {"p"});
  AddCall(def, "b_make", "triple", "mb", {"y"}, {"q"});
  def.add_outputs("s");
  def.add_outputs("t");

  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 1));
  ASSERT_EQ(split.parts.size(), 2u);
  EXPECT_THAT(NodeNames(split.parts[0].def), ElementsAre("a_make", "send:p:b", "recv:q", "a_use"));
  EXPECT_THAT(NodeNames(split.parts[1].def), ElementsAre("recv:p", "b_use", "b_make", "send:q:a"));

  Islands islands({{"a", 1}, {"b", 1}});
  ASSERT_OK_AND_ASSIGN(Loaded parts, LoadSplit(def, split, islands));
  // The programs dispatch in the parts' order.
  for (int p = 0; p < 2; ++p) {
    std::vector<std::string> steps;
    for (const ProgramStep& s : parts.programs[p]->steps()) steps.push_back(s.node);
    EXPECT_EQ(steps, NodeNames(split.parts[p].def)) << parts.programs[p]->DebugString();
  }
  std::vector<HostValues> inputs;
  for (int r = 0; r < 4; ++r) {
    inputs.push_back({{"x", reference::RandomFloats(n, r)}, {"y", reference::RandomFloats(n, 50 + r)}});
  }
  const std::vector<HostValues> got = RunOrDie(parts, inputs, 1, "crossing values");
  ASSERT_EQ(got.size(), inputs.size());
  for (size_t r = 0; r < inputs.size(); ++r) {
    const std::vector<float>& x = inputs[r].at("x");
    const std::vector<float>& y = inputs[r].at("y");
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(got[r].at("s")[i], 3.0f * y[i] + x[i]) << "run " << r << " element " << i;
      ASSERT_EQ(got[r].at("t")[i], 2.0f * x[i] + y[i]) << "run " << r << " element " << i;
    }
  }
}

// Tests that a def on one island (named once, or not at all) is one part
// with no channels, and that one value read by two nodes of another island
// crosses once (one channel per value and island).
TEST(SplitTest, OneIslandIsOnePartAndAValueCrossesOnce) {
  ProgramDef def = PipelineDef();
  def.mutable_meshes(0)->set_island("a");
  def.mutable_meshes(1)->clear_island();
  ASSERT_OK_AND_ASSIGN(SplitProgram one, SplitByIsland(def, 1));
  ASSERT_EQ(one.parts.size(), 1u);
  EXPECT_EQ(one.parts[0].island, "a");
  EXPECT_TRUE(one.channels.empty());
  EXPECT_THAT(NodeNames(one.parts[0].def), ElementsAre("stage1", "stage2", "stage2b"));
  EXPECT_EQ(one.parts[0].def.functions_size(), 3);  // not "unused"
  EXPECT_EQ(one.outputs, (std::vector<std::pair<int, int>>{{0, 0}, {0, 1}}));

  def = PipelineDef();
  AddCall(def, "stage2c", "add", "mb", {"h", "z"}, {"out2"});
  def.add_outputs("out2");
  ASSERT_OK_AND_ASSIGN(SplitProgram split, SplitByIsland(def, 1));
  ASSERT_EQ(split.channels.size(), 1u);
  EXPECT_THAT(NodeNames(split.parts[1].def), ElementsAre("recv:h", "stage2", "stage2b", "stage2c"));
}

// Tests that malformed defs are refused with InvalidArgument naming the
// offender: a cycle through two islands, an unknown value, a mesh without an
// island among meshes on several, a send node in the def, and an island
// that computes nothing anyone reads.
TEST(SplitTest, RefusesMalformedDefs) {
  {
    ProgramDef def = PipelineDef();
    def.mutable_nodes(0)->mutable_call()->set_inputs(1, "out");  // stage1 reads what stage2b makes from it
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument,
                 "program 'pipeline' has a cycle through nodes 'stage1', 'stage2', 'stage2b'");
  }
  {
    ProgramDef def = PipelineDef();
    def.mutable_nodes(1)->mutable_call()->set_inputs(1, "ghost");
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument,
                 "node 'stage2' reads 'ghost', which no parameter or node produces");
  }
  {
    ProgramDef def = PipelineDef();
    AddMesh(def, "mc", {1}, "");
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument,
                 "islands 'a', 'b', but mesh 'mc' names no island");
  }
  {
    ProgramDef def = PipelineDef();
    NodeDef* send = def.add_nodes();
    send->set_name("early-send");
    send->mutable_send()->set_input("h");
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument,
                 "node 'early-send' is a send");
  }
  {
    ProgramDef def = PipelineDef();
    AddMesh(def, "mc", {1}, "c");
    *def.add_functions() = ScaleDef("one", {4}, 1.0f);
    AddParameter(def, "lonely", "mc", {4});
    AddCall(def, "idle", "one", "mc", {"lonely"}, {"nobody"});
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument,
                 "island 'c' computes nothing", "'idle'");
  }
  {
    // The error names a virtual mesh (one of null devices) without touching them.
    ProgramDef def = PipelineDef();
    def.mutable_parameters(0)->mutable_sharding()->mutable_split()->set_mesh_axis(1);
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument, "parameter 'x'",
                 "on no accelerators (virtual) has no axis 1");
  }
  {
    ProgramDef def = PipelineDef();
    def.mutable_meshes(0)->set_dims(0, 1 << 20);
    EXPECT_ERROR(SplitByIsland(def, 1).status(), absl::StatusCode::kInvalidArgument, "mesh 'ma'",
                 "1048576 devices");
  }
}

// Tests that 1000 random mutations (fixed seed) of serialized defs over three
// islands are split or refused without a crash: every refusal InvalidArgument
// or Unimplemented (an internal error would be a part that does not build),
// and every split has a part per island it uses and matching channel ends.
TEST(SplitTest, MutatedDefsNeverCrash) {
  ProgramDef base = PipelineDef();
  AddMesh(base, "mc", {2}, "c");
  AddCall(base, "stage3", "add", "mc", {"z", "h"}, {"z3"});
  base.add_outputs("z3");
  const std::string bytes = base.SerializeAsString();
  std::mt19937 rng(20240612);
  int unparsed = 0, split_ok = 0, refused = 0;
  // Mutants that parse back to the base def (a byte set to the value it had,
  // or a change the parse does not see), found by comparing messages: each
  // must split as the base does, whatever the other counts are.
  int same_as_base = 0, same_split = 0;
  for (int it = 0; it < 1000; ++it) {
    std::string mutated = bytes;
    // One change, mostly in place (so that most mutants still parse).
    const size_t at = rng() % mutated.size();
    switch (rng() % 4) {
      case 0:
      case 1:
        mutated[at] = static_cast<char>(mutated[at] ^ (1 << (rng() % 7)));
        break;
      case 2:
        mutated[at] = static_cast<char>(rng() % 128);
        break;
      case 3:
        mutated.erase(at, 1);
        break;
    }
    ProgramDef def;
    if (!def.ParseFromString(mutated)) {
      ++unparsed;
      continue;
    }
    const bool same = google::protobuf::util::MessageDifferencer::Equals(def, base);
    same_as_base += same;
    auto split = SplitByIsland(def, 1);
    same_split += same && split.ok();
    if (!split.ok()) {
      ++refused;
      EXPECT_THAT(split.status().code(),
                  ::testing::AnyOf(absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnimplemented))
          << split.status() << "\n"
          << ProgramDefToText(def);
      continue;
    }
    ++split_ok;
    for (const ChannelSpec& c : split->channels) {
      int sends = 0, receives = 0;
      for (const ProgramPart& part : split->parts) {
        for (const NodeDef& n : part.def.nodes()) {
          sends += n.has_send() && n.send().channel() == c.id && part.island == c.from_island;
          receives += n.has_receive() && n.receive().channel() == c.id && part.island == c.to_island;
        }
      }
      EXPECT_EQ(sends, 1) << "channel " << c.id;
      EXPECT_EQ(receives, 1) << "channel " << c.id;
    }
  }
  EXPECT_GT(same_as_base, 0);
  EXPECT_EQ(same_split, same_as_base);
  EXPECT_GT(split_ok, 0);
  EXPECT_GT(refused, 0);
  std::printf("1000 mutations: %d unparsed, %d refused, %d split (%d the base def)\n", unparsed, refused,
              split_ok, same_as_base);
}

}  // namespace
}  // namespace causeway
