#include "causeway/base/env.h"

#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"

namespace causeway {

bool EnvFlag(const char* name) {
  const std::string s = absl::AsciiStrToLower(EnvString(name));
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

std::string EnvString(const char* name) { return EnvValue(name).value_or(""); }

std::optional<std::string> EnvValue(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

}  // namespace causeway
