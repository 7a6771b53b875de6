// Runtime options, device selection, tracing hooks and the pipeline cache.
#include "causeway/runtime/runtime.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "causeway/base/trace.h"
#include "causeway/kernels/ops.h"
#include "causeway/runtime/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway {
namespace {

using ::causeway::testing::MakeRuntime;
using ::causeway::testing::TestOptions;
using ::testing::HasSubstr;

PhysicalDeviceInfo FakeDevice(uint32_t index, VkPhysicalDeviceType type, uint8_t uuid_byte) {
  PhysicalDeviceInfo d;
  d.index = index;
  d.type = type;
  d.name = absl::StrCat("dev", index);
  d.uuid.fill(uuid_byte);
  return d;
}

// Tests selection by auto (GPU first), type, index and UUID, and the errors.
TEST(RuntimeTest, SelectPhysicalDevice) {
  std::vector<PhysicalDeviceInfo> devs = {FakeDevice(0, VK_PHYSICAL_DEVICE_TYPE_CPU, 0x11),
                                          FakeDevice(1, VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU, 0x22),
                                          FakeDevice(2, VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, 0x33)};
  EXPECT_EQ((*SelectPhysicalDevice(devs, ""))->index, 2u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, "auto"))->index, 2u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, "cpu"))->index, 0u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, "integrated"))->index, 1u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, "gpu"))->index, 2u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, "1"))->index, 1u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, std::string(32, '2')))->index, 1u);
  EXPECT_EQ((*SelectPhysicalDevice(devs, "uuid:" + std::string(32, '3')))->index, 2u);
  auto bad = SelectPhysicalDevice(devs, "7");
  EXPECT_TRUE(absl::IsNotFound(bad.status()));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("dev2"));  // lists what exists
  EXPECT_TRUE(absl::IsNotFound(SelectPhysicalDevice(devs, "virtual").status()));
  EXPECT_TRUE(absl::IsNotFound(SelectPhysicalDevice(devs, "banana").status()));
  EXPECT_TRUE(absl::IsNotFound(SelectPhysicalDevice({}, "auto").status()));
  // Only a CPU driver: auto falls back to it.
  EXPECT_EQ((*SelectPhysicalDevice({devs[0]}, "auto"))->index, 0u);
}

// Tests that a device's capabilities carry what plans read, its kind by
// Vulkan's value (what the wire carries), and that a value no kind has is
// refused rather than cast.
TEST(RuntimeTest, CapabilitiesOfAPhysicalDevice) {
  PhysicalDeviceInfo d = FakeDevice(0, VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, 0x11);
  d.subgroup_size = 32;
  d.limits.maxComputeWorkGroupInvocations = 1024;
  d.limits.maxComputeWorkGroupSize[0] = 1024;
  d.limits.maxComputeWorkGroupSize[2] = 64;
  d.limits.maxComputeWorkGroupCount[1] = 65535;
  // Storage buffers: the least of the per-stage, per-set, per-stage-resource
  // and (with push descriptors) pushed-set limits.
  d.limits.maxPerStageDescriptorStorageBuffers = 96;
  d.limits.maxDescriptorSetStorageBuffers = 200;
  d.limits.maxPerStageResources = 300;
  d.push_descriptor = true;
  d.max_push_descriptors = 32;
  EXPECT_EQ(CapabilitiesOf(d).max_storage_buffers, 32u);
  d.max_push_descriptors = 128;
  EXPECT_EQ(CapabilitiesOf(d).max_storage_buffers, 96u);
  d.push_descriptor = false;
  d.limits.maxPerStageResources = 50;
  EXPECT_EQ(CapabilitiesOf(d).max_storage_buffers, 50u);
  const DeviceCapabilities c = CapabilitiesOf(d);
  EXPECT_EQ(c.name, "dev0");
  EXPECT_EQ(c.kind, DeviceKind::kDiscreteGpu);
  EXPECT_STREQ(DeviceKindName(c.kind), "discrete-gpu");
  EXPECT_EQ(c.subgroup_size, 32u);
  EXPECT_EQ(c.max_workgroup_invocations, 1024u);
  EXPECT_EQ(c.max_workgroup_size, (std::array<uint32_t, 3>{1024, 0, 64}));
  EXPECT_EQ(c.max_workgroup_count, (std::array<uint32_t, 3>{0, 65535, 0}));
  for (VkPhysicalDeviceType t : {VK_PHYSICAL_DEVICE_TYPE_OTHER, VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU,
                                 VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU, VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU,
                                 VK_PHYSICAL_DEVICE_TYPE_CPU}) {
    ASSERT_TRUE(DeviceKindFromValue(t).has_value());
    EXPECT_STREQ(DeviceKindName(*DeviceKindFromValue(t)), DeviceTypeName(t));
  }
  EXPECT_EQ(DeviceKindFromValue(5), std::nullopt);
  EXPECT_EQ(DeviceKindFromValue(-1), std::nullopt);
  d.type = static_cast<VkPhysicalDeviceType>(0x7FFFFFFF);
  EXPECT_EQ(CapabilitiesOf(d).kind, DeviceKind::kOther);
}

// Tests that the accelerator count, budget and ring size come from the
// environment when the options leave them unset, and bad values are refused.
TEST(RuntimeTest, EnvironmentSettings) {
  setenv("CAUSEWAY_ACCELERATORS", "3", 1);
  setenv("CAUSEWAY_MEMORY_BUDGET", "64MiB", 1);
  setenv("CAUSEWAY_RING_SLOTS", "5", 1);
  RuntimeOptions o = TestOptions(0);
  auto rt = MakeRuntime(o);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->size(), 3u);
  EXPECT_EQ(rt->accelerator(2)->memory_budget(), 64u << 20);
  EXPECT_EQ(rt->accelerator(0)->ring_capacity(), 5u);
  setenv("CAUSEWAY_ACCELERATORS", "many", 1);
  auto bad = Runtime::Create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  unsetenv("CAUSEWAY_ACCELERATORS");
  unsetenv("CAUSEWAY_MEMORY_BUDGET");
  unsetenv("CAUSEWAY_RING_SLOTS");
  o.accelerators = 300;
  EXPECT_TRUE(absl::IsInvalidArgument(Runtime::Create(o).status()));
}

// Tests the copy engine's setting: off by default on a CPU driver (the engine
// would share the kernels' cores), a size from the options or
// CAUSEWAY_COPY_ENGINE, "off", and a clear refusal of anything else.
TEST(RuntimeTest, CopyEngineSetting) {
  RuntimeOptions o = TestOptions(2);
  auto rt = MakeRuntime(o);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->plan().copy_engine_min_bytes, UINT64_MAX);
  ASSERT_NE(rt->accelerator(1)->copy_engine(), nullptr) << "lavapipe's device memory is host-coherent";
  EXPECT_FALSE(rt->accelerator(1)->UsesCopyEngine(uint64_t{1} << 40));
  rt.reset();

  o.copy_engine = "1MiB";
  rt = MakeRuntime(o);
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->plan().copy_engine_min_bytes, 1u << 20);
  EXPECT_TRUE(rt->accelerator(0)->UsesCopyEngine(1u << 20));
  EXPECT_FALSE(rt->accelerator(0)->UsesCopyEngine((1u << 20) - 1));
  rt.reset();

  o.copy_engine.clear();
  setenv("CAUSEWAY_COPY_ENGINE", "64KiB", 1);
  auto plan = Runtime::Plan(*Instance::Create({}).value(), o);
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->copy_engine_min_bytes, 64u << 10);
  setenv("CAUSEWAY_COPY_ENGINE", "off", 1);
  plan = Runtime::Plan(*Instance::Create({}).value(), o);
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->copy_engine_min_bytes, UINT64_MAX);
  setenv("CAUSEWAY_COPY_ENGINE", "sometimes", 1);
  plan = Runtime::Plan(*Instance::Create({}).value(), o);
  unsetenv("CAUSEWAY_COPY_ENGINE");
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("CAUSEWAY_COPY_ENGINE"));
}

// Tests that lavapipe (one queue per device) gets one VkDevice per
// accelerator, that insisting on queues of one device is refused clearly,
// and that the default budget divides the heap among accelerators.
TEST(RuntimeTest, LayoutAndDefaultBudget) {
  auto rt = MakeRuntime(2);
  ASSERT_NE(rt, nullptr);
  EXPECT_FALSE(rt->plan().shared_device);
  EXPECT_NE(&rt->accelerator(0)->device(), &rt->accelerator(1)->device());
  EXPECT_EQ(rt->accelerator(0)->memory_budget(), rt->plan().device->DeviceLocalHeapSize() / 2);
  EXPECT_EQ(rt->plan().copy_path, CopyPath::kExternalMemory);
  RuntimeOptions o = TestOptions(2);
  o.sharing = "queues";
  auto queues = Runtime::Create(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(queues.status())) << queues.status();
  EXPECT_THAT(std::string(queues.status().message()), HasSubstr("compute queues"));
}

// Tests the sharing setting: "one-device" puts every accelerator on one
// VkDevice (sharing lavapipe's one queue), CAUSEWAY_SHARING chooses when the
// options say "auto" and never over an explicit choice, and anything else is
// refused naming both places it may come from.
TEST(RuntimeTest, SharingSetting) {
  RuntimeOptions o = TestOptions(3);
  o.sharing = "one-device";
  auto rt = MakeRuntime(o);
  ASSERT_NE(rt, nullptr);
  EXPECT_TRUE(rt->plan().shared_device);
  EXPECT_EQ(&rt->accelerator(0)->device(), &rt->accelerator(2)->device());
  EXPECT_EQ(rt->accelerator(0)->PathFrom(*rt->accelerator(1)), CopyPath::kSameDevice);
  rt.reset();

  o.sharing = "auto";
  setenv("CAUSEWAY_SHARING", "one-device", 1);
  auto plan = Runtime::Plan(*Instance::Create({}).value(), o);
  ASSERT_OK(plan.status());
  EXPECT_TRUE(plan->shared_device);
  o.sharing = "devices";
  plan = Runtime::Plan(*Instance::Create({}).value(), o);
  ASSERT_OK(plan.status());
  EXPECT_FALSE(plan->shared_device);
  o.sharing = "auto";
  setenv("CAUSEWAY_SHARING", "everything", 1);
  plan = Runtime::Plan(*Instance::Create({}).value(), o);
  unsetenv("CAUSEWAY_SHARING");
  EXPECT_TRUE(absl::IsInvalidArgument(plan.status())) << plan.status();
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("CAUSEWAY_SHARING"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("'everything'"));
  plan = Runtime::Plan(*Instance::Create({}).value(), o);
  ASSERT_OK(plan.status());
  EXPECT_FALSE(plan->shared_device);
}

// Tests that with tracing on, every dispatch of a replayed list gets a device
// timestamp span and the host spans are recorded; with tracing off, none.
TEST(RuntimeTest, TracingRecordsDeviceAndHostSpans) {
  auto rt = MakeRuntime(1);
  ASSERT_NE(rt, nullptr);
  Accelerator* acc = rt->accelerator(0);
  ASSERT_OK_AND_ASSIGN(auto x, acc->CreateBuffer(1024));
  ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList("traced"));
  ASSERT_OK(ops::FillWords(*list, x, 256, 1));
  ASSERT_OK(ops::Scale(*list, x, x, 256, 2.0f));

  Tracer& tracer = Tracer::Get();
  tracer.Take();
  tracer.Enable(false);
  ASSERT_OK(acc->Submit(list).Await());
  EXPECT_TRUE(tracer.Take().empty());

  tracer.Enable(true);
  int64_t before = Tracer::NowNs();
  for (int i = 0; i < 3; ++i) ASSERT_OK(acc->Submit(list).Await());
  int64_t after = Tracer::NowNs();
  tracer.Enable(false);
  std::vector<TraceEvent> events = tracer.Take();
  int fills = 0, scales = 0, submits = 0;
  for (const TraceEvent& e : events) {
    if (e.kind == TraceEvent::kDevice) {
      EXPECT_EQ(e.track, 0);
      EXPECT_LE(e.begin_ns, e.end_ns);
      // lavapipe's timestamps are CLOCK_MONOTONIC, like the host's.
      EXPECT_GE(e.begin_ns, before);
      EXPECT_LE(e.end_ns, after);
      fills += e.name == "fill";
      scales += e.name == "scale";
    } else {
      submits += e.name == "submit";
    }
  }
  EXPECT_EQ(fills, 3);
  EXPECT_EQ(scales, 3);
  EXPECT_EQ(submits, 3);
}

// Tests that the pipeline cache is written to disk and read back by a new
// runtime, and that a corrupt cache file is ignored rather than trusted.
TEST(RuntimeTest, PipelineCacheOnDisk) {
  std::string dir = ::testing::TempDir() + "/causeway-cache-test";
  std::filesystem::remove_all(dir);
  RuntimeOptions o = TestOptions(1);
  o.pipeline_cache_dir = dir;
  std::string path;
  {
    auto rt = MakeRuntime(o);
    ASSERT_NE(rt, nullptr);
    Accelerator* acc = rt->accelerator(0);
    ASSERT_OK_AND_ASSIGN(auto x, acc->CreateBuffer(1024));
    ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList());
    ASSERT_OK(ops::FillWords(*list, x, 256, 1));
    path = acc->device().pipeline_cache_path();
    EXPECT_THAT(path, HasSubstr(dir));
  }
  ASSERT_TRUE(std::filesystem::exists(path));
  // lavapipe keeps only the header in its VkPipelineCache (Mesa caches
  // shaders on its own); a GPU driver adds its pipelines after it.
  ASSERT_GE(std::filesystem::file_size(path), sizeof(VkPipelineCacheHeaderVersionOne));
  {
    std::ifstream in(path, std::ios::binary);
    VkPipelineCacheHeaderVersionOne header{};
    in.read(reinterpret_cast<char*>(&header), sizeof(header));
    EXPECT_EQ(header.headerVersion, VK_PIPELINE_CACHE_HEADER_VERSION_ONE);
  }
  // Runs a fill of `word` on a runtime made with `o` and checks what it
  // wrote: the pipeline made from (or despite) the cache on disk works.
  auto fill_and_check = [&](uint32_t word) {
    auto rt = MakeRuntime(o);
    ASSERT_NE(rt, nullptr);
    Accelerator* acc = rt->accelerator(0);
    EXPECT_EQ(acc->device().pipeline_cache_path(), path);
    ASSERT_OK_AND_ASSIGN(auto x, acc->CreateBuffer(1024));
    ASSERT_OK_AND_ASSIGN(auto list, acc->CreateCommandList());
    ASSERT_OK(ops::FillWords(*list, x, 256, word));
    ASSERT_OK(acc->Submit(list).Await());
    std::vector<uint32_t> got(256);
    ASSERT_OK(acc->DownloadSync(x, got.data(), 1024));
    EXPECT_EQ(got, std::vector<uint32_t>(256, word));
  };
  // The cache is read back (same path) and its pipeline runs.
  fill_and_check(0x5eed0001u);
  {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a pipeline cache at all, just bytes";
    // A corrupt cache is dropped, not fatal: the fill still runs ...
    fill_and_check(0x5eed0002u);
    // ... and the runtime saved a valid cache in its place.
    std::ifstream in(path, std::ios::binary);
    VkPipelineCacheHeaderVersionOne header{};
    in.read(reinterpret_cast<char*>(&header), sizeof(header));
    EXPECT_TRUE(in.good());
    EXPECT_EQ(header.headerVersion, VK_PIPELINE_CACHE_HEADER_VERSION_ONE);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace causeway
