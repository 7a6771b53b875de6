// The process environment as Causeway reads it: every CAUSEWAY_* setting
// that a flag can also give goes through these two.
#ifndef CAUSEWAY_BASE_ENV_H_
#define CAUSEWAY_BASE_ENV_H_

#include <string>

namespace causeway {

// True when the environment variable `name` is set to 1/true/yes/on (in any
// case).
bool EnvFlag(const char* name);

// The value of the environment variable `name`, or "" when it is not set.
std::string EnvString(const char* name);

}  // namespace causeway

#endif  // CAUSEWAY_BASE_ENV_H_
