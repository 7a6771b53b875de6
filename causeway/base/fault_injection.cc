#include "causeway/base/fault_injection.h"

#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace causeway {
namespace {

// Whether any point is being counted; read first, so that off is one load.
std::atomic<bool> g_active{false};
std::atomic<int64_t> g_calls[kFaultPointCount];
// The armed point (-1: none) and the call that fails.
std::atomic<int> g_armed_point{-1};
std::atomic<int64_t> g_armed_call{0};
std::atomic<bool> g_injected{false};

void ResetCounts() {
  for (auto& c : g_calls) c.store(0);
  g_injected.store(false);
}

}  // namespace

const char* FaultPointName(FaultPoint point) {
  switch (point) {
    case FaultPoint::kAllocation:
      return "allocation";
    case FaultPoint::kSubmission:
      return "submission";
    case FaultPoint::kSend:
      return "send";
    case FaultPoint::kReceive:
      return "receive";
    case FaultPoint::kDeviceWait:
      return "device-wait";
    case FaultPoint::kFileWrite:
      return "file-write";
  }
  return "unknown";
}

void CountFaultPoints() {
  g_armed_point.store(-1);
  ResetCounts();
  g_active.store(true);
}

void ArmFault(FaultPoint point, int64_t nth) {
  g_active.store(false);
  ResetCounts();
  g_armed_call.store(nth);
  g_armed_point.store(static_cast<int>(point));
  g_active.store(true);
}

void DisarmFaults() {
  g_active.store(false);
  g_armed_point.store(-1);
}

int64_t FaultPointCalls(FaultPoint point) { return g_calls[static_cast<int>(point)].load(); }

bool FaultInjected() { return g_injected.load(); }

absl::Status ArmFaultFromString(absl::string_view spec) {
  if (spec.empty()) {
    DisarmFaults();
    return absl::OkStatus();
  }
  std::pair<std::string, std::string> parts = absl::StrSplit(spec, absl::MaxSplits(':', 1));
  int64_t nth = 0;
  if (!absl::SimpleAtoi(parts.second, &nth) || nth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("fault '", spec, "': expected POINT:N with N >= 1, e.g. send:7"));
  }
  for (int p = 0; p < kFaultPointCount; ++p) {
    if (parts.first == FaultPointName(static_cast<FaultPoint>(p))) {
      ArmFault(static_cast<FaultPoint>(p), nth);
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("fault '", spec, "': unknown point '", parts.first,
                   "'; expected allocation, submission, send, receive, device-wait or file-write"));
}

bool ShouldInjectFault(FaultPoint point) {
  if (!g_active.load(std::memory_order_relaxed)) return false;
  const int index = static_cast<int>(point);
  const int64_t call = g_calls[index].fetch_add(1) + 1;
  if (g_armed_point.load() != index || call != g_armed_call.load()) return false;
  g_injected.store(true);
  return true;
}

absl::Status InjectedFaultError(absl::StatusCode code, FaultPoint point, absl::string_view what) {
  return absl::Status(code, absl::StrCat(what, " (injected fault: ", FaultPointName(point), " ",
                                         g_armed_call.load(), ")"));
}

}  // namespace causeway
