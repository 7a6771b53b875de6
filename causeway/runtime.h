// Every public header of causeway::runtime (link that target, or causeway::causeway).
// The Vulkan layer: instances, devices, accelerators, memory, kernels, command lists, the copy engine, the
// watchdog.
#ifndef CAUSEWAY_RUNTIME_H_
#define CAUSEWAY_RUNTIME_H_

#include "causeway/runtime/accelerator.h"       // IWYU pragma: export
#include "causeway/runtime/command_list.h"      // IWYU pragma: export
#include "causeway/runtime/copy_engine.h"       // IWYU pragma: export
#include "causeway/runtime/device.h"            // IWYU pragma: export
#include "causeway/runtime/glsl_compiler.h"     // IWYU pragma: export
#include "causeway/runtime/host_budget.h"       // IWYU pragma: export
#include "causeway/runtime/instance.h"          // IWYU pragma: export
#include "causeway/runtime/kernel.h"            // IWYU pragma: export
#include "causeway/runtime/kernel_admission.h"  // IWYU pragma: export
#include "causeway/runtime/memory.h"            // IWYU pragma: export
#include "causeway/runtime/runtime.h"           // IWYU pragma: export
#include "causeway/runtime/spirv_reflect.h"     // IWYU pragma: export
#include "causeway/runtime/suballocator.h"      // IWYU pragma: export
#include "causeway/runtime/vk_status.h"         // IWYU pragma: export
#include "causeway/runtime/watchdog.h"          // IWYU pragma: export

#endif  // CAUSEWAY_RUNTIME_H_
