// Collectives over one axis of a 2-D mesh, end to end: every kind over axis 0
// and axis 1 of 2x2, 2x3, 3x2 and 2x4 meshes against a CPU reference on every
// device, inputs split over the other mesh axis, a group of every device of a
// 2-D mesh (mesh_axis -1), the mesh axes that must be refused, and a 2-D
// all-reduce (axis 0, then axis 1) with runs in flight.
//
// Most cases write each device's input shard on its own, so every device
// holds distinct data (an array split over one mesh axis is otherwise the
// same along the other): a group that reads another group's devices shows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/collectives.h"
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

// Every wait in these tests ends by this much; a run not done by then is a hang.
constexpr absl::Duration kRunTimeout = absl::Seconds(20);

constexpr CollectiveKind kAllReduce = CollectiveKind::kAllReduce;
constexpr CollectiveKind kAllGather = CollectiveKind::kAllGather;
constexpr CollectiveKind kReduceScatter = CollectiveKind::kReduceScatter;
constexpr CollectiveKind kBroadcast = CollectiveKind::kBroadcast;
constexpr CollectiveKind kPermute = CollectiveKind::kPermute;
constexpr CollectiveAlgorithm kDirect = CollectiveAlgorithm::kDirect;
constexpr CollectiveAlgorithm kRing = CollectiveAlgorithm::kRing;
constexpr CollectiveAlgorithm kDirectRead = CollectiveAlgorithm::kDirectRead;
constexpr ReduceOp kSum = ReduceOp::kSum;
constexpr ReduceOp kMax = ReduceOp::kMax;

// Position p of a line of n sends to position p + shift (mod n).
std::vector<std::pair<int, int>> CyclicShift(int n, int shift) {
  std::vector<std::pair<int, int>> pairs;
  for (int p = 0; p < n; ++p) pairs.push_back({p, ((p + shift) % n + n) % n});
  return pairs;
}

// The devices of each group of a [rows, cols] mesh (row-major: device
// r*cols + c), in position order: over axis 0 one group per column, over
// axis 1 one per row, over -1 one group of every device.
std::vector<std::vector<int>> LinesOf(int rows, int cols, int axis) {
  std::vector<std::vector<int>> lines;
  if (axis < 0) {
    lines.emplace_back();
    for (int i = 0; i < rows * cols; ++i) lines[0].push_back(i);
    return lines;
  }
  const int count = axis == 0 ? cols : rows, length = axis == 0 ? rows : cols;
  for (int g = 0; g < count; ++g) {
    lines.emplace_back();
    for (int p = 0; p < length; ++p) lines.back().push_back(axis == 0 ? p * cols + g : g * cols + p);
  }
  return lines;
}

// Device i's coordinate along `axis` of a mesh with `cols` columns.
int CoordinateOf(int i, int cols, int axis) { return axis == 0 ? i / cols : i % cols; }

// --- CPU reference -------------------------------------------------------------------

// What each device holds after `kind` runs on every group of `lines` at once,
// device d having contributed `in[d]`.
template <typename T>
std::vector<std::vector<T>> Expected(CollectiveKind kind, const CollectiveOptions& o,
                                     const std::vector<std::vector<int>>& lines,
                                     const std::vector<std::vector<T>>& in) {
  std::vector<std::vector<T>> out(in.size());
  for (const std::vector<int>& line : lines) {
    std::vector<std::vector<T>> shards;
    for (int d : line) shards.push_back(in[d]);
    std::vector<std::vector<T>> got = Reference(kind, o, shards);
    for (size_t p = 0; p < line.size(); ++p) out[line[p]] = std::move(got[p]);
  }
  return out;
}

// --- device access --------------------------------------------------------------------

// Writes shards[d] into device d's shard of a fresh array `a`, whatever its
// sharding says the devices hold; runs reading `a` wait for the writes.
template <typename T>
absl::Status WriteShards(Array& a, const std::vector<std::vector<T>>& shards) {
  std::vector<Future<>> writes;
  a.BeginWrite();
  for (int d = 0; d < a.mesh()->size(); ++d) {
    auto buffer = a.shard(d);
    if (!buffer.ok() || shards[d].size() * sizeof(T) != a.shard_bytes()) {
      a.EndWrite({});
      return buffer.ok() ? absl::InvalidArgumentError("shard size") : buffer.status();
    }
    writes.push_back(a.mesh()->device(d)->Upload(*buffer, shards[d].data(), a.shard_bytes()));
  }
  a.EndWrite(std::move(writes));
  return absl::OkStatus();
}

// --- one collective on a 2-D mesh -------------------------------------------------------

// One collective node on a [rows, cols] mesh whose input is split along array
// axis 0 over mesh axis `split_axis`.
struct Case {
  CollectiveKind kind = kAllReduce;
  int64_t elements = 13;  // per input shard
  DType dtype = DType::kF32;
  CollectiveOptions options;  // options.mesh_axis: the collective's axis
  int split_axis = 0;
  // Each device's input shard written on its own (distinct on every device),
  // or the whole input uploaded (the same along the other mesh axis).
  bool distinct = true;

  std::string ToString(int rows, int cols) const {
    std::string s = absl::StrCat(CollectiveKindName(kind), " ");
    if (kind == kAllReduce || kind == kReduceScatter) absl::StrAppend(&s, ReduceOpName(options.op), " ");
    if (kind == kBroadcast) absl::StrAppend(&s, "root ", options.root, " ");
    if (kind == kPermute)
      absl::StrAppend(&s, options.pairs.size(), " pairs, 0->", options.pairs[0].second, " ");
    if (kind != kPermute) absl::StrAppend(&s, CollectiveAlgorithmName(options.algorithm), " ");
    absl::StrAppend(&s, DTypeName(dtype), "[", elements, "] per device over mesh axis ", options.mesh_axis,
                    " of ", rows, "x", cols, ", input split over mesh axis ", split_axis,
                    distinct ? ", distinct per device" : ", uploaded whole");
    return s;
  }
  bool tolerant() const {
    return (kind == kAllReduce || kind == kReduceScatter) && options.op == kSum && dtype == DType::kF32;
  }
};

constexpr char kNode[] = "coll";

// An 8-accelerator island (10 runs of an executable in flight) with one
// client, and one mesh per shape on demand.
class CollectiveMesh2DTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(8);
    ASSERT_NE(rt_, nullptr);
    IslandOptions options;
    options.runs_in_flight = 10;
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get(), options));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("mesh2d"));
  }
  void TearDown() override {
    meshes_.clear();
    client_.reset();
    island_.reset();
  }

  // The meshes to cover: 2x2, 2x3, 3x2, and 2x4 when there are 8 accelerators.
  std::vector<std::pair<int, int>> Shapes() const {
    std::vector<std::pair<int, int>> shapes = {{2, 2}, {2, 3}, {3, 2}};
    if (rt_->accelerators().size() >= 8) shapes.push_back({2, 4});
    return shapes;
  }

  std::shared_ptr<Mesh> MeshOf(std::vector<int> dims) {
    std::shared_ptr<Mesh>& mesh = meshes_[dims];
    if (mesh == nullptr) {
      auto m = client_->AllocateMesh(dims);
      EXPECT_TRUE(m.ok()) << m.status();
      if (m.ok()) mesh = *std::move(m);
    }
    return mesh;
  }

  // Builds a program of the one collective `c` on a [rows, cols] mesh, runs
  // it once and checks every device's output shard against the CPU reference
  // (computed from the groups of LinesOf), the output's shape and sharding,
  // that the members of a group agree bit for bit where the kind gives them
  // one result, that the input is unchanged, and, when the input was uploaded
  // whole, Array::Download. After a run that hangs, does nothing more.
  void Check(int rows, int cols, const Case& c, uint32_t seed) {
    if (hung_) return;
    SCOPED_TRACE(c.ToString(rows, cols));
    if (c.dtype == DType::kF32) {
      CheckTyped<float>(rows, cols, c, seed);
    } else {
      CheckTyped<int32_t>(rows, cols, c, seed);
    }
  }

  template <typename T>
  void CheckTyped(int rows, int cols, const Case& c, uint32_t seed) {
    const std::shared_ptr<Mesh> mesh = MeshOf({rows, cols});
    ASSERT_NE(mesh, nullptr);
    const int devices = rows * cols, axis = c.options.mesh_axis;
    const int n = axis < 0 ? devices : axis == 0 ? rows : cols;  // devices per group
    const int dims[2] = {rows, cols};
    const int64_t e = c.elements;
    const Sharding in_sharding = Sharding::Split(0, c.split_axis);
    const Shape in_shape = {dims[c.split_axis] * e};

    ProgramBuilder b(absl::StrCat(CollectiveKindName(c.kind), "-", rows, "x", cols));
    b.Parameter("x", mesh, in_shape, c.dtype, in_sharding);
    b.Collective(kNode, c.kind, mesh, "x", "y", c.options);
    b.Output("y");
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<const Program> program, b.Build());
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Executable> exe, client_->Load(program));

    // Device d's input shard.
    std::vector<std::vector<T>> in(devices);
    ASSERT_OK_AND_ASSIGN(ArrayRef x, client_->CreateArray(mesh, in_shape, c.dtype, in_sharding, "x"));
    if (c.distinct) {
      for (int d = 0; d < devices; ++d) in[d] = RandomValues<T>(e, seed * 100 + d);
      ASSERT_OK(WriteShards(*x, in));
    } else {
      std::vector<std::vector<T>> pieces;
      for (int j = 0; j < dims[c.split_axis]; ++j) pieces.push_back(RandomValues<T>(e, seed * 100 + j));
      for (int d = 0; d < devices; ++d) in[d] = pieces[CoordinateOf(d, cols, c.split_axis)];
      const std::vector<T> flat = Concat(pieces);
      ASSERT_OK(x->Upload(flat.data(), flat.size() * sizeof(T)));
    }
    ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
    const absl::Status done = run.Await(absl::Now() + kRunTimeout);
    if (absl::IsDeadlineExceeded(done)) {
      hung_ = true;
      FAIL() << "the run did not finish in " << kRunTimeout << "; skipping the remaining cases";
    }
    ASSERT_OK(done);
    ASSERT_EQ(run.outputs.size(), 1u);
    const Array& y = *run.outputs[0];

    // The sharding rules of ProgramBuilder::Collective.
    const bool across = axis >= 0 && c.split_axis == 1 - axis;
    Sharding want_sharding = across ? in_sharding : Sharding::Replicated();
    if (c.kind == kPermute) want_sharding = in_sharding;
    if (c.kind == kReduceScatter) want_sharding = Sharding::Split(0, axis);
    int64_t out_shard = c.kind == kAllGather ? n * e : c.kind == kReduceScatter ? e / n : e;
    const Shape want_shape = {want_sharding.replicated() ? out_shard
                                                         : out_shard * dims[want_sharding.mesh_axis]};
    EXPECT_TRUE(y.sharding() == want_sharding)
        << "got " << y.sharding().ToString() << ", want " << want_sharding.ToString();
    EXPECT_EQ(y.shape(), want_shape) << ShapeString(y.shape()) << " vs " << ShapeString(want_shape);
    EXPECT_EQ(y.dtype(), c.dtype);
    EXPECT_EQ(y.mesh(), mesh);
    ASSERT_EQ(y.shard_bytes(), static_cast<uint64_t>(out_shard) * sizeof(T));

    const std::vector<std::vector<int>> lines = LinesOf(rows, cols, axis);
    const std::vector<std::vector<T>> want = Expected(c.kind, c.options, lines, in);
    std::vector<std::vector<T>> got(devices);
    for (int d = 0; d < devices; ++d) {
      ASSERT_OK_AND_ASSIGN(got[d], ShardOf<T>(y, d));
      EXPECT_EQ(Mismatch(got[d], want[d], c.tolerant()), "")
          << "device " << d << " (row " << d / cols << ", column " << d % cols << ")";
    }
    if (c.kind == kAllReduce || c.kind == kAllGather || c.kind == kBroadcast) {
      for (const std::vector<int>& line : lines) {
        for (size_t p = 1; p < line.size(); ++p) {
          EXPECT_EQ(Mismatch(got[line[p]], got[line[0]], false), "")
              << "device " << line[p] << " differs from device " << line[0] << " of its group";
        }
      }
    }
    for (int d = 0; d < devices; ++d) {
      ASSERT_OK_AND_ASSIGN(std::vector<T> after, ShardOf<T>(*x, d));
      EXPECT_EQ(Mismatch(after, in[d], false), "") << "the collective changed device " << d << "'s input";
    }
    if (c.distinct) return;
    // Uploaded whole, the devices that the output's sharding says hold one
    // piece hold the same one, and Download gathers the pieces.
    const int pieces = want_sharding.replicated() ? 1 : dims[want_sharding.mesh_axis];
    std::vector<std::vector<T>> whole(pieces);
    for (int d = 0; d < devices; ++d) {
      const int j = want_sharding.replicated() ? 0 : CoordinateOf(d, cols, want_sharding.mesh_axis);
      if (whole[j].empty()) whole[j] = want[d];
      EXPECT_EQ(Mismatch(want[d], whole[j], false), "") << "device " << d << " vs piece " << j;
    }
    std::vector<T> downloaded(static_cast<size_t>(NumElements(y.shape())));
    ASSERT_OK(y.Download(downloaded.data(), downloaded.size() * sizeof(T)));
    EXPECT_EQ(Mismatch(downloaded, Concat(whole), c.tolerant()), "") << "Array::Download";
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;
  std::map<std::vector<int>, std::shared_ptr<Mesh>> meshes_;
  bool hung_ = false;
};

// --- every kind over one axis, input split over that axis ------------------------------

// Tests that all-reduce (sum and max, f32 and i32, direct, ring and
// direct-read, 13 and 1031 elements a shard) over axis 0 and over axis 1 of
// every mesh gives each device the reduction of its own group's shards,
// replicated.
TEST_F(CollectiveMesh2DTest, AllReduceOverEachAxis) {
  uint32_t seed = 1;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead}) {
        for (int64_t e : {13, 1031}) {
          for (auto [op, dtype] : {std::pair{kSum, DType::kF32},
                                   {kMax, DType::kF32},
                                   {kSum, DType::kI32},
                                   {kMax, DType::kI32}}) {
            // Under a sanitizer every third case: with 4 and 8 cases per
            // inner block, every value of every loop still comes round.
            if (!testing::InSweep(static_cast<int>(seed), 3)) {
              ++seed;
              continue;
            }
            Check(rows, cols,
                  {.kind = kAllReduce,
                   .elements = e,
                   .dtype = dtype,
                   .options = {.op = op, .algorithm = algorithm, .mesh_axis = axis},
                   .split_axis = axis},
                  seed++);
          }
        }
      }
    }
  }
}

// Tests that all-gather over each axis of every mesh gives each device its
// group's shards in position order (f32 and i32, direct and ring), replicated
// with n times the shard's length.
TEST_F(CollectiveMesh2DTest, AllGatherOverEachAxis) {
  uint32_t seed = 1000;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing}) {
        for (int64_t e : {13, 1031}) {
          for (DType dtype : {DType::kF32, DType::kI32}) {
            Check(rows, cols,
                  {.kind = kAllGather,
                   .elements = e,
                   .dtype = dtype,
                   .options = {.algorithm = algorithm, .mesh_axis = axis},
                   .split_axis = axis},
                  seed++);
          }
        }
      }
    }
  }
}

// Tests that reduce-scatter over each axis of every mesh gives the device at
// position p of a group block p of its group's reduction (sum f32, max i32,
// n*13 and n*1031 elements a shard, direct, ring and direct-read), split(0)
// over that axis.
TEST_F(CollectiveMesh2DTest, ReduceScatterOverEachAxis) {
  uint32_t seed = 2000;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      const int n = axis == 0 ? rows : cols;
      for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead}) {
        for (int64_t e : {n * 13, n * 1031}) {
          for (auto [op, dtype] : {std::pair{kSum, DType::kF32}, {kMax, DType::kI32}}) {
            if (!testing::InSweep(static_cast<int>(seed), 3)) {
              ++seed;
              continue;
            }
            Check(rows, cols,
                  {.kind = kReduceScatter,
                   .elements = e,
                   .dtype = dtype,
                   .options = {.op = op, .algorithm = algorithm, .mesh_axis = axis},
                   .split_axis = axis},
                  seed++);
          }
        }
      }
    }
  }
}

// Tests that broadcast over each axis of every mesh gives every device the
// shard of its group's root (position n-1 with direct, 1 with ring; never 0),
// replicated.
TEST_F(CollectiveMesh2DTest, BroadcastOverEachAxis) {
  uint32_t seed = 3000;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      const int n = axis == 0 ? rows : cols;
      for (CollectiveAlgorithm algorithm : {kDirect, kRing}) {
        for (int64_t e : {13, 1031}) {
          for (DType dtype : {DType::kF32, DType::kI32}) {
            Check(rows, cols,
                  {.kind = kBroadcast,
                   .elements = e,
                   .dtype = dtype,
                   .options = {.root = algorithm == kDirect ? n - 1 : 1,
                               .algorithm = algorithm,
                               .mesh_axis = axis},
                   .split_axis = axis},
                  seed++);
          }
        }
      }
    }
  }
}

// Tests that permute over each axis of every mesh with a cyclic shift of
// positions (+1 and -1) moves each shard to the next (previous) device of its
// own group, keeping the input's sharding.
TEST_F(CollectiveMesh2DTest, PermuteOverEachAxis) {
  uint32_t seed = 4000;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      const int n = axis == 0 ? rows : cols;
      for (int shift : {1, -1}) {
        for (int64_t e : {13, 1031}) {
          for (DType dtype : {DType::kF32, DType::kI32}) {
            Check(rows, cols,
                  {.kind = kPermute,
                   .elements = e,
                   .dtype = dtype,
                   .options = {.pairs = CyclicShift(n, shift), .mesh_axis = axis},
                   .split_axis = axis},
                  seed++);
          }
        }
      }
    }
  }
}

// --- input split over the other axis ----------------------------------------------------

// Tests that over axis a of an input uploaded split over the other mesh axis
// (so each line along a holds one piece), all-reduce (sum: n_a times the
// piece; max: the piece), all-gather (the piece n_a times) and broadcast keep
// the input's sharding, and Download gives the expected global array.
TEST_F(CollectiveMesh2DTest, InputSplitOverTheOtherAxisKeepsItsSharding) {
  uint32_t seed = 5000;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing}) {
        const int64_t e = algorithm == kDirect ? 13 : 1031;
        for (auto [op, dtype] : {std::pair{kSum, DType::kF32}, {kMax, DType::kF32}, {kSum, DType::kI32}}) {
          Check(rows, cols,
                {.kind = kAllReduce,
                 .elements = e,
                 .dtype = dtype,
                 .options = {.op = op, .algorithm = algorithm, .mesh_axis = axis},
                 .split_axis = 1 - axis,
                 .distinct = false},
                seed++);
        }
        for (CollectiveKind kind : {kAllGather, kBroadcast}) {
          Check(rows, cols,
                {.kind = kind,
                 .elements = e,
                 .options = {.root = 1, .algorithm = algorithm, .mesh_axis = axis},
                 .split_axis = 1 - axis,
                 .distinct = false},
                seed++);
        }
      }
    }
  }
}

// Tests that over axis a of an input split over the other axis whose devices
// all hold distinct data, all-reduce (each algorithm) still reduces within
// each line only.
TEST_F(CollectiveMesh2DTest, InputSplitOverTheOtherAxisReducesWithinLines) {
  uint32_t seed = 6000;
  for (auto [rows, cols] : Shapes()) {
    for (int axis : {0, 1}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing, kDirectRead}) {
        Check(rows, cols,
              {.kind = kAllReduce,
               .elements = 1031,
               .options = {.op = kSum, .algorithm = algorithm, .mesh_axis = axis},
               .split_axis = 1 - axis},
              seed++);
      }
    }
  }
}

// --- every device of a 2-D mesh ---------------------------------------------------------

// Tests that with mesh_axis -1 on a 2-D mesh all-reduce and all-gather run
// over every device in row-major order (input split over either axis,
// distinct per device), with a replicated output.
TEST_F(CollectiveMesh2DTest, EveryDeviceOfA2DMesh) {
  uint32_t seed = 7000;
  for (auto [rows, cols] : Shapes()) {
    for (int split_axis : {0, 1}) {
      for (CollectiveAlgorithm algorithm : {kDirect, kRing}) {
        for (int64_t e : {13, 1031}) {
          Check(rows, cols,
                {.kind = kAllReduce,
                 .elements = e,
                 .options = {.op = kSum, .algorithm = algorithm, .mesh_axis = -1},
                 .split_axis = split_axis},
                seed++);
          Check(rows, cols,
                {.kind = kAllReduce,
                 .elements = e,
                 .dtype = DType::kI32,
                 .options = {.op = kMax, .algorithm = algorithm, .mesh_axis = -1},
                 .split_axis = split_axis},
                seed++);
          Check(rows, cols,
                {.kind = kAllGather,
                 .elements = e,
                 .options = {.algorithm = algorithm, .mesh_axis = -1},
                 .split_axis = split_axis},
                seed++);
        }
      }
    }
  }
}

// --- refusals at Build ------------------------------------------------------------------

// Tests that reduce-scatter over every device of a 2-D mesh (mesh_axis -1)
// is refused as InvalidArgument naming the node, for input split over either
// axis or replicated.
TEST_F(CollectiveMesh2DTest, ReduceScatterOverBothAxesIsRefused) {
  auto grid = MeshOf({2, 2});
  ASSERT_NE(grid, nullptr);
  for (Sharding sharding : {Sharding::Split(0, 0), Sharding::Split(0, 1), Sharding::Replicated()}) {
    SCOPED_TRACE(sharding.ToString());
    ProgramBuilder b("scatter-all");
    b.Parameter("x", grid, {2 * 8}, DType::kF32, sharding);
    b.Collective("scatter", kReduceScatter, grid, "x", "y", {.mesh_axis = -1});
    b.Output("y");
    EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "'scatter'");
  }
}

// Tests that reduce-scatter over axis a of an input split over the other
// axis is refused as InvalidArgument naming the node, while the same input
// split over axis a builds.
TEST_F(CollectiveMesh2DTest, ReduceScatterOfInputSplitOverTheOtherAxisIsRefused) {
  auto grid = MeshOf({2, 3});
  ASSERT_NE(grid, nullptr);
  const int dims[2] = {2, 3};
  for (int axis : {0, 1}) {
    for (int split_axis : {0, 1}) {
      SCOPED_TRACE(absl::StrCat("over axis ", axis, ", input split over ", split_axis));
      ProgramBuilder b("scatter-across");
      b.Parameter("x", grid, {dims[split_axis] * 6}, DType::kF32, Sharding::Split(0, split_axis));
      b.Collective("scatter", kReduceScatter, grid, "x", "y", {.mesh_axis = axis});
      b.Output("y");
      if (split_axis == axis) {
        EXPECT_OK(b.Build().status());
      } else {
        EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "'scatter'");
      }
    }
  }
}

// Tests that a mesh_axis the mesh lacks (2 and -2 on a 2-D mesh, 1 on a 1-D
// mesh) is refused for every kind as InvalidArgument naming the node, while
// -1 and 0 on the 1-D mesh and 0 and 1 on the 2-D mesh build.
TEST_F(CollectiveMesh2DTest, MeshAxisTheMeshLacksIsRefused) {
  for (std::vector<int> dims : {std::vector<int>{2, 2}, std::vector<int>{4}}) {
    auto mesh = MeshOf(dims);
    ASSERT_NE(mesh, nullptr);
    const std::vector<int> bad = dims.size() == 2 ? std::vector<int>{2, -2} : std::vector<int>{1};
    const std::vector<int> good = dims.size() == 2 ? std::vector<int>{0, 1} : std::vector<int>{-1, 0};
    for (CollectiveKind kind : {kAllReduce, kAllGather, kReduceScatter, kBroadcast, kPermute}) {
      for (const std::vector<int>* axes : {&bad, &good}) {
        for (int axis : *axes) {
          SCOPED_TRACE(
              absl::StrCat(CollectiveKindName(kind), " over axis ", axis, " of ", mesh->DebugString()));
          // Split over the collective's axis, so that a reduce-scatter over axis 1 is allowed.
          const int split_axis = dims.size() == 2 && axis == 1 ? 1 : 0;
          ProgramBuilder b("mesh-axis");
          b.Parameter("x", mesh, {dims[split_axis] * 8}, DType::kF32, Sharding::Split(0, split_axis));
          b.Collective("axis-node", kind, mesh, "x", "y", {.pairs = {{0, 1}, {1, 0}}, .mesh_axis = axis});
          b.Output("y");
          if (axes == &good) {
            EXPECT_OK(b.Build().status());
          } else {
            EXPECT_ERROR(b.Build().status(), absl::StatusCode::kInvalidArgument, "'axis-node'");
          }
        }
      }
    }
  }
}

// --- chained, with runs in flight --------------------------------------------------------

// Tests the 2-D all-reduce of a DP x TP layout: an all-reduce over axis 0
// (ring) then one over axis 1 (direct) of a 2x4 mesh (2x2 with fewer
// accelerators), run 10 times with distinct per-device inputs before any is
// awaited; each run's result on every device is the sum over all devices,
// the same bits everywhere.
TEST_F(CollectiveMesh2DTest, AllReduceOverAxis0Then1WithRunsInFlight) {
  const int rows = 2, cols = rt_->accelerators().size() >= 8 ? 4 : 2, devices = rows * cols;
  const int64_t e = 1031;
  auto mesh = MeshOf({rows, cols});
  ASSERT_NE(mesh, nullptr);
  ProgramBuilder b("dp-tp");
  b.Parameter("x", mesh, {cols * e}, DType::kF32, Sharding::Split(0, 1));
  b.Collective("dp", kAllReduce, mesh, "x", "y", {.op = kSum, .algorithm = kRing, .mesh_axis = 0});
  b.Collective("tp", kAllReduce, mesh, "y", "z", {.op = kSum, .algorithm = kDirect, .mesh_axis = 1});
  b.Output("z");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  const int y = program->FindValue("y");
  ASSERT_GE(y, 0) << program->DebugString();
  EXPECT_TRUE(program->values()[y].sharding == Sharding::Split(0, 1))
      << program->values()[y].sharding.ToString();
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));

  constexpr int kRuns = 10;
  std::vector<Execution> runs;
  std::vector<std::vector<float>> sums;  // [run]
  for (int r = 0; r < kRuns; ++r) {
    std::vector<std::vector<float>> in;
    for (int d = 0; d < devices; ++d) in.push_back(reference::RandomFloats(e, 9000 + 100 * r + d));
    ASSERT_OK_AND_ASSIGN(ArrayRef x,
                         client_->CreateArray(mesh, {cols * e}, DType::kF32, Sharding::Split(0, 1), "x"));
    ASSERT_OK(WriteShards(*x, in));
    ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {x}));
    runs.push_back(std::move(run));
    sums.push_back(Reduce(in, kSum));
  }
  for (int r = 0; r < kRuns; ++r) {
    SCOPED_TRACE(absl::StrCat("run ", r));
    ASSERT_OK(runs[r].Await(absl::Now() + kRunTimeout));
    ASSERT_EQ(runs[r].outputs.size(), 1u);
    const Array& z = *runs[r].outputs[0];
    EXPECT_TRUE(z.sharding() == Sharding::Replicated()) << z.sharding().ToString();
    EXPECT_EQ(z.shape(), (Shape{e}));
    std::vector<float> first;
    for (int d = 0; d < devices; ++d) {
      ASSERT_OK_AND_ASSIGN(std::vector<float> got, ShardOf<float>(z, d));
      EXPECT_EQ(Mismatch(got, sums[r], true), "") << "device " << d;
      if (d == 0) first = got;
      EXPECT_EQ(Mismatch(got, first, false), "") << "device " << d << " differs from device 0";
    }
  }
}

}  // namespace
}  // namespace causeway
