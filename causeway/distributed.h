// Every public header of causeway::distributed (link that target, or causeway::causeway).
// The island service: island servers, the controller that drives them, island processes.
#ifndef CAUSEWAY_DISTRIBUTED_H_
#define CAUSEWAY_DISTRIBUTED_H_

#include "causeway/distributed/controller.h"      // IWYU pragma: export
#include "causeway/distributed/island_process.h"  // IWYU pragma: export
#include "causeway/distributed/island_server.h"   // IWYU pragma: export

#endif  // CAUSEWAY_DISTRIBUTED_H_
