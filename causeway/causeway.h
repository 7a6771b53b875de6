// Everything: every component's umbrella header (link causeway::causeway).
#ifndef CAUSEWAY_CAUSEWAY_H_
#define CAUSEWAY_CAUSEWAY_H_

#include "causeway/base.h"         // IWYU pragma: export
#include "causeway/client.h"       // IWYU pragma: export
#include "causeway/distributed.h"  // IWYU pragma: export
#include "causeway/kernels.h"      // IWYU pragma: export
#include "causeway/models.h"       // IWYU pragma: export
#include "causeway/runtime.h"      // IWYU pragma: export
#include "causeway/scheduler.h"    // IWYU pragma: export
#include "causeway/transport.h"    // IWYU pragma: export

#endif  // CAUSEWAY_CAUSEWAY_H_
