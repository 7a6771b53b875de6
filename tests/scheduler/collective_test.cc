// Collectives as program nodes, end to end: every collective against a CPU
// reference on 1-D meshes of 1 to 8 accelerators with both algorithms, the
// plans simulated on the host (results and races), collectives chained with
// calls and repeated, two clients at once on overlapping meshes, and the
// programs and runs that must be refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/collectives.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/collective_reference.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::Concat;
using ::causeway::testing::MakeRuntime;
using ::causeway::testing::Mismatch;
using ::causeway::testing::RandomValues;
using ::causeway::testing::Reduce;
using ::causeway::testing::Reference;
using ::causeway::testing::ShardOf;
using ::causeway::testing::RunConcurrently;
using ::testing::AnyOf;
using ::testing::HasSubstr;

// Every wait in these tests ends by this much; a run not done by then is a hang.
constexpr absl::Duration kRunTimeout = absl::Seconds(20);

constexpr CollectiveKind kAllReduce = CollectiveKind::kAllReduce;
constexpr CollectiveKind kAllGather = CollectiveKind::kAllGather;
constexpr CollectiveKind kReduceScatter = CollectiveKind::kReduceScatter;
constexpr CollectiveKind kBroadcast = CollectiveKind::kBroadcast;
constexpr CollectiveKind kPermute = CollectiveKind::kPermute;
constexpr CollectiveAlgorithm kDirect = CollectiveAlgorithm::kDirect;
constexpr CollectiveAlgorithm kRing = CollectiveAlgorithm::kRing;
constexpr CollectiveAlgorithm kAuto = CollectiveAlgorithm::kAuto;
constexpr CollectiveAlgorithm kDirectRead = CollectiveAlgorithm::kDirectRead;
constexpr ReduceOp kSum = ReduceOp::kSum;
constexpr ReduceOp kMax = ReduceOp::kMax;

constexpr int kMeshSizes[] = {1, 2, 3, 4, 5, 8};

const char* KindName(CollectiveKind kind) {
  switch (kind) {
    case kAllReduce:
      return "all-reduce";
    case kAllGather:
      return "all-gather";
    case kReduceScatter:
      return "reduce-scatter";
    case kBroadcast:
      return "broadcast";
    case kPermute:
      return "permute";
  }
  return "?";
}
bool Reduces(CollectiveKind kind) { return kind == kAllReduce || kind == kReduceScatter; }
bool ReplicatedOutput(CollectiveKind kind) {
  return kind == kAllReduce || kind == kAllGather || kind == kBroadcast;
}
std::string PairsString(const std::vector<std::pair<int, int>>& pairs) {
  return absl::StrCat("{",
                      absl::StrJoin(pairs, ", ",
                                    [](std::string* out, const std::pair<int, int>& p) {
                                      absl::StrAppend(out, "(", p.first, ",", p.second, ")");
                                    }),
                      "}");
}
std::vector<std::pair<int, int>> RingShift(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int p = 0; p < n; ++p) pairs.push_back({p, (p + 1) % n});
  return pairs;
}

// --- CPU references -----------------------------------------------------------------

// Checks a collective's output against `want` (position p's shard): the
// gathered download, every device's own shard, and, for a replicated output,
// that every device holds the same bits.
template <typename T>
void CheckOutput(const Array& y, const std::vector<std::vector<T>>& want, bool replicated, bool tolerant) {
  const int n = y.mesh()->size();
  ASSERT_EQ(static_cast<int>(want.size()), n);
  std::vector<T> whole(static_cast<size_t>(NumElements(y.shape())));
  ASSERT_OK(y.Download(whole.data(), whole.size() * sizeof(T)));
  EXPECT_EQ(Mismatch(whole, replicated ? want[0] : Concat(want), tolerant), "") << "Array::Download";
  std::vector<std::vector<T>> got(n);
  for (int d = 0; d < n; ++d) {
    ASSERT_OK_AND_ASSIGN(got[d], ShardOf<T>(y, d));
    EXPECT_EQ(Mismatch(got[d], want[d], tolerant), "") << "position " << d << "'s shard";
    if (replicated && d > 0) {
      EXPECT_EQ(Mismatch(got[d], got[0], /*tolerant=*/false), "")
          << "position " << d << " differs from position 0; a replicated output must be bit-identical";
    }
  }
}

// --- plans on the host ----------------------------------------------------------------

const char* BufferName(CollectiveOp::Buffer b) {
  switch (b) {
    case CollectiveOp::kIn:
      return "in";
    case CollectiveOp::kOut:
      return "out";
    case CollectiveOp::kWork:
      return "work";
    case CollectiveOp::kRecv:
      return "recv";
  }
  return "?";
}
const char* OpName(CollectiveOp::Kind k) {
  switch (k) {
    case CollectiveOp::kCopy:
      return "copy";
    case CollectiveOp::kCombine:
      return "combine";
    case CollectiveOp::kZero:
      return "zero";
    case CollectiveOp::kReduce:
      return "reduce";
  }
  return "?";
}

// Far above the simulated inputs (within +-1000): a plan that sums or takes
// the max of scratch or output it never wrote shows.
constexpr int64_t kPoison = 7777777777;

// Runs `plan` on the host, each position's buffers as int64 values, phase by
// phase, each position's ops in order; scratch and outputs start as kPoison.
// First checks the plan: sizes per position, peers and buffer ranges in
// bounds, no write to an input, and that any two accesses of one position's
// buffer from different positions, one a write, are ordered by the waits
// (phase k of p follows phase k-1 of p and of each peer it waits for; the
// inputs precede phase 0 of their own position and of those that wait for
// them). Returns each position's output, or what is wrong.
absl::StatusOr<std::vector<std::vector<int64_t>>> Simulate(const CollectivePlan& plan,
                                                           const std::vector<std::vector<int64_t>>& inputs) {
  const int n = plan.devices;
  const int phases = static_cast<int>(plan.phases.size());
  auto size_of = [&](CollectiveOp::Buffer b) -> uint64_t {
    switch (b) {
      case CollectiveOp::kIn:
        return plan.in_elements;
      case CollectiveOp::kOut:
        return plan.out_elements;
      case CollectiveOp::kWork:
        return plan.work_elements;
      case CollectiveOp::kRecv:
        return plan.recv_elements;
    }
    return 0;
  };
  // Event of phase k at position p; k = -1: p's input being written.
  auto event = [&](int k, int p) { return (k + 1) * n + p; };
  const int events = (phases + 1) * n;
  std::vector<std::vector<bool>> before(events, std::vector<bool>(events, false));
  struct Access {
    int event, device;
    CollectiveOp::Buffer buffer;
    uint64_t begin, end;
    bool write;
    std::string what;
  };
  std::vector<Access> accesses;
  for (int p = 0; p < n; ++p) {
    accesses.push_back({event(-1, p), p, CollectiveOp::kIn, 0, plan.in_elements, true, "its input"});
  }
  for (int k = 0; k < phases; ++k) {
    const CollectivePhase& phase = plan.phases[k];
    if (static_cast<int>(phase.ops.size()) != n || static_cast<int>(phase.waits.size()) != n) {
      return absl::InternalError(absl::StrCat("phase ", k, " has ops for ", phase.ops.size(),
                                              " and waits for ", phase.waits.size(), " positions, want ", n));
    }
    for (int p = 0; p < n; ++p) {
      const int e = event(k, p);
      std::vector<int> preds = {event(k - 1, p)};
      for (int q : phase.waits[p]) {
        if (q < 0 || q >= n) {
          return absl::InternalError(absl::StrCat("phase ", k, " position ", p, " waits for position ", q));
        }
        preds.push_back(event(k - 1, q));
      }
      for (int pred : preds) {
        before[pred][e] = true;
        for (int a = 0; a < events; ++a) {
          if (before[a][pred]) before[a][e] = true;
        }
      }
      for (size_t i = 0; i < phase.ops[p].size(); ++i) {
        const CollectiveOp& op = phase.ops[p][i];
        const std::string what =
            absl::StrCat("phase ", k, " position ", p, " op ", i, " (", OpName(op.kind), ")");
        auto add = [&](int device, CollectiveOp::Buffer b, uint64_t offset, bool write) -> absl::Status {
          if (offset + op.elements > size_of(b)) {
            return absl::InternalError(absl::StrCat(what, " touches ", BufferName(b), "[", offset, ", ",
                                                    offset + op.elements, ") of ", size_of(b), " elements"));
          }
          if (write && b == CollectiveOp::kIn)
            return absl::InternalError(absl::StrCat(what, " writes its input"));
          accesses.push_back({e, device, b, offset, offset + op.elements, write, what});
          return absl::OkStatus();
        };
        switch (op.kind) {
          case CollectiveOp::kCopy:
            if (op.src_device < 0 || op.src_device >= n) {
              return absl::InternalError(absl::StrCat(what, " copies from position ", op.src_device));
            }
            CAUSEWAY_RETURN_IF_ERROR(add(op.src_device, op.src, op.src_offset, false));
            CAUSEWAY_RETURN_IF_ERROR(add(p, op.dst, op.dst_offset, true));
            break;
          case CollectiveOp::kCombine:
            CAUSEWAY_RETURN_IF_ERROR(add(p, op.a, op.a_offset, false));
            CAUSEWAY_RETURN_IF_ERROR(add(p, op.src, op.src_offset, false));
            CAUSEWAY_RETURN_IF_ERROR(add(p, op.dst, op.dst_offset, true));
            break;
          case CollectiveOp::kZero:
            CAUSEWAY_RETURN_IF_ERROR(add(p, op.dst, op.dst_offset, true));
            break;
          case CollectiveOp::kReduce:
            for (int q = 0; q < n; ++q) CAUSEWAY_RETURN_IF_ERROR(add(q, op.src, op.src_offset, false));
            CAUSEWAY_RETURN_IF_ERROR(add(p, op.dst, op.dst_offset, true));
            break;
        }
      }
    }
  }
  for (size_t i = 0; i < accesses.size(); ++i) {
    for (size_t j = i + 1; j < accesses.size(); ++j) {
      const Access& x = accesses[i];
      const Access& y = accesses[j];
      if (x.event == y.event || x.device != y.device || x.buffer != y.buffer || !(x.write || y.write))
        continue;
      if (x.begin >= y.end || y.begin >= x.end) continue;
      if (before[x.event][y.event] || before[y.event][x.event]) continue;
      return absl::InternalError(absl::StrCat(
          x.what, (x.write ? " writes " : " reads "), "position ", x.device, "'s ", BufferName(x.buffer), "[",
          x.begin, ", ", x.end, ") and ", y.what, (y.write ? " writes " : " reads "), "[", y.begin, ", ",
          y.end, "), unordered by the waits: a race"));
    }
  }

  std::vector<std::vector<std::vector<int64_t>>> buf(n);  // [position][buffer]
  for (int p = 0; p < n; ++p) {
    buf[p] = {inputs[p], std::vector<int64_t>(plan.out_elements, kPoison),
              std::vector<int64_t>(plan.work_elements, kPoison),
              std::vector<int64_t>(plan.recv_elements, kPoison)};
  }
  for (const CollectivePhase& phase : plan.phases) {
    for (int p = 0; p < n; ++p) {
      for (const CollectiveOp& op : phase.ops[p]) {
        std::vector<int64_t>& dst = buf[p][op.dst];
        switch (op.kind) {
          case CollectiveOp::kCopy: {
            const std::vector<int64_t>& src = buf[op.src_device][op.src];
            std::vector<int64_t> moved(src.begin() + op.src_offset,
                                       src.begin() + op.src_offset + op.elements);
            std::copy(moved.begin(), moved.end(), dst.begin() + op.dst_offset);
            break;
          }
          case CollectiveOp::kCombine: {
            std::vector<int64_t> result(op.elements);
            for (uint64_t i = 0; i < op.elements; ++i) {
              int64_t a = buf[p][op.a][op.a_offset + i], b = buf[p][op.src][op.src_offset + i];
              result[i] = plan.options.op == kSum ? a + b : std::max(a, b);
            }
            std::copy(result.begin(), result.end(), dst.begin() + op.dst_offset);
            break;
          }
          case CollectiveOp::kZero:
            std::fill(dst.begin() + op.dst_offset, dst.begin() + op.dst_offset + op.elements, 0);
            break;
          case CollectiveOp::kReduce: {
            std::vector<int64_t> result(op.elements);
            for (uint64_t i = 0; i < op.elements; ++i) {
              result[i] = buf[0][op.src][op.src_offset + i];
              for (int q = 1; q < n; ++q) {
                const int64_t x = buf[q][op.src][op.src_offset + i];
                result[i] = plan.options.op == kSum ? result[i] + x : std::max(result[i], x);
              }
            }
            std::copy(result.begin(), result.end(), dst.begin() + op.dst_offset);
            break;
          }
        }
      }
    }
  }
  std::vector<std::vector<int64_t>> out(n);
  for (int p = 0; p < n; ++p) out[p] = buf[p][CollectiveOp::kOut];
  return out;
}

// --- programs on devices ---------------------------------------------------------------

// One collective over a 1-D mesh: its input shard per position and options.
struct Case {
  CollectiveKind kind = kAllReduce;
  Shape shard;
  DType dtype = DType::kF32;
  CollectiveOptions options;
  bool generic = false;  // built with ProgramBuilder::Collective, not the named method

  std::string ToString(int n) const {
    std::string s = absl::StrCat(KindName(kind), " ");
    if (Reduces(kind)) absl::StrAppend(&s, options.op == kSum ? "sum " : "max ");
    if (kind == kBroadcast) absl::StrAppend(&s, "root ", options.root, " ");
    if (kind == kPermute) absl::StrAppend(&s, PairsString(options.pairs), " ");
    if (kind != kPermute) absl::StrAppend(&s, CollectiveAlgorithmName(options.algorithm), " ");
    absl::StrAppend(&s, DTypeName(dtype), ShapeString(shard), " per position over ", n);
    if (generic) absl::StrAppend(&s, " (Collective(), ring from ", options.ring_threshold_bytes, " bytes)");
    return s;
  }
  // Whether results may differ from the reference by rounding.
  bool tolerant() const { return Reduces(kind) && options.op == kSum && dtype == DType::kF32; }
};

constexpr char kNode[] = "coll";

Shape SplitShape(Shape shard, int n) {
  shard[0] *= n;
  return shard;
}

void AddCollective(ProgramBuilder& b, const Case& c, const std::shared_ptr<Mesh>& mesh,
                   const std::string& input, const std::string& output, const std::string& node = kNode) {
  if (c.generic) {
    b.Collective(node, c.kind, mesh, input, output, c.options);
    return;
  }
  switch (c.kind) {
    case kAllReduce:
      b.AllReduce(node, mesh, input, output, c.options.op, c.options.algorithm);
      break;
    case kAllGather:
      b.AllGather(node, mesh, input, output, c.options.algorithm);
      break;
    case kReduceScatter:
      b.ReduceScatter(node, mesh, input, output, c.options.op, c.options.algorithm);
      break;
    case kBroadcast:
      b.Broadcast(node, mesh, input, output, c.options.root, c.options.algorithm);
      break;
    case kPermute:
      b.CollectivePermute(node, mesh, input, output, c.options.pairs);
      break;
  }
}

// The steps of collective `node` (its phases), in dispatch order.
std::vector<const ProgramStep*> PhasesOf(const Program& program, const std::string& node) {
  std::vector<const ProgramStep*> out;
  for (const ProgramStep& s : program.steps()) {
    if (s.kind == ProgramStep::kCollective && (s.node == node || absl::StartsWith(s.node, node + "/"))) {
      out.push_back(&s);
    }
  }
  return out;
}

// The algorithm `c` should get over `n` positions (kAuto: from the
// threshold, direct-read for reductions where devices share memory, else ring).
CollectiveAlgorithm WantAlgorithm(const Case& c, int n, bool shared_memory) {
  if (n == 1 || c.kind == kPermute) return kDirect;
  if (c.options.algorithm != kAuto) return c.options.algorithm;
  const uint64_t shard_bytes = NumElements(c.shard) * DTypeSize(c.dtype);
  if (shard_bytes < c.options.ring_threshold_bytes) return kDirect;
  return Reduces(c.kind) && shared_memory ? kDirectRead : kRing;
}

// Checks what was planned for `c` over `n` positions: kind, sizes, the
// algorithm asked for, one phase for direct, 2(n-1) for a ring all-reduce,
// and for direct-read one reduce per position, then (all-reduce) a phase of
// copies, with no scratch.
void CheckPlan(const CollectivePlan& plan, const Case& c, int n, bool shared_memory) {
  EXPECT_EQ(plan.kind, c.kind);
  EXPECT_EQ(plan.devices, n);
  EXPECT_EQ(plan.dtype, c.dtype);
  EXPECT_EQ(plan.in_elements, static_cast<uint64_t>(NumElements(c.shard)));
  auto out_shard = CollectiveOutputShard(c.kind, n, c.shard);
  ASSERT_TRUE(out_shard.ok()) << out_shard.status();
  EXPECT_EQ(plan.out_elements, static_cast<uint64_t>(NumElements(*out_shard)));
  const CollectiveAlgorithm want = WantAlgorithm(c, n, shared_memory);
  EXPECT_EQ(plan.algorithm, want) << plan.ToString() << ", want " << CollectiveAlgorithmName(want);
  EXPECT_THAT(plan.ToString(), HasSubstr(CollectiveAlgorithmName(want)));
  if (n == 1 || c.kind == kPermute) return;
  if (want == kDirect) {
    EXPECT_EQ(plan.phases.size(), 1u) << "direct is one phase: " << plan.ToString();
  } else if (want == kRing && c.kind == kAllReduce) {
    EXPECT_EQ(plan.phases.size(), 2u * (n - 1)) << "a ring all-reduce is 2(n-1) phases: " << plan.ToString();
  } else if (want == kDirectRead) {
    ASSERT_EQ(plan.phases.size(), c.kind == kAllReduce ? 2u : 1u) << plan.ToString();
    EXPECT_EQ(plan.work_elements, 0u) << "direct-read needs no scratch";
    EXPECT_EQ(plan.recv_elements, 0u) << "direct-read needs no scratch";
    // Every element is reduced once, by one kernel reading all n inputs;
    // an all-reduce then copies each device the n-1 slices it lacks.
    uint64_t reduced = 0, copied = 0;
    for (int p = 0; p < n; ++p) {
      for (const CollectiveOp& op : plan.phases[0].ops[p]) {
        EXPECT_EQ(op.kind, CollectiveOp::kReduce) << "position " << p;
        reduced += op.elements;
      }
      EXPECT_LE(plan.phases[0].ops[p].size(), 1u) << "position " << p << " reduces its slice in one kernel";
      if (plan.phases.size() < 2) continue;
      uint64_t mine = 0;
      for (const CollectiveOp& op : plan.phases[0].ops[p]) mine += op.elements;
      uint64_t in = 0;
      for (const CollectiveOp& op : plan.phases[1].ops[p]) {
        EXPECT_EQ(op.kind, CollectiveOp::kCopy) << "position " << p;
        EXPECT_NE(op.src_device, p) << "position " << p << " copies its own slice";
        in += op.elements;
      }
      EXPECT_EQ(mine + in, plan.in_elements) << "position " << p << " ends with every slice once";
      copied += in;
    }
    EXPECT_EQ(reduced, plan.in_elements) << plan.ToString();
    if (c.kind == kAllReduce) {
      EXPECT_EQ(copied, (n - 1) * plan.in_elements) << plan.ToString();
    }
  }
}

// The ids of a mesh's accelerators in the runtime's list.
std::vector<int> AcceleratorIds(Runtime& rt, const Mesh& mesh) {
  std::vector<int> ids;
  for (Accelerator* a : mesh.devices()) {
    const auto& all = rt.accelerators();
    ids.push_back(static_cast<int>(std::find(all.begin(), all.end(), a) - all.begin()));
  }
  return ids;
}

// An 8-accelerator island with one client, and one mesh per size on demand.
class CollectiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(8);
    ASSERT_NE(rt_, nullptr);
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get()));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("collectives"));
  }
  void TearDown() override {
    meshes_.clear();
    client_.reset();
    island_.reset();
  }

  // A 1-D mesh of `n` accelerators (the same one for every call with `n`).
  std::shared_ptr<Mesh> MeshOf(int n) {
    std::shared_ptr<Mesh>& mesh = meshes_[n];
    if (mesh == nullptr) {
      auto m = client_->AllocateMesh({n});
      EXPECT_TRUE(m.ok()) << m.status();
      if (m.ok()) mesh = *std::move(m);
    }
    return mesh;
  }

  // Builds a program of the one collective `c` over a mesh of `n` whose
  // parameter is split along axis 0 (position p's shard is its own random
  // values), checks the plan, runs it once and checks the output against the
  // reference (shape, sharding, every device's shard) and that the input is
  // unchanged. After a run that hangs, does nothing more (the devices are stuck).
  void Check(int n, const Case& c, uint32_t seed = 1) {
    if (hung_) return;
    SCOPED_TRACE(c.ToString(n));
    switch (c.dtype) {
      case DType::kF32:
        CheckTyped<float>(n, c, seed);
        break;
      case DType::kI32:
        CheckTyped<int32_t>(n, c, seed);
        break;
      case DType::kF16:
        CheckTyped<uint16_t>(n, c, seed);
        break;
    }
  }

  template <typename T>
  void CheckTyped(int n, const Case& c, uint32_t seed) {
    const std::shared_ptr<Mesh> mesh = MeshOf(n);
    ASSERT_NE(mesh, nullptr);
    const Shape global = SplitShape(c.shard, n);
    ProgramBuilder b(absl::StrCat(KindName(c.kind), "-", n));
    b.Parameter("x", mesh, global, c.dtype, Sharding::Split(0));
    AddCollective(b, c, mesh, "x", "y");
    b.Output("y");
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<const Program> program, b.Build());
    std::vector<const ProgramStep*> phases = PhasesOf(*program, kNode);
    ASSERT_FALSE(phases.empty()) << "no collective steps: " << program->DebugString();
    ASSERT_NE(phases[0]->collective, nullptr);
    const CollectivePlan& plan = *phases[0]->collective;
    ASSERT_EQ(phases.size(), plan.phases.size()) << program->DebugString();
    for (size_t i = 0; i < phases.size(); ++i) {
      EXPECT_EQ(phases[i]->phase, static_cast<int>(i)) << phases[i]->node;
      EXPECT_EQ(phases[i]->mesh, mesh) << phases[i]->node;
    }
    CheckPlan(plan, c, n, mesh->DevicesShareMemory());

    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Executable> exe, client_->Load(program));
    const size_t elements = static_cast<size_t>(NumElements(c.shard));
    std::vector<std::vector<T>> shards;
    for (int p = 0; p < n; ++p) shards.push_back(RandomValues<T>(elements, seed * 1000 + p));
    const std::vector<T> flat = Concat(shards);
    ASSERT_OK_AND_ASSIGN(ArrayRef x, client_->CreateArray(mesh, global, c.dtype, Sharding::Split(0), "x"));
    ASSERT_OK(x->Upload(flat.data(), flat.size() * sizeof(T)));
    ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
    const absl::Status done = run.Await(absl::Now() + kRunTimeout);
    if (absl::IsDeadlineExceeded(done)) {
      hung_ = true;
      FAIL() << "the run did not finish in " << kRunTimeout << "; skipping the remaining cases";
    }
    ASSERT_OK(done);
    ASSERT_EQ(run.outputs.size(), 1u);
    const Array& y = *run.outputs[0];
    Shape want_shape = c.kind == kAllGather ? SplitShape(c.shard, n) : c.kind == kPermute ? global : c.shard;
    Sharding want_sharding = ReplicatedOutput(c.kind) ? Sharding::Replicated() : Sharding::Split(0);
    ASSERT_EQ(y.shape(), want_shape) << ShapeString(y.shape()) << " vs " << ShapeString(want_shape);
    EXPECT_TRUE(y.sharding() == want_sharding) << y.sharding().ToString();
    EXPECT_EQ(y.dtype(), c.dtype);
    EXPECT_EQ(y.mesh(), mesh);
    CheckOutput<T>(y, Reference(c.kind, c.options, shards), ReplicatedOutput(c.kind), c.tolerant());
    std::vector<T> after(flat.size());
    ASSERT_OK(x->Download(after.data(), after.size() * sizeof(T)));
    EXPECT_EQ(Mismatch(after, flat, false), "") << "the collective changed its input";
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;
  std::map<int, std::shared_ptr<Mesh>> meshes_;
  bool hung_ = false;
};

// --- results against the reference -----------------------------------------------------

// Tests that all-reduce equals the CPU reference on meshes of 1 to 8, for
// uneven shard sizes (below 4 elements, and no multiple of 4), 2-D shards,
// direct, ring, direct-read and auto, sum and max, f32 and i32.
TEST_F(CollectiveTest, AllReduceMatchesCpu) {
  uint32_t seed = 1;
  for (int n : kMeshSizes) {
    for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead, kAuto}) {
      for (int64_t e : {1, 7, 1000, 4099}) {
        Check(n, {.kind = kAllReduce, .shard = {e}, .options = {.op = kSum, .algorithm = algorithm}}, seed++);
      }
    }
    for (auto [op, dtype] : {std::pair{kMax, DType::kF32}, {kSum, DType::kI32}, {kMax, DType::kI32}}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead}) {
        for (int64_t e : {7, 4099}) {
          Check(n,
                {.kind = kAllReduce,
                 .shard = {e},
                 .dtype = dtype,
                 .options = {.op = op, .algorithm = algorithm}},
                seed++);
        }
      }
    }
    for (CollectiveAlgorithm algorithm : {kRing, kDirectRead}) {
      Check(n, {.kind = kAllReduce, .shard = {3, 5}, .options = {.op = kSum, .algorithm = algorithm}}, seed++);
    }
  }
}

// Tests that all-gather concatenates the shards in mesh order on every
// device, for uneven and 2-D shards, each algorithm, and f32, i32 and f16.
TEST_F(CollectiveTest, AllGatherMatchesCpu) {
  uint32_t seed = 100;
  for (int n : kMeshSizes) {
    for (CollectiveAlgorithm algorithm : {kDirect, kRing, kAuto}) {
      for (int64_t e : {1, 7, 1000, 4099}) {
        Check(n, {.kind = kAllGather, .shard = {e}, .options = {.algorithm = algorithm}}, seed++);
      }
    }
    for (CollectiveAlgorithm algorithm : {kDirect, kRing}) {
      Check(n,
            {.kind = kAllGather, .shard = {1000}, .dtype = DType::kI32, .options = {.algorithm = algorithm}},
            seed++);
      // 7 halves: 14-byte shards, so the copies land at offsets that are not multiples of 4.
      Check(n, {.kind = kAllGather, .shard = {7}, .dtype = DType::kF16, .options = {.algorithm = algorithm}},
            seed++);
    }
    Check(n, {.kind = kAllGather, .shard = {3, 5}, .options = {.algorithm = kRing}}, seed++);
  }
}

// Tests that reduce-scatter gives device p block p of the reduction, for
// shards of n*3, n*13 and n*1031 elements (blocks below 4 elements, and no
// multiple of 4) and 2-D shards, each algorithm, sum and max, f32 and i32.
TEST_F(CollectiveTest, ReduceScatterMatchesCpu) {
  uint32_t seed = 200;
  for (int n : kMeshSizes) {
    for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead, kAuto}) {
      for (int64_t e : {n * 3, n * 13, n * 1031}) {
        Check(n, {.kind = kReduceScatter, .shard = {e}, .options = {.op = kSum, .algorithm = algorithm}},
              seed++);
      }
    }
    for (auto [op, dtype] : {std::pair{kMax, DType::kF32}, {kSum, DType::kI32}, {kMax, DType::kI32}}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead}) {
        for (int64_t e : {n * 3, n * 13, n * 1031}) {
          Check(n,
                {.kind = kReduceScatter,
                 .shard = {e},
                 .dtype = dtype,
                 .options = {.op = op, .algorithm = algorithm}},
                seed++);
        }
      }
    }
    for (CollectiveAlgorithm algorithm : {kRing, kDirectRead}) {
      Check(n, {.kind = kReduceScatter, .shard = {n * 2, 3}, .options = {.op = kSum, .algorithm = algorithm}},
            seed++);
    }
  }
}

// Tests that broadcast copies the root's shard to every device, from root 0,
// root n-1 and a middle root, each algorithm, and f32, i32 and f16.
TEST_F(CollectiveTest, BroadcastMatchesCpu) {
  uint32_t seed = 300;
  for (int n : kMeshSizes) {
    std::vector<int> roots = {0};
    if (n > 1) roots.push_back(n - 1);
    if (n > 2) roots.push_back(n / 2);
    for (int root : roots) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing}) {
        for (int64_t e : {1, 7, 1000, 4099}) {
          Check(n, {.kind = kBroadcast, .shard = {e}, .options = {.root = root, .algorithm = algorithm}},
                seed++);
        }
      }
      Check(n, {.kind = kBroadcast, .shard = {4099}, .options = {.root = root, .algorithm = kAuto}}, seed++);
    }
    Check(n,
          {.kind = kBroadcast,
           .shard = {7},
           .dtype = DType::kI32,
           .options = {.root = n - 1, .algorithm = kRing}},
          seed++);
    Check(n,
          {.kind = kBroadcast,
           .shard = {7},
           .dtype = DType::kF16,
           .options = {.root = n - 1, .algorithm = kRing}},
          seed++);
    Check(n, {.kind = kBroadcast, .shard = {3, 5}, .options = {.root = n - 1, .algorithm = kDirect}}, seed++);
  }
}

// Tests that permute moves each source's shard to its target and zeros the
// devices no pair targets: a ring shift, its reverse, a swap of two, a
// partial permutation, one source to two targets and no pairs at all.
TEST_F(CollectiveTest, PermuteMatchesCpu) {
  uint32_t seed = 400;
  for (int n : kMeshSizes) {
    for (int64_t e : {1, 7, 1000, 4099}) {
      Check(n, {.kind = kPermute, .shard = {e}, .options = {.pairs = RingShift(n)}}, seed++);
    }
    std::vector<std::vector<std::pair<int, int>>> pair_sets;
    std::vector<std::pair<int, int>> reverse;
    for (int p = 0; p < n; ++p) reverse.push_back({p, n - 1 - p});
    pair_sets.push_back(reverse);
    if (n >= 2) pair_sets.push_back({{0, 1}, {1, 0}});      // a swap; the rest get zeros
    pair_sets.push_back({{0, n - 1}});                      // one pair; the rest get zeros
    if (n >= 3) pair_sets.push_back({{1, 0}, {1, n - 1}});  // one source, two targets
    pair_sets.push_back({});                                // all zeros
    for (const auto& pairs : pair_sets) {
      for (int64_t e : {7, 4099}) {
        Check(n, {.kind = kPermute, .shard = {e}, .options = {.pairs = pairs}}, seed++);
      }
    }
    Check(n, {.kind = kPermute, .shard = {7}, .dtype = DType::kI32, .options = {.pairs = {{0, n - 1}}}},
          seed++);
    // 14-byte f16 shards: the zeros and copies are not whole 4-byte words.
    Check(n, {.kind = kPermute, .shard = {7}, .dtype = DType::kF16, .options = {.pairs = {{0, n - 1}}}},
          seed++);
    Check(n, {.kind = kPermute, .shard = {3, 5}, .options = {.pairs = RingShift(n)}}, seed++);
  }
}

// Tests that kAuto switches exactly at ring_threshold_bytes (the default 256
// KiB, and a small one through ProgramBuilder::Collective) from direct to
// direct-read (the reductions; these accelerators share memory) or ring
// (the others), with correct results either side.
TEST_F(CollectiveTest, AutoSwitchesAtTheThreshold) {
  ASSERT_TRUE(MeshOf(4)->DevicesShareMemory()) << "lavapipe's VkDevices import each other's memory";
  Check(4, {.kind = kAllReduce, .shard = {65535}, .options = {.op = kSum, .algorithm = kAuto}}, 1);  // direct
  Check(4, {.kind = kAllReduce, .shard = {65536}, .options = {.op = kSum, .algorithm = kAuto}}, 2);  // direct-read
  for (CollectiveKind kind : {kAllReduce, kAllGather, kReduceScatter, kBroadcast}) {
    for (int64_t e : {12, 1000}) {  // 48 bytes: direct; 4000 bytes: direct-read or ring
      Check(4,
            {.kind = kind,
             .shard = {e},
             .options = {.op = kMax, .root = 3, .algorithm = kAuto, .ring_threshold_bytes = 64},
             .generic = true},
            3);
    }
  }
  Check(3, {.kind = kPermute, .shard = {1000}, .options = {.pairs = RingShift(3)}, .generic = true}, 4);
}

// --- refusals at Build ----------------------------------------------------------------

// Tests that reduce-scatter of a shard whose axis 0 is no multiple of the mesh
// size is refused at Build, naming the node.
TEST_F(CollectiveTest, ReduceScatterNeedsDivisibleShard) {
  for (auto [n, shard] : {std::pair<int, Shape>{3, {7}}, {2, {3, 4}}, {4, {6}}}) {
    SCOPED_TRACE(absl::StrCat(ShapeString(shard), " over ", n));
    ProgramBuilder b("uneven-scatter");
    b.Parameter("x", MeshOf(n), SplitShape(shard, n), DType::kF32, Sharding::Split(0));
    b.ReduceScatter("scatter", MeshOf(n), "x", "y");
    b.Output("y");
    EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "'scatter'");
  }
}

// Tests that a broadcast root outside the mesh is refused at Build, naming the node.
TEST_F(CollectiveTest, BroadcastRootOutOfRange) {
  for (int root : {4, 5, -1}) {
    SCOPED_TRACE(root);
    ProgramBuilder b("bad-root");
    b.Parameter("x", MeshOf(4), {4 * 8}, DType::kF32, Sharding::Split(0));
    b.Broadcast("spread", MeshOf(4), "x", "y", root);
    b.Output("y");
    EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "'spread'", "root");
  }
}

// Tests that permute pairs naming a position outside the mesh, or one target
// twice, are refused at Build, naming the node.
TEST_F(CollectiveTest, PermuteRefusesBadPairs) {
  const std::vector<std::vector<std::pair<int, int>>> bad = {
      {{0, 4}},          // target out of range
      {{4, 0}},          // source out of range
      {{-1, 2}},         // negative source
      {{0, -1}},         // negative target
      {{0, 2}, {1, 2}},  // target 2 twice
      {{0, 1}, {0, 1}},  // the same pair twice: target 1 twice
  };
  for (const auto& pairs : bad) {
    SCOPED_TRACE(PairsString(pairs));
    ProgramBuilder b("bad-pairs");
    b.Parameter("x", MeshOf(4), {4 * 8}, DType::kF32, Sharding::Split(0));
    b.CollectivePermute("shuffle", MeshOf(4), "x", "y", pairs);
    b.Output("y");
    EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "'shuffle'");
  }
}

// Tests that reductions of f16 are refused at Build naming the node and the
// dtype (InvalidArgument, or Unimplemented: a dtype a later version may add),
// while the same program in f32 builds.
TEST_F(CollectiveTest, ReductionOfF16IsRefused) {
  for (CollectiveKind kind : {kAllReduce, kReduceScatter}) {
    for (ReduceOp op : {kSum, kMax}) {
      for (DType dtype : {DType::kF16, DType::kF32}) {
        SCOPED_TRACE(absl::StrCat(KindName(kind), " ", op == kSum ? "sum " : "max ", DTypeName(dtype)));
        ProgramBuilder b("halves");
        b.Parameter("x", MeshOf(2), {2 * 8}, dtype, Sharding::Split(0));
        b.Collective("reduce", kind, MeshOf(2), "x", "y", {.op = op});
        b.Output("y");
        auto program = b.Build();
        if (dtype == DType::kF32) {
          EXPECT_OK(program.status());
          continue;
        }
        EXPECT_THAT(program.status().code(),
                    AnyOf(absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnimplemented))
            << program.status();
        EXPECT_THAT(std::string(program.status().message()), HasSubstr("'reduce'"));
        EXPECT_THAT(std::string(program.status().message()), HasSubstr("f16"));
      }
    }
  }
}

// --- runs ------------------------------------------------------------------------------

// Tests that a run whose input array was released is refused naming the
// parameter, that releasing an input right after Execute leaves the run
// correct (in-flight work keeps its buffers), and that the executable still runs.
TEST_F(CollectiveTest, ReleasedInputIsRefused) {
  const int n = 3;
  const int64_t e = 1000;
  auto mesh = MeshOf(n);
  ASSERT_NE(mesh, nullptr);
  ProgramBuilder b("released");
  b.Parameter("x", mesh, {n * e}, DType::kF32, Sharding::Split(0));
  b.AllReduce("sum", mesh, "x", "y", kSum, kRing);
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  auto input = [&](uint32_t seed, std::vector<std::vector<float>>* shards) -> ArrayRef {
    for (int p = 0; p < n; ++p) shards->push_back(reference::RandomFloats(e, seed + p));
    std::vector<float> flat = Concat(*shards);
    auto x = client_->CreateArray(mesh, {n * e}, DType::kF32, Sharding::Split(0), "gone");
    EXPECT_TRUE(x.ok()) << x.status();
    if (!x.ok()) return nullptr;
    EXPECT_OK((*x)->Upload(flat.data(), flat.size() * sizeof(float)));
    return *x;
  };

  std::vector<std::vector<float>> stale_shards;
  ArrayRef stale = input(10, &stale_shards);
  ASSERT_NE(stale, nullptr);
  stale->Release();
  EXPECT_ERROR(client_->Execute(exe, {stale}).status(), absl::StatusCode::kFailedPrecondition,
               "parameter 'x'", "'gone'", "released");

  std::vector<std::vector<float>> shards;
  ArrayRef x = input(20, &shards);
  ASSERT_NE(x, nullptr);
  ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
  x->Release();
  ASSERT_OK(run.Await(absl::Now() + kRunTimeout));
  CheckOutput<float>(*run.outputs[0], Reference(kAllReduce, {}, shards), true, true);

  std::vector<std::vector<float>> fresh_shards;
  ArrayRef fresh = input(30, &fresh_shards);
  ASSERT_NE(fresh, nullptr);
  ASSERT_OK_AND_ASSIGN(Execution again, client_->Execute(exe, {fresh}));
  ASSERT_OK(again.Await(absl::Now() + kRunTimeout));
  CheckOutput<float>(*again.outputs[0], Reference(kAllReduce, {}, fresh_shards), true, true);
}

// Tests that collectives chain with calls on the same mesh (a call's output
// in, a call on the output) and repeat: 20 runs with new inputs, all in
// flight together, each checked; every collective kind once per run, the
// reductions by ring and by direct-read.
TEST_F(CollectiveTest, CollectivesChainWithCallsAndRepeat) {
  for (auto [n, reduction] : {std::pair{3, kRing}, {4, kRing}, {3, kDirectRead}, {4, kDirectRead}}) {
    SCOPED_TRACE(absl::StrCat("mesh of ", n, ", reductions by ", CollectiveAlgorithmName(reduction)));
    auto mesh = MeshOf(n);
    ASSERT_NE(mesh, nullptr);
    const int64_t e = n * 1031;
    ASSERT_OK_AND_ASSIGN(auto triple, Function::Scale({e}, 3.0f));
    ASSERT_OK_AND_ASSIGN(auto halve, Function::Scale({e}, 0.5f));
    ASSERT_OK_AND_ASSIGN(auto twice, Function::Scale({e}, 2.0f));
    ASSERT_OK_AND_ASSIGN(auto negate, Function::Scale({e / n}, -1.0f));
    ProgramBuilder b("chain");
    b.Parameter("x", mesh, {n * e}, DType::kF32, Sharding::Split(0));
    b.Call("triple", triple, mesh, {"x"}, {"a"});                // a_p = 3 x_p
    b.AllReduce("sum", mesh, "a", "s", kSum, reduction);         // s = sum a_p
    b.Call("halve", halve, mesh, {"s"}, {"t"});                  // t = s / 2
    b.ReduceScatter("scatter", mesh, "a", "r", kMax, reduction);  // r_p = block p of max a
    b.Call("negate", negate, mesh, {"r"}, {"q"});                // q_p = -r_p
    b.AllGather("gather", mesh, "q", "g", kDirect);              // g = -max a
    b.Broadcast("bcast", mesh, "a", "c", n - 1, kRing);          // c = a_{n-1}
    b.CollectivePermute("shift", mesh, "a", "m", RingShift(n));  // m_p = a_{p-1}
    b.Call("double", twice, mesh, {"m"}, {"d"});                 // d_p = 2 a_{p-1}
    for (const char* out : {"t", "g", "c", "d"}) b.Output(out);
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    for (const ProgramStep& s : program->steps()) {
      EXPECT_NE(s.kind, ProgramStep::kTransfer) << "one mesh needs no transfers: " << program->DebugString();
    }
    for (const char* node : {"sum", "scatter", "gather", "bcast", "shift"}) {
      EXPECT_FALSE(PhasesOf(*program, node).empty()) << node << ": " << program->DebugString();
    }
    ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));

    constexpr int kRuns = 20;
    std::vector<Execution> runs;
    std::vector<std::vector<std::vector<float>>> inputs;  // [run][position]
    for (int r = 0; r < kRuns; ++r) {
      std::vector<std::vector<float>> shards;
      for (int p = 0; p < n; ++p) shards.push_back(reference::RandomFloats(e, 5000 + 100 * r + p));
      std::vector<float> flat = Concat(shards);
      ASSERT_OK_AND_ASSIGN(ArrayRef x,
                           client_->CreateArray(mesh, {n * e}, DType::kF32, Sharding::Split(0), "x"));
      ASSERT_OK(x->Upload(flat.data(), flat.size() * sizeof(float)));
      ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
      runs.push_back(std::move(run));
      inputs.push_back(std::move(shards));
    }
    for (int r = 0; r < kRuns; ++r) {
      SCOPED_TRACE(absl::StrCat("run ", r));
      ASSERT_OK(runs[r].Await(absl::Now() + kRunTimeout));
      ASSERT_EQ(runs[r].outputs.size(), 4u);
      std::vector<std::vector<float>> a = inputs[r];
      for (auto& shard : a) {
        for (float& v : shard) v = 3.0f * v;
      }
      std::vector<float> t = Reduce(a, kSum);
      for (float& v : t) v = 0.5f * v;
      std::vector<float> g = Reduce(a, kMax);
      for (float& v : g) v = -v;
      std::vector<std::vector<float>> d(n);
      for (int p = 0; p < n; ++p) {
        d[p] = a[(p + n - 1) % n];
        for (float& v : d[p]) v = 2.0f * v;
      }
      {
        SCOPED_TRACE("t = all-reduce sum, halved");
        CheckOutput<float>(*runs[r].outputs[0], std::vector<std::vector<float>>(n, t), true, true);
      }
      {
        SCOPED_TRACE("g = all-gather of negated reduce-scatter max");
        CheckOutput<float>(*runs[r].outputs[1], std::vector<std::vector<float>>(n, g), true, false);
      }
      {
        SCOPED_TRACE("c = broadcast from the last position");
        CheckOutput<float>(*runs[r].outputs[2], std::vector<std::vector<float>>(n, a[n - 1]), true, false);
      }
      {
        SCOPED_TRACE("d = ring shift, doubled");
        CheckOutput<float>(*runs[r].outputs[3], d, false, false);
      }
    }
  }
}

// Tests that a collective whose input lives on another mesh of the same
// shape moves it there first (a transfer step) and computes on its own mesh.
TEST_F(CollectiveTest, InputOnAnotherMeshIsMovedFirst) {
  const int n = 3;
  const int64_t e = 1000;
  auto home = MeshOf(n);
  ASSERT_NE(home, nullptr);
  ASSERT_OK_AND_ASSIGN(auto away, client_->AllocateMesh({n}));
  ASSERT_NE(AcceleratorIds(*rt_, *home), AcceleratorIds(*rt_, *away));
  ProgramBuilder b("moved");
  b.Parameter("x", home, {n * e}, DType::kF32, Sharding::Split(0));
  b.AllReduce("sum", away, "x", "y", kSum, kRing);
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  int transfers = 0;
  for (const ProgramStep& s : program->steps()) transfers += s.kind == ProgramStep::kTransfer;
  EXPECT_EQ(transfers, 1) << program->DebugString();
  for (const ProgramStep* s : PhasesOf(*program, "sum")) EXPECT_EQ(s->mesh, away) << s->node;
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  for (int r = 0; r < 2; ++r) {
    std::vector<std::vector<float>> shards;
    for (int p = 0; p < n; ++p) shards.push_back(reference::RandomFloats(e, 70 + 10 * r + p));
    std::vector<float> flat = Concat(shards);
    ASSERT_OK_AND_ASSIGN(ArrayRef x,
                         client_->CreateArray(home, {n * e}, DType::kF32, Sharding::Split(0), "x"));
    ASSERT_OK(x->Upload(flat.data(), flat.size() * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
    ASSERT_OK(run.Await(absl::Now() + kRunTimeout));
    ASSERT_EQ(run.outputs[0]->mesh(), away);
    CheckOutput<float>(*run.outputs[0], Reference(kAllReduce, {}, shards), true, true);
  }
}

// An all-reduce (sum, f32) program over `mesh` with `elements` per position.
struct AllReduceJob {
  std::shared_ptr<Mesh> mesh;
  int64_t elements = 0;
  std::shared_ptr<Executable> exe;
  CollectiveAlgorithm algorithm = kAuto;  // what was planned
};

absl::StatusOr<AllReduceJob> MakeAllReduceJob(Client& client, std::shared_ptr<Mesh> mesh, int64_t elements,
                                              CollectiveAlgorithm algorithm, const std::string& name) {
  AllReduceJob job{mesh, elements};
  const int n = mesh->size();
  ProgramBuilder b(name);
  b.Parameter("x", mesh, {n * elements}, DType::kF32, Sharding::Split(0));
  b.AllReduce("sum", mesh, "x", "y", kSum, algorithm);
  b.Output("y");
  CAUSEWAY_ASSIGN_OR_RETURN(auto program, b.Build());
  auto phases = PhasesOf(*program, "sum");
  if (phases.empty())
    return absl::InternalError(absl::StrCat("no collective steps: ", program->DebugString()));
  job.algorithm = phases[0]->collective->algorithm;
  CAUSEWAY_ASSIGN_OR_RETURN(job.exe, client.Load(program));
  return job;
}

// Tests that two clients, each on a thread of its own, running ring and
// direct-read (300000 floats a shard) and direct all-reduces on overlapping
// meshes of a 4-accelerator island (accelerators 0,1,2 and 1,2,3), 20 runs
// each at once, all finish (no deadlock) and are correct on every device.
TEST(CollectiveConcurrencyTest, OverlappingMeshesNeverDeadlock) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto a, island->Connect("a"));
  ASSERT_OK_AND_ASSIGN(auto b, island->Connect("b"));
  // Least-loaded placement: a takes 0,1,2; b's two spacers take 3, then 0
  // (the least-loaded, lowest index), so b's mesh is 1,2,3.
  ASSERT_OK_AND_ASSIGN(auto mesh_a, a->AllocateMesh({3}));
  ASSERT_OK_AND_ASSIGN(auto spacer3, b->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto spacer0, b->AllocateMesh({1}));
  ASSERT_OK_AND_ASSIGN(auto mesh_b, b->AllocateMesh({3}));
  ASSERT_EQ(AcceleratorIds(*rt, *mesh_a), (std::vector<int>{0, 1, 2})) << mesh_a->DebugString();
  ASSERT_EQ(AcceleratorIds(*rt, *mesh_b), (std::vector<int>{1, 2, 3})) << mesh_b->DebugString();

  constexpr int64_t kLarge = 300000, kSmall = 1000;
  std::vector<AllReduceJob> jobs_a, jobs_b;
  for (auto [client, mesh, jobs] : {std::tuple{a.get(), mesh_a, &jobs_a}, {b.get(), mesh_b, &jobs_b}}) {
    ASSERT_OK_AND_ASSIGN(AllReduceJob ring,
                         MakeAllReduceJob(*client, mesh, kLarge, kRing, client->name() + "-ring"));
    ASSERT_OK_AND_ASSIGN(AllReduceJob direct,
                         MakeAllReduceJob(*client, mesh, kSmall, kDirect, client->name() + "-direct"));
    ASSERT_OK_AND_ASSIGN(AllReduceJob direct_read,
                         MakeAllReduceJob(*client, mesh, kLarge, kDirectRead, client->name() + "-direct-read"));
    EXPECT_EQ(ring.algorithm, kRing);
    EXPECT_EQ(direct.algorithm, kDirect);
    EXPECT_EQ(direct_read.algorithm, kDirectRead);
    jobs->push_back(std::move(ring));
    jobs->push_back(std::move(direct));
    jobs->push_back(std::move(direct_read));
  }

  // Fewer under a sanitizer (sanitizers.h), still each client's three
  // executables with both of their runs in flight many times over.
  constexpr int kRuns = testing::Repeats(20, 10);
  auto stream = [&](Client& client, const std::vector<AllReduceJob>& jobs, uint32_t seed) {
    struct Pending {
      Execution run;
      std::vector<std::vector<float>> shards;
      std::string what;
    };
    std::deque<Pending> pending;
    auto check_front = [&] {
      Pending p = std::move(pending.front());
      pending.pop_front();
      SCOPED_TRACE(p.what);
      ASSERT_OK(p.run.Await(absl::Now() + kRunTimeout));
      CheckOutput<float>(*p.run.outputs[0], Reference(kAllReduce, {}, p.shards), true, true);
    };
    for (int r = 0; r < kRuns; ++r) {
      for (size_t j = 0; j < jobs.size(); ++j) {
        const AllReduceJob& job = jobs[j];
        const int n = job.mesh->size();
        Pending p;
        p.what = absl::StrCat(client.name(), " job ", j, " run ", r);
        for (int q = 0; q < n; ++q) {
          p.shards.push_back(reference::RandomFloats(job.elements, seed + 1000 * r + 100 * j + q));
        }
        std::vector<float> flat = Concat(p.shards);
        auto x = client.CreateArray(job.mesh, {n * job.elements}, DType::kF32, Sharding::Split(0), "x");
        ASSERT_TRUE(x.ok()) << p.what << ": " << x.status();
        ASSERT_OK((*x)->Upload(flat.data(), flat.size() * sizeof(float)));
        auto run = client.Execute(job.exe, {*x});
        ASSERT_TRUE(run.ok()) << p.what << ": " << run.status();
        p.run = *std::move(run);
        pending.push_back(std::move(p));
        // Keep a few runs in flight, and memory bounded.
        if (pending.size() > 4) check_front();
      }
    }
    while (!pending.empty()) check_front();
  };
  RunConcurrently({[&] { stream(*a, jobs_a, 1); }, [&] { stream(*b, jobs_b, 2); }}, absl::Seconds(90),
                  "two clients' all-reduces on overlapping meshes");
  for (Accelerator* acc : rt->accelerators()) EXPECT_OK(acc->Flush(absl::Now() + kRunTimeout));
}

// Tests that re-uploading a parameter while a direct-read reduce-scatter
// still has to read it in place from a peer waits for that read: accelerator
// 0 is kept busy by a long call on a mesh of its own, so its reduction (which
// reads every peer's input) runs well after the peers' own, after which
// those peers' shards are uploaded anew. Each run must see its own upload.
TEST(CollectiveConcurrencyTest, ReuploadWaitsForPendingDirectReads) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto client, island->Connect("reupload"));
  ASSERT_OK_AND_ASSIGN(auto mesh, client->AllocateMesh({4}));
  ASSERT_OK_AND_ASSIGN(auto solo, client->AllocateMesh({1}));  // the least loaded: accelerator 0
  ASSERT_EQ(AcceleratorIds(*rt, *mesh), (std::vector<int>{0, 1, 2, 3})) << mesh->DebugString();
  ASSERT_EQ(AcceleratorIds(*rt, *solo), (std::vector<int>{0})) << solo->DebugString();
  const int n = 4;
  const int64_t e = n * 1031;

  const Shape busy_shape = {512, 512};
  ASSERT_OK_AND_ASSIGN(auto repeated_add, Function::RepeatedAdd(busy_shape, 64));
  ProgramBuilder busy_builder("busy");
  busy_builder.Parameter("a", solo, busy_shape, DType::kF32);
  busy_builder.Parameter("b", solo, busy_shape, DType::kF32);
  busy_builder.Call("busy", repeated_add, solo, {"a", "b"}, {"s"});
  busy_builder.Output("s");
  ASSERT_OK_AND_ASSIGN(auto busy_program, busy_builder.Build());
  ASSERT_OK_AND_ASSIGN(auto busy, client->Load(busy_program));
  const std::vector<float> ones(NumElements(busy_shape), 1.0f);
  std::vector<ArrayRef> busy_inputs;
  for (const char* name : {"a", "b"}) {
    ASSERT_OK_AND_ASSIGN(ArrayRef in, client->CreateArray(solo, busy_shape, DType::kF32, Sharding::Replicated(), name));
    ASSERT_OK(in->Upload(ones.data(), ones.size() * sizeof(float)));
    busy_inputs.push_back(in);
  }

  ProgramBuilder b("scatter");
  b.Parameter("x", mesh, {n * e}, DType::kF32, Sharding::Split(0));
  b.ReduceScatter("scatter", mesh, "x", "y", kSum, kDirectRead);
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_EQ(PhasesOf(*program, "scatter").size(), 1u) << program->DebugString();
  ASSERT_EQ(PhasesOf(*program, "scatter")[0]->collective->algorithm, kDirectRead);
  ASSERT_OK_AND_ASSIGN(auto exe, client->Load(program));

  auto shards_of = [&](uint32_t seed) {
    std::vector<std::vector<float>> shards;
    for (int p = 0; p < n; ++p) shards.push_back(reference::RandomFloats(e, seed + p));
    return shards;
  };
  int pending_at_reupload = 0;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const std::vector<std::vector<float>> first = shards_of(100 * round + 10), second = shards_of(100 * round + 50);
    ASSERT_OK_AND_ASSIGN(ArrayRef x, client->CreateArray(mesh, {n * e}, DType::kF32, Sharding::Split(0), "x"));
    ASSERT_OK(x->Upload(Concat(first).data(), n * e * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(Execution held, client->Execute(busy, busy_inputs));
    ASSERT_OK_AND_ASSIGN(Execution run1, client->Execute(exe, {x}));
    // Dispatched (its reads registered), not yet run on accelerator 0.
    const absl::Time deadline = absl::Now() + kRunTimeout;
    while (!run1.state->dispatched() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_TRUE(run1.state->dispatched());
    const std::vector<Future<>> held_futures = held.state->futures();
    pending_at_reupload += !held_futures.empty() && !held_futures.back().IsReady();
    ASSERT_OK(x->Upload(Concat(second).data(), n * e * sizeof(float)));
    ASSERT_OK_AND_ASSIGN(Execution run2, client->Execute(exe, {x}));
    ASSERT_OK(held.Await(absl::Now() + kRunTimeout));
    ASSERT_OK(run1.Await(absl::Now() + kRunTimeout));
    ASSERT_OK(run2.Await(absl::Now() + kRunTimeout));
    {
      SCOPED_TRACE("run 1 reads the first upload");
      CheckOutput<float>(*run1.outputs[0], Reference(kReduceScatter, {}, first), false, true);
    }
    {
      SCOPED_TRACE("run 2 reads the second upload");
      CheckOutput<float>(*run2.outputs[0], Reference(kReduceScatter, {}, second), false, true);
    }
  }
  // Otherwise accelerator 0 read before the re-upload and nothing was tested.
  EXPECT_GT(pending_at_reupload, 0) << "accelerator 0 was never still busy when the input was re-uploaded";
}

// --- plans --------------------------------------------------------------------------------

// Tests that CollectiveOutputShard gives each kind's documented output shard,
// and refuses a reduce-scatter whose axis 0 does not divide.
TEST(CollectivePlanTest, OutputShards) {
  auto shape = [](CollectiveKind kind, int n, Shape shard) {
    auto s = CollectiveOutputShard(kind, n, shard);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Shape{};
  };
  EXPECT_EQ(shape(kAllReduce, 4, {7}), (Shape{7}));
  EXPECT_EQ(shape(kAllReduce, 3, {2, 5}), (Shape{2, 5}));
  EXPECT_EQ(shape(kAllGather, 4, {7}), (Shape{28}));
  EXPECT_EQ(shape(kAllGather, 3, {2, 5}), (Shape{6, 5}));
  EXPECT_EQ(shape(kReduceScatter, 4, {8, 3}), (Shape{2, 3}));
  EXPECT_EQ(shape(kReduceScatter, 1, {7}), (Shape{7}));
  EXPECT_EQ(shape(kBroadcast, 5, {7}), (Shape{7}));
  EXPECT_EQ(shape(kPermute, 5, {7, 2}), (Shape{7, 2}));
  EXPECT_EQ(CollectiveOutputShard(kReduceScatter, 3, {7}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CollectiveOutputShard(kReduceScatter, 2, {3, 4}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Tests that PlanCollective refuses what the header lists (a dtype it cannot
// reduce, an axis that does not divide, a root or pair out of range, a target
// twice, direct-read of a copy or without shared memory), and describes a
// plan as documented.
TEST(CollectivePlanTest, PlanRefusalsAndDescription) {
  auto plan = [](CollectiveKind kind, CollectiveOptions o, int n, Shape shard, DType dtype = DType::kF32,
                 bool shared_memory = true) {
    return PlanCollective(kind, o, n, shard, dtype, shared_memory).status();
  };
  constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_ERROR(plan(kAllReduce, {}, 4, {8}, DType::kF16), kInvalid,
               "all-reduce sum reduces f32 or i32, not f16");
  EXPECT_ERROR(plan(kReduceScatter, {.op = kMax}, 4, {8}, DType::kF16), kInvalid,
               "reduce-scatter max reduces f32 or i32, not f16");
  EXPECT_OK(plan(kAllGather, {}, 4, {7}, DType::kF16));
  EXPECT_OK(plan(kAllReduce, {}, 4, {7}, DType::kI32));
  EXPECT_ERROR(plan(kReduceScatter, {}, 3, {7}), kInvalid,
               "reduce-scatter splits axis 0 of each shard [7] over 3 devices: it must be a multiple of 3");
  EXPECT_ERROR(plan(kBroadcast, {.root = 4}, 4, {7}), kInvalid, "broadcast root 4 is outside the 4 devices");
  EXPECT_ERROR(plan(kBroadcast, {.root = -1}, 4, {7}), kInvalid,
               "broadcast root -1 is outside the 4 devices");
  EXPECT_ERROR(plan(kPermute, {.pairs = {{0, 4}}}, 4, {7}), kInvalid,
               "permute pair (0, 4) is outside the 4 devices");
  EXPECT_ERROR(plan(kPermute, {.pairs = {{4, 0}}}, 4, {7}), kInvalid,
               "permute pair (4, 0) is outside the 4 devices");
  EXPECT_ERROR(plan(kPermute, {.pairs = {{0, 2}, {1, 2}}}, 4, {7}), kInvalid,
               "permute names device 2 as a target twice");
  EXPECT_ERROR(plan(kPermute, {.algorithm = kRing}, 4, {7}), kInvalid, "permute has no ring algorithm");
  for (CollectiveKind kind : {kAllGather, kBroadcast, kPermute}) {
    SCOPED_TRACE(KindName(kind));
    const absl::Status s = plan(kind, {.algorithm = kDirectRead}, 4, {8});
    EXPECT_EQ(s.code(), kInvalid) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("direct-read"));
  }
  for (CollectiveKind kind : {kAllReduce, kReduceScatter}) {
    SCOPED_TRACE(KindName(kind));
    const absl::Status s = plan(kind, {.algorithm = kDirectRead}, 4, {8}, DType::kF32, /*shared_memory=*/false);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("cannot read each other's memory"));
    // One device has no peer to read: it copies its input.
    EXPECT_OK(plan(kind, {.algorithm = kDirectRead}, 1, {8}, DType::kF32, /*shared_memory=*/false));
  }

  ASSERT_OK_AND_ASSIGN(auto ring,
                       PlanCollective(kAllReduce, {.algorithm = kRing}, 4, {1000}, DType::kF32, true));
  EXPECT_EQ(ring->algorithm, kRing);
  EXPECT_EQ(ring->phases.size(), 6u);
  for (const char* part : {"all-reduce", "sum", "ring", "4 devices", "6 phases"}) {
    EXPECT_THAT(ring->ToString(), HasSubstr(part));
  }
  ASSERT_OK_AND_ASSIGN(auto direct,
                       PlanCollective(kAllReduce, {.algorithm = kDirect}, 4, {1000}, DType::kF32, true));
  EXPECT_EQ(direct->algorithm, kDirect);
  EXPECT_EQ(direct->phases.size(), 1u);
  ASSERT_OK_AND_ASSIGN(auto read,
                       PlanCollective(kAllReduce, {.algorithm = kDirectRead}, 4, {1000}, DType::kF32, true));
  EXPECT_EQ(read->algorithm, kDirectRead);
  EXPECT_THAT(read->ToString(), HasSubstr("all-reduce sum direct-read over 4 devices, 2 phases"));

  // kAuto from the threshold: direct-read where the devices share memory,
  // ring where they do not; direct below it.
  auto chosen = [](CollectiveKind kind, int64_t elements, bool shared_memory) {
    auto p = PlanCollective(kind, {.algorithm = kAuto, .ring_threshold_bytes = 4000}, 4, {elements}, DType::kF32,
                            shared_memory);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? (*p)->algorithm : kAuto;
  };
  for (CollectiveKind kind : {kAllReduce, kReduceScatter}) {
    SCOPED_TRACE(KindName(kind));
    EXPECT_EQ(chosen(kind, 996, true), kDirect);
    EXPECT_EQ(chosen(kind, 1000, true), kDirectRead);
    EXPECT_EQ(chosen(kind, 1000, false), kRing);
  }
  EXPECT_EQ(chosen(kAllGather, 1000, true), kRing);
  EXPECT_EQ(chosen(kBroadcast, 1000, true), kRing);
}

// Tests, on the host and for every mesh size from 1 to 8, that every plan
// (each kind, algorithm and op, uneven sizes) stays in bounds, never writes
// its input, has no two devices touching one buffer unordered by its waits,
// and computes the reference when its ops are carried out.
TEST(CollectivePlanTest, PlansComputeTheReferenceWithoutRaces) {
  int plans = 0;
  for (int n = 1; n <= 8; ++n) {
    for (CollectiveKind kind : {kAllReduce, kAllGather, kReduceScatter, kBroadcast, kPermute}) {
      std::vector<int64_t> sizes = kind == kReduceScatter ? std::vector<int64_t>{n, n * 13, n * 1031}
                                                          : std::vector<int64_t>{1, 7, 1000, 4099};
      std::vector<CollectiveOptions> variants;
      for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead, kAuto}) {
        if (kind == kPermute) break;
        if (algorithm == kDirectRead && !Reduces(kind)) continue;
        for (ReduceOp op : {kSum, kMax}) {
          if (!Reduces(kind) && op == kMax) continue;
          for (int root : {0, n - 1, n / 2}) {
            if (kind != kBroadcast && root != 0) continue;
            // kAuto with a small threshold: ring or direct-read from 1000 elements.
            variants.push_back({.op = op,
                                .root = root,
                                .algorithm = algorithm,
                                .ring_threshold_bytes = algorithm == kAuto ? 4000u : 256u << 10});
          }
        }
      }
      if (kind == kPermute) {
        std::vector<std::pair<int, int>> reverse;
        for (int p = 0; p < n; ++p) reverse.push_back({p, n - 1 - p});
        variants.push_back({.pairs = RingShift(n)});
        variants.push_back({.pairs = reverse});
        variants.push_back({.pairs = {{0, n - 1}}});
        variants.push_back({.pairs = {}});
      }
      for (const CollectiveOptions& o : variants) {
        for (int64_t e : sizes) {
          Case c{.kind = kind, .shard = {e}, .dtype = DType::kI32, .options = o};
          SCOPED_TRACE(c.ToString(n));
          auto planned = PlanCollective(kind, o, n, c.shard, DType::kI32, /*shared_memory=*/true);
          ASSERT_TRUE(planned.ok()) << planned.status();
          const CollectivePlan& plan = **planned;
          CheckPlan(plan, c, n, /*shared_memory=*/true);
          std::vector<std::vector<int64_t>> inputs;
          std::mt19937 gen(static_cast<uint32_t>(plans));
          std::uniform_int_distribution<int64_t> values(-1000, 1000);
          for (int p = 0; p < n; ++p) {
            inputs.emplace_back(e);
            for (int64_t& v : inputs.back()) v = values(gen);
          }
          auto got = Simulate(plan, inputs);
          ++plans;
          if (!got.ok()) {
            ADD_FAILURE() << plan.ToString() << ": " << got.status().message();
            continue;
          }
          std::vector<std::vector<int64_t>> want = Reference(kind, o, inputs);
          for (int p = 0; p < n; ++p) {
            EXPECT_EQ(Mismatch((*got)[p], want[p], false), "") << plan.ToString() << ", position " << p;
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 400);
}

}  // namespace
}  // namespace causeway
