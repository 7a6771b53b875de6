#include "causeway/runtime/runtime.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/runtime/memory.h"

namespace causeway {
namespace {

int TypeRank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return 3;
    default:
      return 4;
  }
}

std::string DeviceList(const std::vector<PhysicalDeviceInfo>& devices) {
  std::vector<std::string> parts;
  for (const auto& d : devices) {
    parts.push_back(absl::StrCat(d.index, ": ", d.name, " (", DeviceTypeName(d.type), ", ", d.UuidString(), ")"));
  }
  return parts.empty() ? "none" : absl::StrJoin(parts, "; ");
}

}  // namespace

absl::StatusOr<const PhysicalDeviceInfo*> SelectPhysicalDevice(const std::vector<PhysicalDeviceInfo>& devices,
                                                               const std::string& selector_in) {
  if (devices.empty()) {
    return absl::NotFoundError(
        "no Vulkan device found (install a driver; for a CPU driver on Debian: mesa-vulkan-drivers)");
  }
  std::string selector = absl::AsciiStrToLower(absl::StripAsciiWhitespace(selector_in));
  const PhysicalDeviceInfo* best = nullptr;
  auto consider = [&](const PhysicalDeviceInfo& d) {
    if (best == nullptr || TypeRank(d.type) < TypeRank(best->type)) best = &d;
  };
  if (selector.empty() || selector == "auto") {
    for (const auto& d : devices) consider(d);
    return best;
  }
  auto type_match = [&](VkPhysicalDeviceType t) {
    if (selector == "gpu") {
      return t == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU || t == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ||
             t == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU;
    }
    if (selector == "discrete") return t == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
    if (selector == "integrated") return t == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
    if (selector == "virtual") return t == VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU;
    if (selector == "cpu") return t == VK_PHYSICAL_DEVICE_TYPE_CPU;
    return false;
  };
  if (selector == "gpu" || selector == "discrete" || selector == "integrated" || selector == "virtual" ||
      selector == "cpu") {
    for (const auto& d : devices) {
      if (type_match(d.type)) consider(d);
    }
    if (best == nullptr) {
      return absl::NotFoundError(absl::StrCat("no device of type '", selector, "'; devices: ", DeviceList(devices)));
    }
    return best;
  }
  uint32_t index;
  if (selector.size() < 4 && absl::SimpleAtoi(selector, &index)) {
    if (index >= devices.size()) {
      return absl::NotFoundError(absl::StrCat("no device ", index, "; devices: ", DeviceList(devices)));
    }
    return &devices[index];
  }
  std::string uuid = absl::StrReplaceAll(selector, {{"-", ""}, {"uuid:", ""}});
  for (const auto& d : devices) {
    if (d.UuidString() == uuid) return &d;
  }
  return absl::NotFoundError(absl::StrCat("no device matches '", selector_in,
                                          "' (auto, gpu, discrete, integrated, virtual, cpu, an index or a "
                                          "UUID); devices: ",
                                          DeviceList(devices)));
}

absl::StatusOr<RuntimePlan> Runtime::Plan(const Instance& instance, const RuntimeOptions& options) {
  RuntimePlan plan;
  std::string selector = options.device.empty() ? EnvString("CAUSEWAY_DEVICE") : options.device;
  CAUSEWAY_ASSIGN_OR_RETURN(plan.device, SelectPhysicalDevice(instance.physical_devices(), selector));

  plan.accelerators = options.accelerators;
  if (plan.accelerators == 0) {
    std::string n = EnvString("CAUSEWAY_ACCELERATORS");
    plan.accelerators = 1;
    if (!n.empty() && !absl::SimpleAtoi(n, &plan.accelerators)) {
      return absl::InvalidArgumentError(absl::StrCat("CAUSEWAY_ACCELERATORS='", n, "' is not a number"));
    }
  }
  if (plan.accelerators < 1 || plan.accelerators > 256) {
    return absl::InvalidArgumentError(absl::StrCat("accelerator count must be 1..256, got ", plan.accelerators));
  }

  int family = plan.device->ComputeQueueFamily();
  if (family < 0) return absl::FailedPreconditionError(absl::StrCat(plan.device->name, " has no compute queue"));
  uint32_t queues = plan.device->queue_families[family].queue_count;
  std::string sharing = options.sharing;
  if (sharing.empty() || sharing == "auto") sharing = EnvString("CAUSEWAY_SHARING");
  if (sharing == "one-device") {
    // Every accelerator on one VkDevice, over as many of its queues as it
    // has (several accelerators to a queue where it has fewer).
    plan.shared_device = plan.accelerators > 1;
  } else if (sharing == "queues") {
    if (queues < static_cast<uint32_t>(plan.accelerators)) {
      return absl::FailedPreconditionError(absl::StrCat(plan.device->name, " has ", queues,
                                                        " compute queues, fewer than ", plan.accelerators,
                                                        " accelerators"));
    }
    plan.shared_device = true;
  } else if (sharing == "devices" || sharing == "auto" || sharing.empty()) {
    plan.shared_device = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharing (--sharing, CAUSEWAY_SHARING) must be auto, devices, queues or one-device, got '", sharing,
        "'"));
  }

  plan.memory_budget = options.memory_budget;
  if (plan.memory_budget == 0) {
    std::string b = EnvString("CAUSEWAY_MEMORY_BUDGET");
    if (!b.empty()) {
      auto parsed = ParseByteSize(b);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("CAUSEWAY_MEMORY_BUDGET: ", parsed.status().message()));
      }
      plan.memory_budget = *parsed;
    } else {
      plan.memory_budget = plan.device->DeviceLocalHeapSize() / plan.accelerators;
    }
  }
  if (plan.memory_budget == 0) return absl::InvalidArgumentError("memory budget must be > 0");

  plan.ring_capacity = options.ring_capacity;
  if (plan.ring_capacity == 0) {
    std::string r = EnvString("CAUSEWAY_RING_SLOTS");
    plan.ring_capacity = 64;
    if (!r.empty() && (!absl::SimpleAtoi(r, &plan.ring_capacity) || plan.ring_capacity == 0)) {
      return absl::InvalidArgumentError(absl::StrCat("CAUSEWAY_RING_SLOTS='", r, "' is not a positive number"));
    }
  }

  std::string engine = options.copy_engine.empty() ? EnvString("CAUSEWAY_COPY_ENGINE") : options.copy_engine;
  if (engine.empty()) {
    // On a CPU driver the engine's memcpy and the kernels share the same
    // cores, so moving a copy off the queue frees nothing (measured: 0.9-1.0
    // of copies in the list, causeway_ici_bench --only=overlap); a GPU's host
    // is otherwise idle while it computes.
    engine = plan.device->type == VK_PHYSICAL_DEVICE_TYPE_CPU ? "off" : "4MiB";
  }
  if (engine != "off") {
    auto parsed = ParseByteSize(engine);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy engine threshold (CAUSEWAY_COPY_ENGINE) must be a size or 'off': ", parsed.status().message()));
    }
    plan.copy_engine_min_bytes = *parsed;
  }

  const std::string memory =
      options.device_memory.empty() ? EnvString("CAUSEWAY_DEVICE_MEMORY") : options.device_memory;
  if (memory == "discrete") {
    plan.discrete_memory = true;
  } else if (!memory.empty() && memory != "auto") {
    return absl::InvalidArgumentError(absl::StrCat(
        "device memory (--device-memory, CAUSEWAY_DEVICE_MEMORY) must be auto or discrete, got '", memory,
        "'"));
  }

  if (plan.accelerators == 1) {
    plan.copy_path = CopyPath::kSameQueue;
  } else if (plan.shared_device) {
    plan.copy_path = CopyPath::kSameDevice;
  } else if (options.use_external_memory && plan.device->external_memory_fd) {
    plan.copy_path = CopyPath::kExternalMemory;
  } else {
    plan.copy_path = CopyPath::kHostStaged;
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const RuntimeOptions& options) {
  if (options.watchdog <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the watchdog's period must be > 0, got ", absl::FormatDuration(options.watchdog)));
  }
  std::unique_ptr<Runtime> rt(new Runtime());
  InstanceOptions instance_options;
  instance_options.validation = options.validation;
  CAUSEWAY_ASSIGN_OR_RETURN(rt->instance_, Instance::Create(instance_options));
  CAUSEWAY_ASSIGN_OR_RETURN(rt->plan_, Plan(*rt->instance_, options));
  const RuntimePlan& plan = rt->plan_;

  DeviceOptions device_options;
  device_options.use_push_descriptors = options.use_push_descriptors;
  device_options.enable_external_memory = options.use_external_memory;
  device_options.pipeline_cache_dir = options.pipeline_cache_dir;
  AcceleratorOptions accel_options;
  accel_options.memory_budget = plan.memory_budget;
  accel_options.ring_capacity = plan.ring_capacity;
  accel_options.exportable_memory = plan.copy_path == CopyPath::kExternalMemory;
  accel_options.copy_engine_min_bytes = plan.copy_engine_min_bytes;
  accel_options.host_maps_device_memory = !plan.discrete_memory;

  std::shared_ptr<Device> shared;
  if (plan.shared_device) {
    const uint32_t offered = plan.device->queue_families[plan.device->ComputeQueueFamily()].queue_count;
    device_options.queue_count = std::min(static_cast<uint32_t>(plan.accelerators), offered);
    CAUSEWAY_ASSIGN_OR_RETURN(shared, Device::Create(rt->instance_, *plan.device, device_options));
  }
  for (int i = 0; i < plan.accelerators; ++i) {
    std::shared_ptr<Device> device = shared;
    uint32_t queue = plan.shared_device ? static_cast<uint32_t>(i) % shared->queue_count() : 0;
    if (!plan.shared_device) {
      device_options.queue_count = 1;
      CAUSEWAY_ASSIGN_OR_RETURN(device, Device::Create(rt->instance_, *plan.device, device_options));
    }
    CAUSEWAY_ASSIGN_OR_RETURN(auto accel, Accelerator::Create(i, device, queue, accel_options));
    rt->accelerators_.push_back(std::move(accel));
  }
  // A freed block is dropped from every peer's import cache.
  for (auto& owner : rt->accelerators_) {
    std::vector<ImportCache*> peers;
    for (auto& peer : rt->accelerators_) {
      if (peer != owner) peers.push_back(peer->imports_for_peers());
    }
    owner->device_pool().AddBlockFreedListener([peers](uint64_t id) {
      for (ImportCache* c : peers) c->Drop(id);
    });
  }
  if (options.watchdog != absl::InfiniteDuration()) {
    rt->watchdog_ = std::make_unique<Watchdog>(rt->accelerators(), options.watchdog);
  }
  return rt;
}

Runtime::~Runtime() {
  // Finish all work first, so no accelerator is freed while a peer still
  // reads its memory or waits on its relay.
  for (auto& a : accelerators_) (void)a->Flush(absl::Now() + absl::Seconds(30));
  // Copy engines wait on peers' work and hold peers' buffers: stop them all
  // while every accelerator is still there.
  for (auto& a : accelerators_) a->StopCopyEngine();
  // A failed accelerator keeps the recordings of its failed work until its
  // queue drains, and they may bind peers' buffers: drop them all while
  // every accelerator is still there.
  for (auto& a : accelerators_) a->ReleaseFailedWork();
  // Listeners point at peers' import caches: unhook them all before any
  // accelerator goes, and drop the imports while every pool is still there.
  for (auto& a : accelerators_) a->device_pool().ClearBlockFreedListeners();
  for (auto& a : accelerators_) a->imports_for_peers()->Clear();
  watchdog_.reset();
  accelerators_.clear();
}

std::vector<Accelerator*> Runtime::accelerators() const {
  std::vector<Accelerator*> out;
  for (const auto& a : accelerators_) out.push_back(a.get());
  return out;
}

}  // namespace causeway
