// Meshes and the resource manager: placement on distinct accelerators, load
// balancing, refusals, and giving everything back.
#include "causeway/scheduler/mesh.h"

#include <set>

#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The accelerator indices of a mesh, in its row-major order.
std::vector<int> Indices(const Mesh& mesh) {
  std::vector<int> out;
  for (Accelerator* a : mesh.devices()) out.push_back(a->index());
  return out;
}

// Tests that 1-D and 2-D meshes get distinct accelerators, with the shape and
// owner asked for.
TEST(MeshTest, MeshesGetDistinctAccelerators) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ResourceManager rm("local", rt->accelerators());
  EXPECT_EQ(rm.island(), "local");

  ASSERT_OK_AND_ASSIGN(auto line, rm.Allocate(/*client=*/7, {4}));
  EXPECT_THAT(line->dims(), ElementsAre(4));
  EXPECT_EQ(line->size(), 4);
  EXPECT_EQ(line->owner(), 7u);
  EXPECT_EQ(line->island(), "local");
  EXPECT_FALSE(line->released());
  std::set<Accelerator*> distinct(line->devices().begin(), line->devices().end());
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_THAT(Indices(*line), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(line->DebugString(), HasSubstr("[4] on accelerators 0,1,2,3"));

  ASSERT_OK_AND_ASSIGN(auto grid, rm.Allocate(/*client=*/8, {2, 2}));
  EXPECT_THAT(grid->dims(), ElementsAre(2, 2));
  EXPECT_EQ(grid->size(), 4);
  EXPECT_NE(grid->id(), line->id());
  distinct = std::set<Accelerator*>(grid->devices().begin(), grid->devices().end());
  EXPECT_EQ(distinct.size(), 4u);
  EXPECT_THAT(grid->DebugString(), HasSubstr("[2x2]"));
  EXPECT_THAT(rm.Load(), ElementsAre(2, 2, 2, 2));

  // A 2-D mesh smaller than the island: 1x3 on 3 distinct accelerators.
  ASSERT_OK_AND_ASSIGN(auto row, rm.Allocate(/*client=*/8, {1, 3}));
  EXPECT_EQ(row->size(), 3);
  distinct = std::set<Accelerator*>(row->devices().begin(), row->devices().end());
  EXPECT_EQ(distinct.size(), 3u);
}

// Tests that meshes spread over the least-loaded accelerators: two 2-wide
// meshes on 4 accelerators use all 4, and later meshes go where load is least.
TEST(MeshTest, AllocationIsBalancedByLoad) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ResourceManager rm("local", rt->accelerators());
  ASSERT_OK_AND_ASSIGN(auto a, rm.Allocate(1, {2}));
  ASSERT_OK_AND_ASSIGN(auto b, rm.Allocate(1, {2}));
  std::set<int> used;
  for (int i : Indices(*a)) used.insert(i);
  for (int i : Indices(*b)) used.insert(i);
  EXPECT_EQ(used.size(), 4u) << a->DebugString() << " / " << b->DebugString();
  EXPECT_THAT(rm.Load(), ElementsAre(1, 1, 1, 1));

  // Unbalance the island: release `a`; a third 2-wide mesh must land exactly
  // on the accelerators `a` freed (load 0), not on `b`'s.
  std::vector<int> freed = Indices(*a);
  ASSERT_OK(rm.Release(a));
  EXPECT_TRUE(a->released());
  ASSERT_OK_AND_ASSIGN(auto c, rm.Allocate(1, {2}));
  EXPECT_EQ(Indices(*c), freed);
  EXPECT_THAT(rm.Load(), ElementsAre(1, 1, 1, 1));

  // Load [1,1,1,1] + a 1-wide mesh on the least loaded (the first): [2,1,1,1];
  // then a 3-wide mesh must avoid accelerator 0.
  ASSERT_OK_AND_ASSIGN(auto d, rm.Allocate(2, {1}));
  EXPECT_THAT(Indices(*d), ElementsAre(0));
  ASSERT_OK_AND_ASSIGN(auto e, rm.Allocate(2, {3}));
  EXPECT_THAT(Indices(*e), ElementsAre(1, 2, 3));
  EXPECT_THAT(rm.Load(), ElementsAre(2, 2, 2, 2));
}

// Tests the refusals: too large a mesh, bad dimensions, another island.
TEST(MeshTest, BadRequestsAreRefused) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ResourceManager rm("local", rt->accelerators());

  auto too_big = rm.Allocate(1, {5});
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_THAT(too_big.status().message(), HasSubstr("5 accelerators"));
  auto too_big_2d = rm.Allocate(1, {3, 2});
  EXPECT_EQ(too_big_2d.status().code(), absl::StatusCode::kResourceExhausted) << too_big_2d.status();

  for (const std::vector<int>& dims :
       std::vector<std::vector<int>>{{}, {1, 1, 1}, {0}, {-2}, {2, 0}, {-1, -1}}) {
    auto bad = rm.Allocate(1, dims);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument)
        << "dims of size " << dims.size() << ": " << bad.status();
  }

  auto elsewhere = rm.Allocate(1, {1}, "far-away");
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kNotFound) << elsewhere.status();
  EXPECT_THAT(elsewhere.status().message(), HasSubstr("far-away"));
  // Naming this island is fine.
  EXPECT_OK(rm.Allocate(1, {1}, "local").status());

  // No refusal may leak load.
  EXPECT_THAT(rm.Load(), ElementsAre(1, 0, 0, 0));

  // Releasing a mesh twice, or one not held, is NotFound.
  ASSERT_OK_AND_ASSIGN(auto m, rm.Allocate(1, {1}));
  ASSERT_OK(rm.Release(m));
  EXPECT_EQ(rm.Release(m).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rm.Release(nullptr).code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(rm.Load(), ElementsAre(1, 0, 0, 0));
}

// Tests that ReleaseClient gives back every mesh of one client (marking them
// released) and leaves other clients' meshes alone.
TEST(MeshTest, ReleaseClientGivesEverythingBack) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ResourceManager rm("local", rt->accelerators());
  ASSERT_OK_AND_ASSIGN(auto a, rm.Allocate(1, {2, 2}));
  ASSERT_OK_AND_ASSIGN(auto b, rm.Allocate(1, {3}));
  ASSERT_OK_AND_ASSIGN(auto c, rm.Allocate(1, {1}));
  ASSERT_OK_AND_ASSIGN(auto other, rm.Allocate(2, {2}));
  EXPECT_EQ(rm.MeshesOf(1).size(), 3u);
  EXPECT_EQ(rm.MeshesOf(2).size(), 1u);

  EXPECT_EQ(rm.ReleaseClient(1), 3);
  for (const auto& m : {a, b, c}) EXPECT_TRUE(m->released()) << m->DebugString();
  EXPECT_FALSE(other->released());
  EXPECT_TRUE(rm.MeshesOf(1).empty());
  int left = 0;
  for (int l : rm.Load()) left += l;
  EXPECT_EQ(left, 2);  // only `other`

  EXPECT_EQ(rm.ReleaseClient(1), 0);  // idempotent
  EXPECT_EQ(rm.ReleaseClient(2), 1);
  EXPECT_THAT(rm.Load(), ElementsAre(0, 0, 0, 0));
  EXPECT_TRUE(other->released());
  EXPECT_EQ(rm.ReleaseClient(99), 0);
}

// Tests that closing a client through the island gives back its meshes and
// the island's load goes to zero.
TEST(MeshTest, ClientCloseReleasesMeshes) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  ASSERT_OK_AND_ASSIGN(auto island, Island::Create(rt.get()));
  ASSERT_OK_AND_ASSIGN(auto c1, island->Connect("one"));
  ASSERT_OK_AND_ASSIGN(auto c2, island->Connect("two"));
  ASSERT_OK_AND_ASSIGN(auto m1, c1->AllocateMesh({2, 2}));
  ASSERT_OK_AND_ASSIGN(auto m2, c2->AllocateMesh({2}));
  EXPECT_EQ(m1->owner(), c1->id());
  EXPECT_EQ(m2->owner(), c2->id());
  auto elsewhere = c1->AllocateMesh({1}, "other-island");
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kNotFound) << elsewhere.status();

  c1->Close();
  EXPECT_TRUE(m1->released());
  EXPECT_FALSE(m2->released());
  auto after = c1->AllocateMesh({1});
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition) << after.status();
  c2->Close();
  EXPECT_TRUE(m2->released());
  EXPECT_THAT(island->resources().Load(), ElementsAre(0, 0, 0, 0));
}

// Tests Mesh::Coordinate: row-major positions on 2-D meshes, the index itself
// on 1-D meshes.
// Tests that a mesh's devices share memory exactly when every one reads
// every other's in place: VkDevices importing each other's memory, or a
// single device; not when their copies stage through the host.
TEST(MeshTest, DevicesShareMemoryUnlessCopiesStageThroughTheHost) {
  for (bool external_memory : {true, false}) {
    SCOPED_TRACE(external_memory ? "external memory" : "host-staged");
    RuntimeOptions options = ::causeway::testing::TestOptions(3);
    options.use_external_memory = external_memory;
    auto rt = MakeRuntime(options);
    ASSERT_NE(rt, nullptr);
    std::vector<Accelerator*> acc = rt->accelerators();
    EXPECT_EQ(Mesh(1, "local", {3}, acc, 1).DevicesShareMemory(), external_memory);
    EXPECT_EQ(Mesh(2, "local", {1, 2}, {acc[2], acc[0]}, 1).DevicesShareMemory(), external_memory);
    EXPECT_TRUE(Mesh(3, "local", {1}, {acc[1]}, 1).DevicesShareMemory());
  }
  // A virtual mesh (an island not here) refuses nothing, and touches no
  // device (UBSan, fatal in CI, saw a call on a null accelerator).
  EXPECT_TRUE(Mesh(4, "remote", {2}, {nullptr, nullptr}, 1).DevicesShareMemory());
}

TEST(MeshTest, Coordinates) {
  auto rt = MakeRuntime(4);
  ASSERT_NE(rt, nullptr);
  std::vector<Accelerator*> acc = rt->accelerators();

  Mesh line(1, "local", {4}, acc, 1);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(line.Coordinate(i, 0), i);

  Mesh square(2, "local", {2, 2}, acc, 1);
  const int want_square[4][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(square.Coordinate(i, 0), want_square[i][0]) << i;
    EXPECT_EQ(square.Coordinate(i, 1), want_square[i][1]) << i;
  }

  // Non-square: 2 rows of 3 and 3 rows of 2 (the same accelerators reused:
  // Coordinate only looks at the dims).
  std::vector<Accelerator*> six = {acc[0], acc[1], acc[2], acc[3], acc[0], acc[1]};
  Mesh wide(3, "local", {2, 3}, six, 1);
  Mesh tall(4, "local", {3, 2}, six, 1);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(wide.Coordinate(i, 0), i / 3) << i;
    EXPECT_EQ(wide.Coordinate(i, 1), i % 3) << i;
    EXPECT_EQ(tall.Coordinate(i, 0), i / 2) << i;
    EXPECT_EQ(tall.Coordinate(i, 1), i % 2) << i;
  }
  // A 1xN and an Nx1 mesh: the singleton axis is always 0.
  Mesh one_row(5, "local", {1, 4}, acc, 1);
  Mesh one_col(6, "local", {4, 1}, acc, 1);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(one_row.Coordinate(i, 0), 0);
    EXPECT_EQ(one_row.Coordinate(i, 1), i);
    EXPECT_EQ(one_col.Coordinate(i, 0), i);
    EXPECT_EQ(one_col.Coordinate(i, 1), 0);
  }
}

}  // namespace
}  // namespace causeway
