// Every public header of causeway::transport (link that target, or causeway::causeway).
// The DCN transport: sockets, frames, auth, the handshake, connections, launching island processes.
#ifndef CAUSEWAY_TRANSPORT_H_
#define CAUSEWAY_TRANSPORT_H_

#include "causeway/transport/auth.h"        // IWYU pragma: export
#include "causeway/transport/bytes.h"       // IWYU pragma: export
#include "causeway/transport/connection.h"  // IWYU pragma: export
#include "causeway/transport/frame.h"       // IWYU pragma: export
#include "causeway/transport/handshake.h"   // IWYU pragma: export
#include "causeway/transport/launch.h"      // IWYU pragma: export
#include "causeway/transport/socket.h"      // IWYU pragma: export

#endif  // CAUSEWAY_TRANSPORT_H_
