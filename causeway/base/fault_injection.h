// Fault injection: makes the Nth allocation, submission, send or receive in
// this process fail, so that tests can walk N over every such point of a
// program and check that each failure reaches the caller and leaks nothing.
//
// Each point fails the way the real thing does:
//   kAllocation  MemoryPool::CreateBuffer, as if the driver had run out of
//                device memory (ResourceExhausted).
//   kSubmission  Accelerator's vkQueueSubmit, as if it had returned
//                VK_ERROR_OUT_OF_HOST_MEMORY (the accelerator stays usable).
//   kSend        Socket::WriteAll, one message: the connection is reset
//                (shut down both ways, so the peer sees it close too).
//   kReceive     Socket::ReadExact, one message: likewise.
//   kDeviceWait  an accelerator's wait on its timeline, as if the driver had
//                returned VK_ERROR_DEVICE_LOST: that accelerator is
//                quarantined for good (Accelerator::Quarantine), the others
//                go on.
//   kFileWrite   a checkpoint file's write (models/checkpoint.h), one chunk,
//                as if the disk were full (ENOSPC).
//
// Process-wide and thread-safe. Off, a point costs one relaxed atomic load.
// A process can be armed from the environment at start: CAUSEWAY_FAULT=send:7
// (see ArmFaultFromString), which `causeway island` honours.
#ifndef CAUSEWAY_BASE_FAULT_INJECTION_H_
#define CAUSEWAY_BASE_FAULT_INJECTION_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace causeway {

enum class FaultPoint { kAllocation = 0, kSubmission, kSend, kReceive, kDeviceWait, kFileWrite };
inline constexpr int kFaultPointCount = 6;
// "allocation", "submission", "send", "receive", "device-wait", "file-write"
const char* FaultPointName(FaultPoint point);

// Starts counting calls at every point from zero, with no fault armed.
void CountFaultPoints();
// The `nth` call (1 = the next) at `point` from now fails; calls at every
// point are counted from zero again. One fault at a time.
void ArmFault(FaultPoint point, int64_t nth);
// No fault armed and no counting: every point back to one load.
void DisarmFaults();
// Calls made at `point` since the last CountFaultPoints or ArmFault.
int64_t FaultPointCalls(FaultPoint point);
// Whether the armed fault has been injected.
bool FaultInjected();

// "allocation:3", "submission:1", "send:12", "receive:5", "device-wait:2" or "file-write:1"; InvalidArgument
// for anything else. An empty string disarms.
absl::Status ArmFaultFromString(absl::string_view spec);

// The hook the instrumented code calls: true when this call must fail.
bool ShouldInjectFault(FaultPoint point);

// The status an injected fault carries, naming the point and the call.
absl::Status InjectedFaultError(absl::StatusCode code, FaultPoint point, absl::string_view what);

}  // namespace causeway

#endif  // CAUSEWAY_BASE_FAULT_INJECTION_H_
