// Transfer plans (causeway/scheduler/transfer.h) between meshes and shardings, read
// as data: which source position each target copies from, and the byte
// regions, all worked out by hand from the shards' row-major layouts. The
// copies themselves run in reshard_test.cc.
#include "causeway/scheduler/transfer.h"

#include <memory>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/mesh.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::ElementsAre;

// A region as (src_offset, dst_offset, size), for matching.
using Region = std::tuple<uint64_t, uint64_t, uint64_t>;
std::vector<Region> Regions(const TransferPlan::Piece& piece) {
  std::vector<Region> out;
  for (const auto& r : piece.regions) out.emplace_back(r.src_offset, r.dst_offset, r.size);
  return out;
}

class TransferPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(4);
    ASSERT_NE(rt_, nullptr);
  }
  // A mesh of `dims` on the runtime's accelerators `devices`.
  Mesh On(std::vector<int> dims, std::vector<int> devices) {
    std::vector<Accelerator*> accs;
    for (int d : devices) accs.push_back(rt_->accelerator(d));
    return Mesh(next_id_++, "test", std::move(dims), std::move(accs), 1);
  }

  std::unique_ptr<Runtime> rt_;
  uint64_t next_id_ = 1;
};

// Tests that between two meshes of one sharding on the same accelerators
// each target copies its whole shard from its own accelerator in one region.
TEST_F(TransferPlanTest, SameLayoutIsOneCopyPerDevice) {
  const Mesh from = On({2}, {0, 1}), to = On({2}, {0, 1});
  ASSERT_OK_AND_ASSIGN(auto plan,
                       PlanTransfer({4, 3}, DType::kF32, from, Sharding::Split(0), to, Sharding::Split(0)));
  ASSERT_EQ(plan->pieces.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(plan->pieces[t].size(), 1u);
    EXPECT_EQ(plan->pieces[t][0].source, t);
    // 2 rows of 3 f32.
    EXPECT_THAT(Regions(plan->pieces[t][0]), ElementsAre(Region{0, 0, 24}));
  }
  EXPECT_EQ(plan->region_count(), 2u);
}

// Tests that splitting a replicated array gives each target its rows of the
// source's whole copy.
TEST_F(TransferPlanTest, ReplicatedToSplitTakesEachTargetsRows) {
  const Mesh from = On({1}, {2}), to = On({2}, {0, 1});
  ASSERT_OK_AND_ASSIGN(
      auto plan, PlanTransfer({4, 3}, DType::kF32, from, Sharding::Replicated(), to, Sharding::Split(0)));
  ASSERT_EQ(plan->pieces.size(), 2u);
  ASSERT_EQ(plan->pieces[0].size(), 1u);
  ASSERT_EQ(plan->pieces[1].size(), 1u);
  EXPECT_EQ(plan->pieces[0][0].source, 0);
  EXPECT_THAT(Regions(plan->pieces[0][0]), ElementsAre(Region{0, 0, 24}));
  EXPECT_EQ(plan->pieces[1][0].source, 0);
  EXPECT_THAT(Regions(plan->pieces[1][0]), ElementsAre(Region{24, 0, 24}));
}

// Tests resharding from columns to rows: [2, 4] f32 split along axis 1 (each
// source holds a 2x2 block) to split along axis 0 (each target a 1x4 row):
// every target takes half of its row from each source.
TEST_F(TransferPlanTest, ColumnsToRows) {
  const Mesh mesh = On({2}, {0, 1});
  ASSERT_OK_AND_ASSIGN(auto plan,
                       PlanTransfer({2, 4}, DType::kF32, mesh, Sharding::Split(1), mesh, Sharding::Split(0)));
  ASSERT_EQ(plan->pieces.size(), 2u);
  for (int t = 0; t < 2; ++t) {
    SCOPED_TRACE(t);
    ASSERT_EQ(plan->pieces[t].size(), 2u);
    // Row t is at byte 8 t of each 2x2 source block; its halves go to bytes
    // 0 and 8 of the target's row.
    EXPECT_EQ(plan->pieces[t][0].source, 0);
    EXPECT_THAT(Regions(plan->pieces[t][0]), ElementsAre(Region{8u * t, 0, 8}));
    EXPECT_EQ(plan->pieces[t][1].source, 1);
    EXPECT_THAT(Regions(plan->pieces[t][1]), ElementsAre(Region{8u * t, 8, 8}));
  }
  EXPECT_EQ(plan->region_count(), 4u);
}

// Tests strided regions: gathering [2, 2, 4] f16 split along its last axis
// copies one 2-element run per (i, j) from each source, none of which merge.
TEST_F(TransferPlanTest, InnerSplitGivesStridedRegions) {
  const Mesh from = On({2}, {0, 1}), to = On({1}, {2});
  ASSERT_OK_AND_ASSIGN(
      auto plan, PlanTransfer({2, 2, 4}, DType::kF16, from, Sharding::Split(2), to, Sharding::Replicated()));
  ASSERT_EQ(plan->pieces.size(), 1u);
  ASSERT_EQ(plan->pieces[0].size(), 2u);
  // Source rows of 2 halves (4 bytes) at 0, 4, 8, 12; target rows of 4
  // halves (8 bytes), the second source's run 4 bytes in.
  EXPECT_EQ(plan->pieces[0][0].source, 0);
  EXPECT_THAT(Regions(plan->pieces[0][0]),
              ElementsAre(Region{0, 0, 4}, Region{4, 8, 4}, Region{8, 16, 4}, Region{12, 24, 4}));
  EXPECT_EQ(plan->pieces[0][1].source, 1);
  EXPECT_THAT(Regions(plan->pieces[0][1]),
              ElementsAre(Region{0, 4, 4}, Region{4, 12, 4}, Region{8, 20, 4}, Region{12, 28, 4}));
}

// Tests the choice among replicas: the holder on the target's own
// accelerator, else the targets spread over the holders.
TEST_F(TransferPlanTest, PicksTheLocalHolderElseSpreads) {
  const Mesh from = On({2}, {0, 1});
  ASSERT_OK_AND_ASSIGN(auto local, PlanTransfer({8}, DType::kI32, from, Sharding::Replicated(),
                                                On({2}, {1, 0}), Sharding::Replicated()));
  EXPECT_EQ(local->pieces[0][0].source, 1);
  EXPECT_EQ(local->pieces[1][0].source, 0);
  ASSERT_OK_AND_ASSIGN(auto spread, PlanTransfer({8}, DType::kI32, from, Sharding::Replicated(),
                                                 On({2}, {2, 3}), Sharding::Replicated()));
  EXPECT_EQ(spread->pieces[0][0].source, 0);
  EXPECT_EQ(spread->pieces[1][0].source, 1);
  EXPECT_THAT(Regions(spread->pieces[1][0]), ElementsAre(Region{0, 0, 32}));
}

// Tests a split over the second axis of a 2x2 mesh: positions 0 and 2 hold
// the first half, 1 and 3 the second.
TEST_F(TransferPlanTest, SplitOverASecondMeshAxis) {
  const Mesh grid = On({2, 2}, {0, 1, 2, 3});
  ASSERT_OK_AND_ASSIGN(auto plan, PlanTransfer({4}, DType::kF32, grid, Sharding::Split(0, 1), On({1}, {2}),
                                               Sharding::Replicated()));
  ASSERT_EQ(plan->pieces[0].size(), 2u);
  // The target's accelerator (2) is position 2, a holder of the first half.
  EXPECT_EQ(plan->pieces[0][0].source, 2);
  EXPECT_THAT(Regions(plan->pieces[0][0]), ElementsAre(Region{0, 0, 8}));
  EXPECT_EQ(plan->pieces[0][1].source, 1);
  EXPECT_THAT(Regions(plan->pieces[0][1]), ElementsAre(Region{0, 8, 8}));
}

// Tests that a scalar moves as one element.
TEST_F(TransferPlanTest, ScalarIsOneElement) {
  ASSERT_OK_AND_ASSIGN(auto plan, PlanTransfer({}, DType::kF32, On({1}, {0}), Sharding::Replicated(),
                                               On({1}, {1}), Sharding::Replicated()));
  ASSERT_EQ(plan->pieces.size(), 1u);
  EXPECT_THAT(Regions(plan->pieces[0][0]), ElementsAre(Region{0, 0, 4}));
}

// Tests that a sharding that does not fit its mesh is refused, on either
// side, with the sharding's error.
// Tests that a plan's regions are charged to a host budget before any is
// made: splitting the columns of a [4096, 2] array makes a 4-byte region per
// row per target (8192 regions, 192 KiB of plan), refused by a 64 KiB budget
// with nothing taken; a budget that holds it is charged for exactly those
// regions until the plan goes.
TEST_F(TransferPlanTest, RegionsAreChargedToTheBudgetBeforeTheyAreMade) {
  const Mesh from = On({1}, {0}), to = On({2}, {0, 1});
  const uint64_t plan_bytes = 8192 * sizeof(CommandList::CopyRegion);
  auto small = std::make_shared<HostBudget>("session 7", 64 << 10);
  absl::StatusOr<std::shared_ptr<const TransferPlan>> refused = PlanTransfer(
      {4096, 2}, DType::kF32, from, Sharding::Replicated(), to, Sharding::Split(1), small, "reshard 'r'");
  EXPECT_ERROR(refused.status(), absl::StatusCode::kResourceExhausted,
               "the plan of reshard 'r' (8192 copy regions)", "session 7");
  EXPECT_EQ(small->in_use(), 0u);

  auto enough = std::make_shared<HostBudget>("session 8", 1 << 20);
  {
    ASSERT_OK_AND_ASSIGN(auto plan, PlanTransfer({4096, 2}, DType::kF32, from, Sharding::Replicated(), to,
                                                 Sharding::Split(1), enough, "reshard 'r'"));
    EXPECT_EQ(plan->region_count(), 8192u);
    EXPECT_EQ(plan->pieces[1][0].regions[5].src_offset, 5 * 8 + 4);
    EXPECT_EQ(enough->in_use(), plan_bytes);
  }
  EXPECT_EQ(enough->in_use(), 0u);
}

TEST_F(TransferPlanTest, RefusesShardingsThatDoNotFit) {
  const Mesh two = On({2}, {0, 1}), one = On({1}, {2});
  EXPECT_ERROR(PlanTransfer({3}, DType::kF32, two, Sharding::Split(0), one, Sharding::Replicated()),
               absl::StatusCode::kInvalidArgument, "axis 0 of [3] does not split evenly into 2 shards");
  EXPECT_ERROR(PlanTransfer({4}, DType::kF32, one, Sharding::Replicated(), two, Sharding::Split(1)),
               absl::StatusCode::kInvalidArgument, "split(axis 1 over mesh axis 0): shape [4] has no axis 1");
  EXPECT_ERROR(PlanTransfer({4}, DType::kF32, one, Sharding::Replicated(), two, Sharding::Split(0, 1)),
               absl::StatusCode::kInvalidArgument, "[2] on accelerators 0,1 has no axis 1");
  EXPECT_ERROR(PlanTransfer({4, 0}, DType::kF32, one, Sharding::Replicated(), two, Sharding::Replicated()),
               absl::StatusCode::kInvalidArgument, "shape [4, 0] has a dimension < 1");
}

}  // namespace
}  // namespace causeway
