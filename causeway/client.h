// Every public header of causeway::client (link that target, or causeway::causeway).
// One client API over an island of this process (LocalClient) and island servers (RemoteClient).
#ifndef CAUSEWAY_CLIENT_H_
#define CAUSEWAY_CLIENT_H_

#include "causeway/client/client.h"         // IWYU pragma: export
#include "causeway/client/local_client.h"   // IWYU pragma: export
#include "causeway/client/remote_client.h"  // IWYU pragma: export

#endif  // CAUSEWAY_CLIENT_H_
