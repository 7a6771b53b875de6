// Resharding end to end: every pair of (mesh, sharding) layouts round-trips
// bit for bit through a Reshard node (each plan also simulated on the host,
// each device's shard read back against a CPU slice), reshards within one
// mesh chained with calls, the implicit reshard in front of a call on a mesh
// of another shape, runs in flight together, the reshards Build refuses, and a
// parameter re-uploaded while a run still reads it.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"
#include "causeway/scheduler/transfer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::HasSubstr;

// Every wait in these tests ends by this much; a run not done by then is a hang.
constexpr absl::Duration kRunTimeout = absl::Seconds(20);

// --- CPU reference --------------------------------------------------------------------

// `count` elements of `elem` bytes, each a distinct bit pattern, and every
// element different for a different seed (so that a misplaced or stale
// element cannot go unnoticed).
std::vector<uint8_t> Pattern(int64_t count, size_t elem, uint32_t seed) {
  std::vector<uint8_t> out(count * elem);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t v = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u + 1;
    if (elem == 2) v = (static_cast<uint32_t>(i) + seed * 977u) & 0xffff;  // distinct below 65536 elements
    std::memcpy(out.data() + i * elem, &v, elem);
  }
  return out;
}

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<float> Scaled(std::vector<float> v, float alpha) {
  for (float& x : v) x *= alpha;
  return v;
}

// The coordinate along mesh axis `axis` of position `p` of a mesh of `dims`,
// positions in row-major order.
int Coordinate(const std::vector<int>& dims, int axis, int p) {
  int stride = 1;
  for (int k = static_cast<int>(dims.size()) - 1; k > axis; --k) stride *= dims[k];
  return (p / stride) % dims[axis];
}

// The shard that position `p` of a mesh of `dims` holds of the row-major
// array `global` (of `shape`, `elem`-byte elements) laid out by `sharding`,
// gathered element by element: the whole array when replicated, else block
// j of the split axis, j the position's coordinate along the split mesh
// axis (so on a 2-D mesh it is replicated along the other axis).
std::vector<uint8_t> CpuShard(const std::vector<uint8_t>& global, const Shape& shape, size_t elem,
                              const std::vector<int>& dims, const Sharding& sharding, int p) {
  Shape lo(shape.size(), 0), hi = shape;
  if (!sharding.replicated()) {
    const int a = sharding.array_axis;
    const int64_t part = shape[a] / dims[sharding.mesh_axis];
    lo[a] = Coordinate(dims, sharding.mesh_axis, p) * part;
    hi[a] = lo[a] + part;
  }
  std::vector<uint8_t> out;
  Shape at = lo;
  while (true) {
    int64_t flat = 0;
    for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + at[k];
    out.insert(out.end(), global.begin() + flat * elem, global.begin() + (flat + 1) * elem);
    int k = static_cast<int>(shape.size()) - 1;
    while (k >= 0 && ++at[k] == hi[k]) {
      at[k] = lo[k];
      --k;
    }
    if (k < 0) break;
  }
  return out;
}

// "" when equal, else where the first difference is.
std::string FirstMismatch(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, size_t elem) {
  if (got.size() != want.size()) return absl::StrCat("got ", got.size(), " bytes, want ", want.size());
  for (size_t i = 0; i < got.size(); i += elem) {
    if (std::memcmp(got.data() + i, want.data() + i, elem) != 0) {
      uint32_t g = 0, w = 0;
      std::memcpy(&g, got.data() + i, elem);
      std::memcpy(&w, want.data() + i, elem);
      int64_t wrong = 0;
      for (size_t j = 0; j < got.size(); j += elem) wrong += std::memcmp(got.data() + j, want.data() + j, elem) != 0;
      return absl::StrCat("element ", i / elem, " is 0x", absl::Hex(g), ", want 0x", absl::Hex(w), " (", wrong,
                          " of ", got.size() / elem, " elements wrong)");
    }
  }
  return "";
}

// Runs `plan` on the host: each target position's shard of `target_bytes`
// assembled from `sources` (the source positions' shards). Errors when a
// region leaves a shard, or a target byte is written twice or never.
absl::StatusOr<std::vector<std::vector<uint8_t>>> SimulatePlan(const TransferPlan& plan,
                                                               const std::vector<std::vector<uint8_t>>& sources,
                                                               uint64_t target_bytes) {
  std::vector<std::vector<uint8_t>> out;
  for (size_t t = 0; t < plan.pieces.size(); ++t) {
    std::vector<uint8_t> shard(target_bytes, 0);
    std::vector<int> writes(target_bytes, 0);
    for (const TransferPlan::Piece& piece : plan.pieces[t]) {
      if (piece.source < 0 || piece.source >= static_cast<int>(sources.size())) {
        return absl::InternalError(absl::StrCat("target ", t, " reads source position ", piece.source, " of ",
                                                sources.size()));
      }
      const std::vector<uint8_t>& src = sources[piece.source];
      for (const CommandList::CopyRegion& r : piece.regions) {
        if (r.size == 0 || r.src_offset + r.size > src.size() || r.dst_offset + r.size > target_bytes) {
          return absl::InternalError(absl::StrCat("target ", t, ": region of ", r.size, " bytes from ", r.src_offset,
                                                  " to ", r.dst_offset, " leaves shards of ", src.size(), " and ",
                                                  target_bytes, " bytes"));
        }
        for (uint64_t i = 0; i < r.size; ++i) {
          shard[r.dst_offset + i] = src[r.src_offset + i];
          writes[r.dst_offset + i]++;
        }
      }
    }
    for (uint64_t i = 0; i < target_bytes; ++i) {
      if (writes[i] != 1) {
        return absl::InternalError(absl::StrCat("target ", t, " byte ", i, " is written ", writes[i], " times"));
      }
    }
    out.push_back(std::move(shard));
  }
  return out;
}

// Checks the CPU reference against hand-written cases, so that the
// expectations below do not share a mistake with the code under test.
TEST(ReshardReferenceTest, CpuShardMatchesHandWrittenCases) {
  // [2, 3] of bytes 0..5 on a 2x3 mesh.
  const std::vector<uint8_t> host = {0, 1, 2, 3, 4, 5};
  EXPECT_EQ(Coordinate({2, 3}, 0, 4), 1);
  EXPECT_EQ(Coordinate({2, 3}, 1, 4), 1);
  EXPECT_EQ(Coordinate({3}, 0, 2), 2);
  // Position 4 is row 1, column 1 of the mesh.
  EXPECT_EQ(CpuShard(host, {2, 3}, 1, {2, 3}, Sharding::Split(0, 0), 4), (std::vector<uint8_t>{3, 4, 5}));
  EXPECT_EQ(CpuShard(host, {2, 3}, 1, {2, 3}, Sharding::Split(1, 1), 4), (std::vector<uint8_t>{1, 4}));
  EXPECT_EQ(CpuShard(host, {2, 3}, 1, {2, 3}, Sharding::Replicated(), 4), host);
  // [2, 2, 2] of 2-byte elements split along axis 2 over a line of 2:
  // position 1 holds the odd elements.
  const std::vector<uint8_t> halves = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
  EXPECT_EQ(CpuShard(halves, {2, 2, 2}, 2, {2}, Sharding::Split(2), 1),
            (std::vector<uint8_t>{1, 1, 3, 3, 5, 5, 7, 7}));
}

// --- Fixture ----------------------------------------------------------------------------

// Where and how an array lies.
struct Layout {
  std::shared_ptr<Mesh> mesh;
  Sharding sharding;
  std::string ToString() const { return absl::StrCat(sharding.ToString(), " on ", mesh->DebugString()); }
};

// An island of 6 accelerators with four meshes allocated once and shared by
// the tests: a line of 2, a line of 3, a 2x3 grid and a single device. They
// overlap (the grid spans the island), so reshards both stay on an
// accelerator and cross between them.
//
// Every test runs twice: with transfers as copies in the target devices'
// command lists, and with every transfer moved by the target devices' copy
// engines (whatever its size).
class ReshardTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(6);
    ASSERT_NE(rt_, nullptr);
    for (Accelerator* a : rt_->accelerators()) {
      if (GetParam()) {
        ASSERT_NE(a->copy_engine(), nullptr) << "lavapipe's device memory is host-coherent";
      }
      a->set_copy_engine_min_bytes(GetParam() ? 1 : UINT64_MAX);
    }
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get()));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("reshard"));
    ASSERT_OK_AND_ASSIGN(line2_, client_->AllocateMesh({2}));
    ASSERT_OK_AND_ASSIGN(line3_, client_->AllocateMesh({3}));
    ASSERT_OK_AND_ASSIGN(grid_, client_->AllocateMesh({2, 3}));
    ASSERT_OK_AND_ASSIGN(single_, client_->AllocateMesh({1}));
  }
  void TearDown() override {
    client_.reset();
    island_.reset();
  }

  // Copies the island's copy engines have made so far.
  uint64_t EngineCopies() const {
    uint64_t n = 0;
    for (Accelerator* a : rt_->accelerators()) n += a->copy_engine() == nullptr ? 0 : a->copy_engine()->copies();
    return n;
  }
  // Expects the engines to have moved transfers exactly when the test asks
  // for them.
  void ExpectEnginesUsedAsAsked() const {
    if (GetParam()) {
      EXPECT_GT(EngineCopies(), 0u);
    } else {
      EXPECT_EQ(EngineCopies(), 0u);
    }
  }

  // Replicated and every split of `shape` whose shard shape is valid, on each
  // of the four meshes.
  std::vector<Layout> Layouts(const Shape& shape) const {
    std::vector<Layout> out;
    for (const auto& mesh : {line2_, line3_, grid_, single_}) {
      out.push_back({mesh, Sharding::Replicated()});
      for (int a = 0; a < static_cast<int>(shape.size()); ++a) {
        for (int m = 0; m < static_cast<int>(mesh->dims().size()); ++m) {
          const Sharding s = Sharding::Split(a, m);
          const bool divides = shape[a] % mesh->dims()[m] == 0;
          EXPECT_EQ(ShardShape(shape, s, *mesh).ok(), divides) << s.ToString() << " on " << mesh->DebugString();
          if (ShardShape(shape, s, *mesh).ok()) out.push_back({mesh, s});
        }
      }
    }
    return out;
  }

  // A new array of `shape`/`dtype` laid out by `layout`, holding `host`.
  void Upload(const Layout& layout, const Shape& shape, DType dtype, const std::vector<uint8_t>& host,
              ArrayRef* out) {
    ASSERT_OK_AND_ASSIGN(*out, client_->CreateArray(layout.mesh, shape, dtype, layout.sharding, "x"));
    ASSERT_OK((*out)->Upload(host.data(), host.size()));
  }

  // Runs `exe` on `inputs` to completion.
  void Run(const std::shared_ptr<Executable>& exe, const std::vector<ArrayRef>& inputs, Execution* out) {
    ASSERT_OK_AND_ASSIGN(*out, client_->Execute(exe, inputs));
    ASSERT_OK(out->Await(absl::Now() + kRunTimeout));
  }

  // Expects `a` to hold the row-major array `want`: gathered as a whole, and
  // each device's buffer, read directly, holding its CPU slice.
  void ExpectHolds(const ArrayRef& a, const std::vector<uint8_t>& want) {
    const size_t elem = DTypeSize(a->dtype());
    std::vector<uint8_t> got(want.size(), 0xAB);
    ASSERT_OK(a->Download(got.data(), got.size()));
    EXPECT_EQ(FirstMismatch(got, want, elem), "") << "gathered " << a->label();
    ASSERT_OK(a->Await(absl::Now() + kRunTimeout));
    const Mesh& mesh = *a->mesh();
    for (int d = 0; d < mesh.size(); ++d) {
      std::vector<uint8_t> slice = CpuShard(want, a->shape(), elem, mesh.dims(), a->sharding(), d);
      ASSERT_EQ(slice.size(), a->shard_bytes());
      ASSERT_OK_AND_ASSIGN(auto buffer, a->shard(d));
      std::vector<uint8_t> shard(slice.size(), 0xCD);
      ASSERT_OK(mesh.device(d)->DownloadSync(buffer, shard.data(), shard.size()));
      EXPECT_EQ(FirstMismatch(shard, slice, elem), "") << a->label() << " on position " << d << " (accelerator "
                                                       << mesh.device(d)->index() << ")";
    }
  }

  // Reshards an array of `shape`/`dtype` from `from` to `to` by one Reshard
  // node: checks the lowering, the plan simulated on the host, the sources it
  // picks, and the result on the devices.
  void CheckPair(const Shape& shape, DType dtype, const Layout& from, const Layout& to, uint32_t seed) {
    const size_t elem = DTypeSize(dtype);
    ProgramBuilder b("reshard");
    b.Parameter("x", from.mesh, shape, dtype, from.sharding);
    b.Reshard("r", to.mesh, "x", "y", to.sharding);
    b.Output("y");
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    // Exactly the one transfer the node asks for, into the layout it names.
    ASSERT_EQ(program->steps().size(), 1u) << program->DebugString();
    const ProgramStep& step = program->steps()[0];
    ASSERT_EQ(step.kind, ProgramStep::kTransfer) << program->DebugString();
    EXPECT_EQ(step.node, "r");
    EXPECT_EQ(step.mesh, to.mesh);
    ASSERT_EQ(program->outputs().size(), 1u);
    const ProgramValue& y = program->values()[program->outputs()[0]];
    EXPECT_EQ(y.mesh, to.mesh);
    EXPECT_EQ(y.sharding, to.sharding);
    EXPECT_EQ(y.shape, shape);
    EXPECT_EQ(y.dtype, dtype);
    ASSERT_NE(step.transfer, nullptr);
    ASSERT_EQ(step.transfer->pieces.size(), static_cast<size_t>(to.mesh->size()));

    // The plan on the host: every target byte written once, with its value.
    const std::vector<uint8_t> host = Pattern(NumElements(shape), elem, seed);
    std::vector<std::vector<uint8_t>> sources;
    for (int p = 0; p < from.mesh->size(); ++p) {
      sources.push_back(CpuShard(host, shape, elem, from.mesh->dims(), from.sharding, p));
    }
    ASSERT_OK_AND_ASSIGN(Shape target_shard, ShardShape(shape, to.sharding, *to.mesh));
    ASSERT_OK_AND_ASSIGN(auto planned, SimulatePlan(*step.transfer, sources, NumElements(target_shard) * elem));
    for (int t = 0; t < to.mesh->size(); ++t) {
      EXPECT_EQ(FirstMismatch(planned[t], CpuShard(host, shape, elem, to.mesh->dims(), to.sharding, t), elem), "")
          << "the plan for target position " << t;
      // A piece held on the target's own accelerator is read from there.
      for (const TransferPlan::Piece& piece : step.transfer->pieces[t]) {
        for (int q = 0; q < from.mesh->size(); ++q) {
          const bool same_block =
              from.sharding.replicated() || Coordinate(from.mesh->dims(), from.sharding.mesh_axis, q) ==
                                                Coordinate(from.mesh->dims(), from.sharding.mesh_axis, piece.source);
          if (same_block && from.mesh->device(q) == to.mesh->device(t)) {
            EXPECT_EQ(from.mesh->device(piece.source), to.mesh->device(t))
                << "target position " << t << " reads source position " << piece.source
                << " from another accelerator though source position " << q << " holds the same block on its own";
          }
        }
      }
    }

    // On the devices.
    ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
    ArrayRef x;
    ASSERT_NO_FATAL_FAILURE(Upload(from, shape, dtype, host, &x));
    Execution run;
    ASSERT_NO_FATAL_FAILURE(Run(exe, {x}, &run));
    ASSERT_EQ(run.outputs.size(), 1u);
    EXPECT_EQ(run.outputs[0]->sharding(), to.sharding);
    EXPECT_EQ(run.outputs[0]->mesh(), to.mesh);
    ExpectHolds(run.outputs[0], host);
    // The source is left as it was.
    ExpectHolds(x, host);
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;
  std::shared_ptr<Mesh> line2_, line3_, grid_, single_;
};

// --- Tests ------------------------------------------------------------------------------

// Tests that every pair of layouts (4 meshes x replicated and each even split)
// reshards f32 [12, 8] and i32/f16 [6, 4, 10] bit for bit, on every device.
TEST_P(ReshardTest, EveryPairOfLayoutsRoundTrips) {
  struct Case {
    Shape shape;
    DType dtype;
    size_t layouts;  // counted by hand from the mesh sizes
  };
  const Case cases[] = {{{12, 8}, DType::kF32, 12}, {{6, 4, 10}, DType::kI32, 15}, {{6, 4, 10}, DType::kF16, 15}};
  uint32_t seed = 0;
  for (const Case& c : cases) {
    const std::vector<Layout> layouts = Layouts(c.shape);
    EXPECT_EQ(layouts.size(), c.layouts) << ShapeString(c.shape);
    for (const Layout& from : layouts) {
      for (const Layout& to : layouts) {
        SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), ShapeString(c.shape), " from ", from.ToString(), " to ",
                                  to.ToString()));
        CheckPair(c.shape, c.dtype, from, to, ++seed);
      }
    }
  }
  EXPECT_EQ(seed, 12u * 12u + 2u * 15u * 15u);
  ExpectEnginesUsedAsAsked();
}

// Tests that within one mesh split -> replicated, replicated -> split,
// split(0) -> split(1) and split(1) -> split(0), chained with calls, give the
// CPU reference on every device, with no transfer but the four asked for.
TEST_P(ReshardTest, ReshardsWithinOneMesh) {
  struct Case {
    std::shared_ptr<Mesh> mesh;
    Sharding rows, cols;
  };
  const Case cases[] = {{line3_, Sharding::Split(0), Sharding::Split(1)},
                        {grid_, Sharding::Split(0, 0), Sharding::Split(1, 1)},
                        {grid_, Sharding::Split(0, 1), Sharding::Split(1, 0)}};
  const Shape shape = {12, 6};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("rows ", c.rows.ToString(), ", columns ", c.cols.ToString(), " on ",
                              c.mesh->DebugString()));
    ASSERT_OK_AND_ASSIGN(Shape rows_shard, ShardShape(shape, c.rows, *c.mesh));
    ASSERT_OK_AND_ASSIGN(Shape cols_shard, ShardShape(shape, c.cols, *c.mesh));
    ASSERT_OK_AND_ASSIGN(auto twice, Function::Scale(rows_shard, 2.0f));
    ASSERT_OK_AND_ASSIGN(auto times4, Function::Scale(shape, 4.0f));
    ASSERT_OK_AND_ASSIGN(auto half, Function::Scale(rows_shard, 0.5f));
    ASSERT_OK_AND_ASSIGN(auto add, Function::Elementwise("add", cols_shard));
    ProgramBuilder b("same-mesh");
    b.Parameter("x", c.mesh, shape, DType::kF32, c.rows);
    b.Call("double", twice, c.mesh, {"x"}, {"d"});                     // 2x
    b.Reshard("rows-to-all", c.mesh, "d", "all", Sharding::Replicated());  // 2x
    b.Call("times4", times4, c.mesh, {"all"}, {"all8"});                // 8x
    // Each device's columns from its own copy of a value made in the same
    // gang call.
    b.Reshard("all-to-cols", c.mesh, "all8", "cols8", c.cols);            // 8x
    b.Reshard("rows-to-cols", c.mesh, "d", "cols", c.cols);               // 2x
    b.Call("add", add, c.mesh, {"cols", "cols8"}, {"sum"});               // 10x
    b.Reshard("cols-to-rows", c.mesh, "sum", "back", c.rows);             // 10x
    b.Call("halve", half, c.mesh, {"back"}, {"out"});                   // 5x
    for (const char* out : {"all", "cols8", "cols", "sum", "out"}) b.Output(out);
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    std::vector<std::string> transfers;
    for (const ProgramStep& s : program->steps()) {
      EXPECT_EQ(s.mesh, c.mesh) << s.node;
      if (s.kind == ProgramStep::kTransfer) transfers.push_back(s.node);
    }
    EXPECT_THAT(transfers, ::testing::UnorderedElementsAre("rows-to-all", "all-to-cols", "rows-to-cols",
                                                           "cols-to-rows"))
        << program->DebugString();
    EXPECT_EQ(program->values()[program->FindValue("all8")].sharding, Sharding::Replicated());
    EXPECT_EQ(program->values()[program->FindValue("sum")].sharding, c.cols);
    EXPECT_EQ(program->values()[program->FindValue("out")].sharding, c.rows);

    ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE(absl::StrCat("run ", r));
      const std::vector<float> x = reference::RandomFloats(NumElements(shape), 100 + r);
      ArrayRef xa;
      ASSERT_NO_FATAL_FAILURE(Upload({c.mesh, c.rows}, shape, DType::kF32, Bytes(x), &xa));
      Execution run;
      ASSERT_NO_FATAL_FAILURE(Run(exe, {xa}, &run));
      ASSERT_EQ(run.outputs.size(), 5u);
      // Each value is one rounding of the same f32 operations as on the
      // device, so the results are exact.
      std::vector<float> two = Scaled(x, 2), eight = Scaled(two, 4), ten(x.size()), five(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        ten[i] = two[i] + eight[i];
        five[i] = ten[i] * 0.5f;
      }
      ExpectHolds(run.outputs[0], Bytes(two));
      ExpectHolds(run.outputs[1], Bytes(eight));
      ExpectHolds(run.outputs[2], Bytes(two));
      ExpectHolds(run.outputs[3], Bytes(ten));
      ExpectHolds(run.outputs[4], Bytes(five));
    }
  }
}

// Tests that a call on a mesh of another shape gets one implicit transfer
// that reshards its input to what the function takes (a split over the grid's
// second axis, replicated, or the input's own split when that fits).
TEST_P(ReshardTest, CallOnOtherMeshShapeReshardsImplicitly) {
  const Shape shape = {4, 6};
  struct Case {
    Shape function_shard;
    Sharding want;
  };
  const Case cases[] = {{{4, 2}, Sharding::Split(1, 1)}, {{4, 6}, Sharding::Replicated()},
                        {{2, 6}, Sharding::Split(0, 0)}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("function takes ", ShapeString(c.function_shard)));
    ASSERT_OK_AND_ASSIGN(auto twice, Function::Scale(c.function_shard, 2.0f));
    ProgramBuilder b("implicit");
    b.Parameter("x", line2_, shape, DType::kF32, Sharding::Split(0));
    b.Call("double", twice, grid_, {"x"}, {"y"});
    b.Output("y");
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    const std::string debug = program->DebugString();
    ASSERT_EQ(program->steps().size(), 2u) << debug;
    EXPECT_EQ(program->steps()[0].kind, ProgramStep::kTransfer) << debug;
    EXPECT_EQ(program->steps()[0].mesh, grid_);
    EXPECT_EQ(program->values()[program->steps()[0].outputs[0]].sharding, c.want) << debug;
    EXPECT_EQ(program->steps()[1].kind, ProgramStep::kCall) << debug;
    int transfer_lines = 0;
    for (size_t at = debug.find("  transfer "); at != std::string::npos; at = debug.find("  transfer ", at + 1)) {
      ++transfer_lines;
    }
    EXPECT_EQ(transfer_lines, 1) << debug;
    EXPECT_EQ(program->values()[program->FindValue("y")].sharding, c.want);

    ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(absl::StrCat("run ", r));
      const std::vector<float> x = reference::RandomFloats(NumElements(shape), 200 + r);
      ArrayRef xa;
      ASSERT_NO_FATAL_FAILURE(Upload({line2_, Sharding::Split(0)}, shape, DType::kF32, Bytes(x), &xa));
      Execution run;
      ASSERT_NO_FATAL_FAILURE(Run(exe, {xa}, &run));
      ASSERT_EQ(run.outputs.size(), 1u);
      EXPECT_EQ(run.outputs[0]->sharding(), c.want);
      ExpectHolds(run.outputs[0], Bytes(Scaled(x, 2)));
    }
  }
}

// Tests that ten runs of a resharding program, each on a new upload and all
// in flight together, each give their own right answer.
TEST_P(ReshardTest, RunsInFlightTogetherEachGetTheirAnswer) {
  const Shape shape = {12, 8};
  ASSERT_OK_AND_ASSIGN(auto twice, Function::Scale({4, 8}, 2.0f));
  ASSERT_OK_AND_ASSIGN(auto negate, Function::Scale({12, 8}, -1.0f));
  ProgramBuilder b("repeat");
  b.Parameter("x", line2_, shape, DType::kF32, Sharding::Split(0));
  // Implicitly resharded to split(0) over the grid's second axis.
  b.Call("double", twice, grid_, {"x"}, {"y"});
  b.Reshard("to-line3", line3_, "y", "z", Sharding::Replicated());
  b.Call("negate", negate, line3_, {"z"}, {"w"});
  b.Reshard("gather", single_, "y", "g", Sharding::Replicated());
  b.Output("w");
  b.Output("g");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  int transfers = 0;
  for (const ProgramStep& s : program->steps()) transfers += s.kind == ProgramStep::kTransfer;
  EXPECT_EQ(transfers, 3) << program->DebugString();
  EXPECT_EQ(program->values()[program->FindValue("y")].sharding, Sharding::Split(0, 1)) << program->DebugString();
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));

  constexpr int kRuns = 10;
  std::vector<std::vector<float>> xs;
  std::vector<ArrayRef> inputs;
  std::vector<Execution> runs;
  for (int r = 0; r < kRuns; ++r) {
    xs.push_back(reference::RandomFloats(NumElements(shape), 300 + r));
    ArrayRef xa;
    ASSERT_NO_FATAL_FAILURE(Upload({line2_, Sharding::Split(0)}, shape, DType::kF32, Bytes(xs.back()), &xa));
    inputs.push_back(xa);
    ASSERT_OK_AND_ASSIGN(Execution run, client_->Execute(exe, {xa}));
    runs.push_back(std::move(run));
  }
  for (int r = 0; r < kRuns; ++r) {
    SCOPED_TRACE(absl::StrCat("run ", r));
    ASSERT_OK(runs[r].Await(absl::Now() + kRunTimeout));
    ASSERT_EQ(runs[r].outputs.size(), 2u);
    ExpectHolds(runs[r].outputs[0], Bytes(Scaled(xs[r], -2)));
    ExpectHolds(runs[r].outputs[1], Bytes(Scaled(xs[r], 2)));
  }
  ExpectEnginesUsedAsAsked();
}

// Tests that Build refuses a Reshard to a layout that does not fit the array
// or the mesh, with InvalidArgument naming the node and what is wrong.
TEST_P(ReshardTest, BuildRefusesReshardsThatDoNotFit) {
  struct Case {
    std::string node;
    std::shared_ptr<Mesh> mesh;
    Sharding sharding;
    std::string why;
  };
  const Case cases[] = {
      {"uneven", line3_, Sharding::Split(1), "does not split evenly into 3"},
      {"no-array-axis", line2_, Sharding::Split(2), "has no axis 2"},
      {"no-mesh-axis", line2_, Sharding::Split(0, 1), "has no axis 1"},
      {"uneven-on-grid", grid_, Sharding::Split(1, 1), "does not split evenly into 3"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.node);
    ProgramBuilder b("bad");
    b.Parameter("x", line2_, {12, 8}, DType::kF32, Sharding::Split(0));
    b.Reshard(c.node, c.mesh, "x", "y", c.sharding);
    b.Output("y");
    absl::Status status = b.Build().status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("node '", c.node, "'")));
    EXPECT_THAT(std::string(status.message()), HasSubstr("'x'"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.why));
  }
}

// Tests that a transfer from a released array, or from another client's
// array, is refused before anything is dispatched, naming the parameter and
// why; and that the executable then runs correctly with the client's own.
TEST_P(ReshardTest, TransferFromReleasedOrForeignArrayIsRefused) {
  const Shape shape = {12, 8};
  const Layout from{line2_, Sharding::Split(0)};
  ProgramBuilder b("move");
  b.Parameter("x", from.mesh, shape, DType::kF32, from.sharding);
  b.Reshard("r", line3_, "x", "y", Sharding::Split(0));
  b.Output("y");
  ASSERT_OK_AND_ASSIGN(auto program, b.Build());
  ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
  const std::vector<uint8_t> bytes = Pattern(NumElements(shape), 4, 3);

  ArrayRef released;
  ASSERT_NO_FATAL_FAILURE(Upload(from, shape, DType::kF32, bytes, &released));
  released->Release();
  absl::StatusOr<Execution> run = client_->Execute(exe, {released});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition) << run.status();
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("parameter 'x'"));
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("was released"));

  ASSERT_OK_AND_ASSIGN(auto other, island_->Connect("other"));
  ASSERT_OK_AND_ASSIGN(auto other_mesh, other->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(ArrayRef foreign, other->CreateArray(other_mesh, shape, DType::kF32, from.sharding, "theirs"));
  ASSERT_OK(foreign->Upload(bytes.data(), bytes.size()));
  run = client_->Execute(exe, {foreign});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kPermissionDenied) << run.status();
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("parameter 'x'"));
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("belongs to another client"));

  ArrayRef own;
  ASSERT_NO_FATAL_FAILURE(Upload(from, shape, DType::kF32, bytes, &own));
  ASSERT_OK_AND_ASSIGN(Execution good, client_->Execute(exe, {own}));
  ASSERT_OK(good.Await(absl::Now() + kRunTimeout));
  ExpectHolds(good.outputs[0], bytes);
}

// Tests that re-uploading a parameter right after a run that reshards it was
// queued waits for the run's reads: each run sees its own upload.
TEST_P(ReshardTest, ReuploadWaitsForTheRunReadingIt) {
  const Shape shape = {12, 8};
  // Work queued ahead of the transfer on the target devices keeps the run's
  // reads pending while the second upload is issued, microseconds after the
  // run is: a few milliseconds of it is plenty. (With every accelerator on
  // one VkDevice, as the ASan suite runs this, lavapipe runs the five
  // devices' work on one set of threads: 64 adds took seconds a case there,
  // past the runs' deadline on a loaded machine.)
  const Shape busy_shape = {512, 512};
  constexpr int kBusyAdds = 16;
  ASSERT_OK_AND_ASSIGN(auto busy, Function::RepeatedAdd(busy_shape, kBusyAdds));
  struct Case {
    Layout from, to;
  };
  const Case cases[] = {
      {{line2_, Sharding::Split(0)}, {line3_, Sharding::Split(0)}},
      {{line2_, Sharding::Replicated()}, {line3_, Sharding::Split(0)}},
      {{line3_, Sharding::Split(0)}, {line3_, Sharding::Replicated()}},
      {{grid_, Sharding::Split(1, 0)}, {single_, Sharding::Replicated()}},
  };
  int pending_at_reupload = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("from ", c.from.ToString(), " to ", c.to.ToString()));
    ProgramBuilder b("reupload");
    b.Parameter("x", c.from.mesh, shape, DType::kF32, c.from.sharding);
    b.Parameter("a", c.to.mesh, busy_shape, DType::kF32);
    b.Parameter("b", c.to.mesh, busy_shape, DType::kF32);
    b.Call("busy", busy, c.to.mesh, {"a", "b"}, {"s"});
    b.Reshard("r", c.to.mesh, "x", "y", c.to.sharding);
    b.Output("s");
    b.Output("y");
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    ASSERT_EQ(program->steps().size(), 2u) << program->DebugString();
    ASSERT_EQ(program->steps()[0].node, "busy") << program->DebugString();
    ASSERT_OK_AND_ASSIGN(auto exe, client_->Load(program));
    const std::vector<float> ones(NumElements(busy_shape), 1.0f);
    ArrayRef a, bb;
    ASSERT_NO_FATAL_FAILURE(Upload({c.to.mesh, Sharding::Replicated()}, busy_shape, DType::kF32, Bytes(ones), &a));
    ASSERT_NO_FATAL_FAILURE(Upload({c.to.mesh, Sharding::Replicated()}, busy_shape, DType::kF32, Bytes(ones), &bb));

    const std::vector<uint8_t> first = Pattern(NumElements(shape), 4, 1), second = Pattern(NumElements(shape), 4, 2);
    ArrayRef x;
    ASSERT_NO_FATAL_FAILURE(Upload(c.from, shape, DType::kF32, first, &x));
    ASSERT_OK_AND_ASSIGN(Execution run1, client_->Execute(exe, {x, a, bb}));
    const std::vector<Future<>> run1_futures = run1.state->futures();
    pending_at_reupload += !run1_futures.empty() && !run1_futures.back().IsReady();
    ASSERT_OK(x->Upload(second.data(), second.size()));
    ASSERT_OK_AND_ASSIGN(Execution run2, client_->Execute(exe, {x, a, bb}));
    ASSERT_OK(run1.Await(absl::Now() + kRunTimeout));
    ASSERT_OK(run2.Await(absl::Now() + kRunTimeout));
    {
      SCOPED_TRACE("run 1");
      ExpectHolds(run1.outputs[1], first);
    }
    {
      SCOPED_TRACE("run 2");
      ExpectHolds(run2.outputs[1], second);
    }
    // The busy work itself: a + kBusyAdds * b.
    const std::vector<float> sum(NumElements(busy_shape), 1.0f + kBusyAdds);
    ExpectHolds(run2.outputs[0], Bytes(sum));
  }
  // Otherwise the runs ended before the re-upload and nothing was tested.
  EXPECT_GT(pending_at_reupload, 0) << "no run was still reading when its parameter was re-uploaded";
}

// Tests that closing a client while its resharding runs stream (transfers
// waiting to be copied, copying, and consumed) leaves another client's runs
// on the same devices correct, and gives back all of its memory.
TEST_P(ReshardTest, ClosingAClientWithTransfersInFlightLeavesTheOtherCorrect) {
  const Shape shape = {1024, 512};  // 2 MiB: the copies take a while
  ASSERT_OK_AND_ASSIGN(auto twice, Function::Scale({1024, 512}, 2.0f));
  auto make = [&](Client& c, std::shared_ptr<Mesh> from, std::shared_ptr<Mesh> to, ArrayRef* x,
                  std::shared_ptr<Executable>* exe, std::vector<float>* host) {
    ProgramBuilder b("stream");
    b.Parameter("x", from, shape, DType::kF32, Sharding::Split(0));
    b.Reshard("move", to, "x", "y", Sharding::Replicated());
    b.Call("double", twice, to, {"y"}, {"z"});
    b.Output("z");
    ASSERT_OK_AND_ASSIGN(auto program, b.Build());
    ASSERT_OK_AND_ASSIGN(*exe, c.Load(program));
    *host = reference::RandomFloats(NumElements(shape), 77);
    ASSERT_OK_AND_ASSIGN(*x, c.CreateArray(from, shape, DType::kF32, Sharding::Split(0), "x"));
    ASSERT_OK((*x)->Upload(host->data(), host->size() * 4));
  };
  ASSERT_OK_AND_ASSIGN(auto other, island_->Connect("closing"));
  ASSERT_OK_AND_ASSIGN(auto other_from, other->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(auto other_to, other->AllocateMesh({1}));
  ArrayRef ox, mx;
  std::shared_ptr<Executable> oexe, mexe;
  std::vector<float> ohost, mhost;
  ASSERT_NO_FATAL_FAILURE(make(*other, other_from, other_to, &ox, &oexe, &ohost));
  ASSERT_NO_FATAL_FAILURE(make(*client_, line2_, single_, &mx, &mexe, &mhost));
  uint64_t before = 0;
  for (Accelerator* a : rt_->accelerators()) before += a->memory_in_use();
  const uint64_t other_held = other->bytes_held();

  std::vector<Execution> mine;
  for (int r = 0; r < 12; ++r) {
    if (r <= 8) {
      ASSERT_OK_AND_ASSIGN(Execution o, other->Execute(oexe, {ox}));
    }
    ASSERT_OK_AND_ASSIGN(Execution m, client_->Execute(mexe, {mx}));
    mine.push_back(std::move(m));
    if (r == 8) other->Close();  // with runs of its queued and in flight
  }
  const std::vector<float> want = Scaled(mhost, 2);
  for (size_t r = 0; r < mine.size(); ++r) {
    SCOPED_TRACE(absl::StrCat("run ", r));
    ASSERT_OK(mine[r].Await(absl::Now() + kRunTimeout));
    ExpectHolds(mine[r].outputs[0], Bytes(want));
  }
  mine.clear();
  for (Accelerator* a : rt_->accelerators()) ASSERT_OK(a->Flush(absl::Now() + kRunTimeout));
  uint64_t after = 0;
  for (Accelerator* a : rt_->accelerators()) after += a->memory_in_use();
  EXPECT_EQ(other->bytes_held(), 0u);
  // The closed client's inputs and instances are gone: what is left is ours.
  EXPECT_GT(before, 0u);
  EXPECT_GT(other_held, 0u);
  EXPECT_EQ(after, client_->bytes_held());
  ExpectEnginesUsedAsAsked();
}

INSTANTIATE_TEST_SUITE_P(CopyPaths, ReshardTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "ByCopyEngine" : "InCommandLists";
                         });

}  // namespace
}  // namespace causeway
