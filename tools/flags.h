// A small flag parser for the causeway subcommands: --name=value, --name value,
// --flag / --no-flag. Unknown flags are errors. Every command has --help and
// --trace FILE.
#ifndef CAUSEWAY_TOOLS_FLAGS_H_
#define CAUSEWAY_TOOLS_FLAGS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "causeway/base/trace.h"
#include "causeway/distributed/controller.h"
#include "causeway/runtime/runtime.h"
#include "causeway/transport/auth.h"

namespace causeway::cli {

struct FlagSpec {
  std::string name;
  std::string help;
  std::string default_value;  // "" = unset
  bool boolean = false;
};

class Flags {
 public:
  explicit Flags(std::vector<FlagSpec> specs);
  // Parses args (without the program and command names); positional
  // arguments are kept in order.
  absl::Status Parse(const std::vector<std::string>& args);
  std::string Get(const std::string& name) const;
  bool Bool(const std::string& name) const;
  absl::StatusOr<int64_t> Int(const std::string& name) const;
  // A finite duration > 0 such as 30s, 500ms or 1h30m; InvalidArgument
  // naming the flag otherwise.
  absl::StatusOr<absl::Duration> Duration(const std::string& name) const;
  bool Has(const std::string& name) const;  // given on the command line
  const std::vector<std::string>& positional() const { return positional_; }
  std::string Help() const;
  // Every command takes --trace FILE (added by the constructor, as --help
  // is): starts a trace session writing FILE when it was given, else null.
  absl::StatusOr<std::unique_ptr<TraceSession>> StartTrace() const;

 private:
  const FlagSpec* Find(const std::string& name) const;
  std::vector<FlagSpec> specs_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

// Prints "causeway COMMAND: MESSAGE" on stderr (the status's message) and
// returns `code`: how every command reports an error.
int Fail(absl::string_view command, absl::string_view message, int code);
int Fail(absl::string_view command, const absl::Status& status, int code);

// A command's positional arguments: exactly `count` of them, named by `what`
// ("PROGRAM file") in the error when there are not, which ends with `hint`
// (by default, a pointer to the command's --help).
struct Positional {
  size_t count = 0;
  std::string what;
  std::string hint;
};

// The start every command shares: parses `args` into `flags`; with --help
// prints `usage` and the flags' help; then checks the positional arguments
// against `positional` (none by default). Returns the exit code to end
// with (0 after --help; 2 after a usage error, said on stderr as Fail
// does), or nullopt to go on.
std::optional<int> StartCommand(absl::string_view command, absl::string_view usage, Flags& flags,
                                const std::vector<std::string>& args, const Positional& positional = {});

// The flags every command that makes accelerators takes.
std::vector<FlagSpec> RuntimeFlagSpecs();
absl::StatusOr<RuntimeOptions> RuntimeOptionsFromFlags(const Flags& flags);

// The shared secret of a command that takes --secret-file: the file if the
// flag is given, else CAUSEWAY_SECRET if set, else none. A file or variable
// that does not hold a usable secret is an error (causeway/transport/auth.h says why).
absl::StatusOr<std::optional<transport::Secret>> SecretFromFlags(const Flags& flags);

// A controller's options for a command that takes --connect: told to the
// islands as `name`, with the secret of SecretFromFlags.
absl::StatusOr<transport::ControllerOptions> ControllerOptionsFromFlags(const Flags& flags,
                                                                        const std::string& name);

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_FLAGS_H_
