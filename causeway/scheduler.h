// Every public header of causeway::scheduler (link that target, or causeway::causeway).
// Islands: meshes, sharded arrays, functions, programs and program defs, collectives, transfers, the gang
// scheduler.
#ifndef CAUSEWAY_SCHEDULER_H_
#define CAUSEWAY_SCHEDULER_H_

#include "causeway/scheduler/array.h"           // IWYU pragma: export
#include "causeway/scheduler/channel.h"         // IWYU pragma: export
#include "causeway/scheduler/collectives.h"     // IWYU pragma: export
#include "causeway/scheduler/dtype.h"           // IWYU pragma: export
#include "causeway/scheduler/executable.h"      // IWYU pragma: export
#include "causeway/scheduler/function.h"        // IWYU pragma: export
#include "causeway/scheduler/gang_scheduler.h"  // IWYU pragma: export
#include "causeway/scheduler/inbox.h"           // IWYU pragma: export
#include "causeway/scheduler/island.h"          // IWYU pragma: export
#include "causeway/scheduler/local_channel.h"   // IWYU pragma: export
#include "causeway/scheduler/mesh.h"            // IWYU pragma: export
#include "causeway/scheduler/program.h"         // IWYU pragma: export
#include "causeway/scheduler/program_def.h"     // IWYU pragma: export
#include "causeway/scheduler/sharding.h"        // IWYU pragma: export
#include "causeway/scheduler/split.h"           // IWYU pragma: export
#include "causeway/scheduler/transfer.h"        // IWYU pragma: export

#endif  // CAUSEWAY_SCHEDULER_H_
