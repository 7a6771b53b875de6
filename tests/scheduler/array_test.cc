// Sharded arrays against host data: round trips, the shard each device holds,
// dtypes, reference counting and release.
#include "causeway/scheduler/array.h"

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "causeway/base/future.h"
#include "causeway/runtime/accelerator.h"
#include "causeway/scheduler/island.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Host data of `count` elements of `elem` bytes each, every element a
// distinct bit pattern (so a misplaced element cannot go unnoticed).
std::vector<uint8_t> Pattern(int64_t count, size_t elem, uint32_t seed) {
  std::vector<uint8_t> out(count * elem);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t v = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u + 1;
    if (elem == 2) v = static_cast<uint32_t>(i + seed * 977) & 0xffff;  // still distinct below 65536 elements
    std::memcpy(out.data() + i * elem, &v, elem);
  }
  return out;
}

// The piece of the row-major array `host` of `shape` that shard `index` of a
// split along `axis` into `parts` holds, computed element by element.
std::vector<uint8_t> Slice(const std::vector<uint8_t>& host, const Shape& shape, size_t elem, int axis,
                           int parts, int index) {
  if (axis < 0) return host;
  Shape piece = shape;
  piece[axis] /= parts;
  std::vector<uint8_t> out;
  std::vector<int64_t> at(piece.size(), 0);  // index into the piece
  for (int64_t n = 0; n < NumElements(piece); ++n) {
    int64_t flat = 0;
    for (size_t k = 0; k < shape.size(); ++k) {
      int64_t g = at[k] + (static_cast<int>(k) == axis ? index * piece[k] : 0);
      flat = flat * shape[k] + g;
    }
    out.insert(out.end(), host.begin() + flat * elem, host.begin() + (flat + 1) * elem);
    for (int k = static_cast<int>(piece.size()) - 1; k >= 0; --k) {
      if (++at[k] < piece[k]) break;
      at[k] = 0;
    }
  }
  return out;
}

// Which piece device `d` of a mesh of `dims` holds along `mesh_axis`
// (row-major device order).
int PieceOf(const std::vector<int>& dims, int mesh_axis, int d) {
  if (dims.size() == 1) return d;
  return mesh_axis == 0 ? d / dims[1] : d % dims[1];
}

class ArrayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime(4);
    ASSERT_NE(rt_, nullptr);
    ASSERT_OK_AND_ASSIGN(island_, Island::Create(rt_.get()));
    ASSERT_OK_AND_ASSIGN(client_, island_->Connect("arrays"));
  }
  void TearDown() override {
    client_.reset();
    island_.reset();
  }

  // Uploads a pattern into an array of `shape`/`dtype`/`sharding` on `mesh`,
  // checks the download is bit-exact and that every device holds exactly its
  // slice.
  void RoundTrip(const std::shared_ptr<Mesh>& mesh, const Shape& shape, DType dtype, Sharding sharding) {
    SCOPED_TRACE(absl::StrCat(DTypeName(dtype), ShapeString(shape), " ", sharding.ToString(), " on ",
                              mesh->DebugString()));
    const size_t elem = DTypeSize(dtype);
    ASSERT_OK_AND_ASSIGN(ArrayRef a, client_->CreateArray(mesh, shape, dtype, sharding, "a"));
    int parts = sharding.replicated() ? 1 : mesh->dims()[sharding.mesh_axis];
    Shape piece = shape;
    if (!sharding.replicated()) piece[sharding.array_axis] /= parts;
    EXPECT_EQ(a->shard_shape(), piece);
    EXPECT_EQ(a->shard_count(), parts);
    EXPECT_EQ(a->shard_bytes(), NumElements(piece) * elem);
    EXPECT_EQ(a->bytes(), a->shard_bytes() * mesh->size());

    std::vector<uint8_t> host =
        Pattern(NumElements(shape), elem, static_cast<uint32_t>(shape.size() * 31 + parts));
    ASSERT_OK(a->Upload(host.data(), host.size()));
    std::vector<uint8_t> back(host.size(), 0xAB);
    ASSERT_OK(a->Download(back.data(), back.size()));
    EXPECT_TRUE(back == host) << "round trip is not bit-exact";

    // Each device's buffer, read directly, holds its slice.
    ASSERT_OK(a->Await());
    for (int d = 0; d < mesh->size(); ++d) {
      int index = sharding.replicated() ? 0 : PieceOf(mesh->dims(), sharding.mesh_axis, d);
      EXPECT_EQ(a->ShardIndex(d), index) << "device " << d;
      std::vector<uint8_t> want = Slice(host, shape, elem, sharding.array_axis, parts, index);
      ASSERT_EQ(want.size(), a->shard_bytes());
      ASSERT_OK_AND_ASSIGN(auto buffer, a->shard(d));
      EXPECT_EQ(buffer->accelerator(), mesh->device(d));
      std::vector<uint8_t> got(want.size(), 0xCD);
      ASSERT_OK(mesh->device(d)->DownloadSync(buffer, got.data(), got.size()));
      EXPECT_TRUE(got == want) << "device " << d << " (piece " << index << ") holds the wrong slice";
    }
  }

  std::unique_ptr<Runtime> rt_;
  std::unique_ptr<Island> island_;
  std::shared_ptr<Client> client_;
};

// Checks the test's own slicing against a hand-written case, so that the
// expectations below do not share a mistake with the code under test.
TEST(SliceTest, MatchesHandWrittenCase) {
  // [2, 4] of bytes 0..7 split along axis 1 into 2: piece 1 is {2, 3, 6, 7}.
  std::vector<uint8_t> host = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_THAT(Slice(host, {2, 4}, 1, 1, 2, 1), ElementsAreArray({2, 3, 6, 7}));
  EXPECT_THAT(Slice(host, {2, 4}, 1, 0, 2, 1), ElementsAreArray({4, 5, 6, 7}));
  // [2, 2, 2] along axis 2: piece 0 is the even elements.
  EXPECT_THAT(Slice(host, {2, 2, 2}, 1, 2, 2, 0), ElementsAreArray({0, 2, 4, 6}));
  EXPECT_EQ(PieceOf({2, 2}, 0, 2), 1);
  EXPECT_EQ(PieceOf({2, 2}, 1, 2), 0);
}

// Tests round trips and per-device shards on a 1-D mesh of 4: replicated and
// split along every axis of 2-D and 3-D arrays, for f32, i32 and f16.
TEST_F(ArrayTest, RoundTripsOnLineMesh) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({4}));
  for (DType dtype : {DType::kF32, DType::kI32, DType::kF16}) {
    RoundTrip(mesh, {8, 12}, dtype, Sharding::Replicated());
    RoundTrip(mesh, {8, 12}, dtype, Sharding::Split(0));
    RoundTrip(mesh, {8, 12}, dtype, Sharding::Split(1));
    RoundTrip(mesh, {4, 4, 8}, dtype, Sharding::Split(0));
    RoundTrip(mesh, {2, 4, 8}, dtype, Sharding::Split(1));
    RoundTrip(mesh, {2, 4, 8}, dtype, Sharding::Split(2));
    RoundTrip(mesh, {64}, dtype, Sharding::Split(0));
  }
}

// Tests round trips and per-device shards on a 2x2 mesh: replicated, and
// split along axes 0, 1 (and 2 of a 3-D array) over mesh axis 0 and over mesh
// axis 1 (each piece then lives on two devices).
TEST_F(ArrayTest, RoundTripsOnGridMesh) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2, 2}));
  for (DType dtype : {DType::kF32, DType::kI32, DType::kF16}) {
    RoundTrip(mesh, {6, 8}, dtype, Sharding::Replicated());
    RoundTrip(mesh, {2, 4, 6}, dtype, Sharding::Replicated());
    for (int mesh_axis : {0, 1}) {
      RoundTrip(mesh, {6, 8}, dtype, Sharding::Split(0, mesh_axis));
      RoundTrip(mesh, {6, 8}, dtype, Sharding::Split(1, mesh_axis));
      RoundTrip(mesh, {2, 4, 6}, dtype, Sharding::Split(0, mesh_axis));
      RoundTrip(mesh, {2, 4, 6}, dtype, Sharding::Split(1, mesh_axis));
      RoundTrip(mesh, {2, 4, 6}, dtype, Sharding::Split(2, mesh_axis));
    }
  }
}

// Tests a non-square 2-D mesh (1x4 and 4x1 views of the island), where the
// two mesh axes split into different numbers of pieces.
TEST_F(ArrayTest, RoundTripsOnNonSquareMeshes) {
  ASSERT_OK_AND_ASSIGN(auto row, client_->AllocateMesh({1, 4}));
  RoundTrip(row, {4, 8}, DType::kF32, Sharding::Split(0, 0));  // one piece, on all four
  RoundTrip(row, {4, 8}, DType::kF32, Sharding::Split(1, 1));
  ASSERT_OK(island_->resources().Release(row));
  ASSERT_OK_AND_ASSIGN(auto col, client_->AllocateMesh({4, 1}));
  RoundTrip(col, {4, 8}, DType::kI32, Sharding::Split(0, 0));
  RoundTrip(col, {4, 8}, DType::kI32, Sharding::Split(1, 1));
}

// Tests f16 arrays whose shards are not a multiple of 4 bytes (3 halves, and a
// single half) round trip exactly.
TEST_F(ArrayTest, OddSizedHalfArrays) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2}));
  RoundTrip(mesh, {3}, DType::kF16, Sharding::Replicated());
  RoundTrip(mesh, {2, 3}, DType::kF16, Sharding::Split(0));
  RoundTrip(mesh, {2}, DType::kF16, Sharding::Split(0));
  RoundTrip(mesh, {1}, DType::kF16, Sharding::Replicated());
}

// Tests that f16 data is carried as raw bit patterns: NaN payloads,
// infinities, negative zero and subnormals come back unchanged.
TEST_F(ArrayTest, HalfBitPatternsAreExact) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2}));
  std::vector<uint16_t> host = {0x0000, 0x8000, 0x0001, 0x03ff, 0x3c00, 0xbc00, 0x7bff, 0x7c00,
                                0xfc00, 0x7e00, 0x7d55, 0xffff, 0x1234, 0xabcd, 0x5555, 0xaaaa};
  ASSERT_OK_AND_ASSIGN(ArrayRef a, client_->CreateArray(mesh, {16}, DType::kF16, Sharding::Split(0), "half"));
  ASSERT_OK(a->Upload(host.data(), host.size() * 2));
  std::vector<uint16_t> back(16, 0);
  ASSERT_OK(a->Download(back.data(), back.size() * 2));
  EXPECT_EQ(back, host);
  ASSERT_OK_AND_ASSIGN(auto second, a->shard(1));
  std::vector<uint16_t> shard(8, 0);
  ASSERT_OK(mesh->device(1)->DownloadSync(second, shard.data(), shard.size() * 2));
  EXPECT_EQ(shard, std::vector<uint16_t>(host.begin() + 8, host.end()));
}

// Tests that uploading again overwrites the previous contents.
TEST_F(ArrayTest, UploadOverwrites) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2, 2}));
  ASSERT_OK_AND_ASSIGN(ArrayRef a,
                       client_->CreateArray(mesh, {4, 4}, DType::kI32, Sharding::Split(1, 1), "a"));
  for (int round = 0; round < 3; ++round) {
    std::vector<int32_t> host(16);
    for (int i = 0; i < 16; ++i) host[i] = round * 100 + i;
    ASSERT_OK(a->Upload(host.data(), host.size() * 4));
    std::vector<int32_t> back(16, -1);
    ASSERT_OK(a->Download(back.data(), back.size() * 4));
    EXPECT_EQ(back, host) << "round " << round;
  }
}

// Tests that an ArrayRef copy keeps the array (and its device memory) alive
// and that dropping the last reference frees the memory on every device.
TEST_F(ArrayTest, LastReferenceFreesMemory) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({4}));
  std::vector<uint64_t> before;
  for (Accelerator* d : mesh->devices()) before.push_back(d->memory_in_use());
  const uint64_t held_before = client_->bytes_held();

  ASSERT_OK_AND_ASSIGN(ArrayRef a,
                       client_->CreateArray(mesh, {1024}, DType::kF32, Sharding::Replicated(), "a"));
  std::vector<float> host = ::causeway::testing::RandomFloats(1024, 3);
  ASSERT_OK(a->Upload(host.data(), host.size() * 4));
  ASSERT_OK(a->Await());
  for (int d = 0; d < mesh->size(); ++d) {
    EXPECT_GE(mesh->device(d)->memory_in_use(), before[d] + 4096) << "device " << d;
  }
  EXPECT_EQ(client_->bytes_held(), held_before + 4 * 4096);

  ArrayRef copy = a;
  a.reset();
  // Still alive through the copy: same memory, same contents.
  for (int d = 0; d < mesh->size(); ++d) {
    EXPECT_GE(mesh->device(d)->memory_in_use(), before[d] + 4096) << "device " << d;
  }
  EXPECT_FALSE(copy->released());
  std::vector<float> back(1024);
  ASSERT_OK(copy->Download(back.data(), back.size() * 4));
  EXPECT_EQ(0, std::memcmp(back.data(), host.data(), host.size() * 4));

  std::weak_ptr<Array> watch = copy;
  copy.reset();
  EXPECT_TRUE(watch.expired()) << "something besides the ArrayRefs keeps the array alive";
  for (int d = 0; d < mesh->size(); ++d) {
    EXPECT_EQ(mesh->device(d)->memory_in_use(), before[d]) << "device " << d;
  }
  EXPECT_EQ(client_->bytes_held(), held_before);
}

// Tests that Release frees the shards at once (while references remain) and
// that every later use fails with FailedPrecondition.
TEST_F(ArrayTest, ReleaseFreesImmediately) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2, 2}));
  std::vector<uint64_t> before;
  for (Accelerator* d : mesh->devices()) before.push_back(d->memory_in_use());
  ASSERT_OK_AND_ASSIGN(ArrayRef a,
                       client_->CreateArray(mesh, {8, 64}, DType::kF32, Sharding::Split(0, 1), "gone"));
  std::vector<float> host = ::causeway::testing::RandomFloats(8 * 64, 4);
  ASSERT_OK(a->Upload(host.data(), host.size() * 4));
  ASSERT_OK(a->Await());
  ArrayRef other = a;  // a second reference does not keep a released array

  a->Release();
  EXPECT_TRUE(a->released());
  EXPECT_TRUE(other->released());
  for (int d = 0; d < mesh->size(); ++d) {
    EXPECT_EQ(mesh->device(d)->memory_in_use(), before[d]) << "device " << d;
    auto s = a->shard(d);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr("gone"));
  }
  EXPECT_EQ(client_->bytes_held(), 0u);
  EXPECT_EQ(a->Upload(host.data(), host.size() * 4).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> back(host.size());
  EXPECT_EQ(a->Download(back.data(), back.size() * 4).code(), absl::StatusCode::kFailedPrecondition);
  a->Release();  // idempotent
  EXPECT_TRUE(a->released());
}

// Tests that closing the client releases its arrays even though the caller
// still holds references.
TEST_F(ArrayTest, ClientCloseReleasesArrays) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2}));
  std::vector<uint64_t> before;
  for (Accelerator* d : mesh->devices()) before.push_back(d->memory_in_use());
  ASSERT_OK_AND_ASSIGN(ArrayRef a,
                       client_->CreateArray(mesh, {256}, DType::kI32, Sharding::Split(0), "kept"));
  client_->Close();
  EXPECT_TRUE(a->released());
  EXPECT_EQ(a->shard(0).status().code(), absl::StatusCode::kFailedPrecondition);
  for (int d = 0; d < mesh->size(); ++d) EXPECT_EQ(mesh->device(d)->memory_in_use(), before[d]);
  auto late = client_->CreateArray(mesh, {4}, DType::kF32);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
}

// Tests that Upload and Download refuse a byte count other than the whole
// array's, saying what was expected.
TEST_F(ArrayTest, WrongByteCountIsInvalidArgument) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(ArrayRef a, client_->CreateArray(mesh, {4, 6}, DType::kF32, Sharding::Split(0), "w"));
  std::vector<float> host(4 * 6 + 1, 1.0f);
  absl::Status s = a->Upload(host.data(), 4 * 6 * 4 - 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("96"));
  EXPECT_THAT(s.message(), HasSubstr("92"));
  EXPECT_EQ(a->Upload(host.data(), host.size() * 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Upload(host.data(), 0).code(), absl::StatusCode::kInvalidArgument);
  // A shard's worth is not the array's worth.
  EXPECT_EQ(a->Upload(host.data(), a->shard_bytes()).code(), absl::StatusCode::kInvalidArgument);
  // f16: counted in halves.
  ASSERT_OK_AND_ASSIGN(ArrayRef h, client_->CreateArray(mesh, {4, 6}, DType::kF16, Sharding::Split(0), "h"));
  EXPECT_EQ(h->Upload(host.data(), 4 * 6 * 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_OK(h->Upload(host.data(), 4 * 6 * 2));
  std::vector<float> back(host.size());
  EXPECT_EQ(a->Download(back.data(), 4 * 6 * 4 + 4).code(), absl::StatusCode::kInvalidArgument);
}

// Tests that arrays refuse shardings that do not fit their shape or mesh,
// naming the axis, and meshes that are released or another client's.
TEST_F(ArrayTest, BadArraysAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2, 2}));
  auto uneven = client_->CreateArray(mesh, {6, 5}, DType::kF32, Sharding::Split(1, 0));
  EXPECT_EQ(uneven.status().code(), absl::StatusCode::kInvalidArgument) << uneven.status();
  EXPECT_THAT(uneven.status().message(), HasSubstr("axis 1"));
  auto no_axis = client_->CreateArray(mesh, {6, 4}, DType::kF32, Sharding::Split(2, 0));
  EXPECT_EQ(no_axis.status().code(), absl::StatusCode::kInvalidArgument) << no_axis.status();
  auto no_mesh_axis = client_->CreateArray(mesh, {6, 4}, DType::kF32, Sharding::Split(0, 2));
  EXPECT_EQ(no_mesh_axis.status().code(), absl::StatusCode::kInvalidArgument) << no_mesh_axis.status();
  auto dynamic = client_->CreateArray(mesh, {6, 0}, DType::kF32);
  EXPECT_EQ(dynamic.status().code(), absl::StatusCode::kInvalidArgument) << dynamic.status();
  EXPECT_THAT(dynamic.status().message(), HasSubstr("static"));

  ASSERT_OK_AND_ASSIGN(auto other, island_->Connect("other"));
  auto foreign = other->CreateArray(mesh, {4}, DType::kF32);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kPermissionDenied) << foreign.status();

  ASSERT_OK(island_->resources().Release(mesh));
  auto on_released = client_->CreateArray(mesh, {4}, DType::kF32, Sharding::Replicated(), "late");
  EXPECT_EQ(on_released.status().code(), absl::StatusCode::kFailedPrecondition) << on_released.status();
  EXPECT_THAT(on_released.status().message(), HasSubstr("released"));
}

// Tests that a shape whose element count or byte size does not fit in 64
// bits is refused, naming the shape, rather than wrapping the shard size to
// a few bytes that a later upload or fetch would copy past.
TEST_F(ArrayTest, ShapesWhoseSizeOverflowsAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({1}));
  const int64_t k2to32 = int64_t{1} << 32;
  const Shape wraps_to_zero = {k2to32, k2to32};      // 2^64 elements
  const Shape bytes_wrap = {int64_t{1} << 62, 1};    // 2^64 bytes of f32
  const Shape over_int64 = {k2to32, k2to32 / 2, 2};  // 2^64 elements, in three
  for (const Shape& shape : {wraps_to_zero, bytes_wrap, over_int64}) {
    SCOPED_TRACE(ShapeString(shape));
    auto array = client_->CreateArray(mesh, shape, DType::kF32, Sharding::Replicated(), "huge");
    EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument) << array.status();
    EXPECT_THAT(array.status().message(), HasSubstr("array 'huge'"));
    EXPECT_THAT(array.status().message(), HasSubstr(ShapeString(shape)));
  }
}

// Tests that downloading an array once it is written does not wait for work
// queued on its accelerators after it (a trainer reads step t's loss while
// step t + 1 runs), where the host can read the device's memory (lavapipe,
// unified memory: the shards are read in place). An upload held behind a host
// gate that the test keeps shut stands for the later work: a download queued
// behind it would return only once the gate opened. Where device memory is
// not host-visible (a discrete GPU) the download is such a copy: there the
// test checks the bytes once the gate is open.
TEST_F(ArrayTest, DownloadOfAWrittenArrayDoesNotWaitForWorkQueuedAfterIt) {
  ASSERT_OK_AND_ASSIGN(auto mesh, client_->AllocateMesh({2}));
  ASSERT_OK_AND_ASSIGN(ArrayRef x, client_->CreateArray(mesh, {2, 64}, DType::kF32, Sharding::Split(0)));
  const std::vector<uint8_t> host = Pattern(128, 4, 7);
  ASSERT_OK(x->Upload(host.data(), host.size()));
  Promise<> gate;
  const Future<> opened = gate.future();
  const std::vector<uint8_t> scratch(256, 1);
  std::vector<Future<>> held;
  bool in_place = true;
  for (int d = 0; d < mesh->size(); ++d) {
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Buffer> shard, x->shard(d));
    in_place = in_place && shard->host_coherent() && shard->mapped() != nullptr;
    ASSERT_OK_AND_ASSIGN(std::shared_ptr<Buffer> other, mesh->device(d)->CreateBuffer(scratch.size()));
    held.push_back(mesh->device(d)->Upload(other, scratch.data(), scratch.size(), 0, {opened}));
  }
  std::vector<uint8_t> got(host.size());
  absl::Notification read;
  absl::Status status;
  std::thread reader([&] {
    status = x->Download(got.data(), got.size());
    read.Notify();
  });
  if (mesh->device(0)->info().type == VK_PHYSICAL_DEVICE_TYPE_CPU) {
    EXPECT_TRUE(in_place) << "lavapipe's device memory is host-visible";
  }
  if (in_place) {
    EXPECT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(30)))
        << "the download waited for the work queued after the array was written";
    for (const Future<>& f : held) EXPECT_FALSE(f.IsReady());  // the gate was shut throughout
  }
  gate.Set(absl::OkStatus());
  reader.join();
  ASSERT_OK(status);
  EXPECT_EQ(got, host);
  for (Future<>& f : held) EXPECT_OK(f.Await());
}

}  // namespace
}  // namespace causeway
