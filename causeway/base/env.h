// The process environment as Causeway reads it: every setting it reads from
// the environment goes through these (the one exception is a shared secret,
// read in place by causeway/transport/auth.cc so that its bytes are never
// copied where they would not be wiped).
#ifndef CAUSEWAY_BASE_ENV_H_
#define CAUSEWAY_BASE_ENV_H_

#include <optional>
#include <string>

namespace causeway {

// True when the environment variable `name` is set to 1/true/yes/on (in any
// case).
bool EnvFlag(const char* name);

// The value of the environment variable `name`, or "" when it is not set.
std::string EnvString(const char* name);

// The value of `name`, or nullopt when it is not set (set to "" is "").
std::optional<std::string> EnvValue(const char* name);

}  // namespace causeway

#endif  // CAUSEWAY_BASE_ENV_H_
