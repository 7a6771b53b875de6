// Every public header of causeway::base (link that target, or causeway::causeway).
// Statuses and their macros, futures, the tracer, fault injection, checked sizes (no Vulkan).
#ifndef CAUSEWAY_BASE_H_
#define CAUSEWAY_BASE_H_

#include "causeway/base/byte_ranges.h"      // IWYU pragma: export
#include "causeway/base/checked_size.h"     // IWYU pragma: export
#include "causeway/base/fault_injection.h"  // IWYU pragma: export
#include "causeway/base/future.h"           // IWYU pragma: export
#include "causeway/base/seconds.h"          // IWYU pragma: export
#include "causeway/base/status.h"           // IWYU pragma: export
#include "causeway/base/trace.h"            // IWYU pragma: export

#endif  // CAUSEWAY_BASE_H_
