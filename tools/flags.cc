#include "tools/flags.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/status.h"
#include "causeway/runtime/memory.h"

namespace causeway::cli {

Flags::Flags(std::vector<FlagSpec> specs) : specs_(std::move(specs)) {
  specs_.push_back({"trace", "write a Chrome trace of the command to FILE (docs/trace-format.md)", ""});
  specs_.push_back({"help", "show this help", "", true});
}

int Fail(absl::string_view command, absl::string_view message, int code) {
  std::fprintf(stderr, "causeway %s: %s\n", std::string(command).c_str(), std::string(message).c_str());
  return code;
}

int Fail(absl::string_view command, const absl::Status& status, int code) {
  return Fail(command, status.message(), code);
}

std::optional<int> StartCommand(absl::string_view command, absl::string_view usage, Flags& flags,
                                const std::vector<std::string>& args, const Positional& positional) {
  if (absl::Status s = flags.Parse(args); !s.ok()) return Fail(command, s, 2);
  if (flags.Bool("help")) {
    std::printf("%s%s", std::string(usage).c_str(), flags.Help().c_str());
    return 0;
  }
  const std::vector<std::string>& got = flags.positional();
  if (got.size() == positional.count) return std::nullopt;
  std::string message;
  if (positional.count == 0) {
    message = absl::StrCat("unexpected argument '", got[0], "'");
  } else {
    message = absl::StrCat("expected ", positional.count == 1 ? "one" : absl::StrCat(positional.count), " ",
                           positional.what, ", got ", got.empty() ? "none" : absl::StrCat(got.size()));
  }
  const std::string hint =
      positional.hint.empty() ? absl::StrCat("causeway ", command, " --help") : positional.hint;
  return Fail(command, absl::StrCat(message, " (", hint, ")"), 2);
}

absl::StatusOr<std::unique_ptr<TraceSession>> Flags::StartTrace() const {
  std::string path = Get("trace");
  if (path.empty()) return std::unique_ptr<TraceSession>();
  return TraceSession::Start(path);
}

const FlagSpec* Flags::Find(const std::string& name) const {
  for (const auto& s : specs_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

absl::Status Flags::Parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h") {
      values_["help"] = "true";
      continue;
    }
    if (!absl::StartsWith(a, "--")) {
      positional_.push_back(a);
      continue;
    }
    std::string body = a.substr(2);
    std::string name = body, value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    const FlagSpec* spec = Find(name);
    if (spec == nullptr && absl::StartsWith(name, "no-")) {
      const FlagSpec* neg = Find(name.substr(3));
      if (neg != nullptr && neg->boolean && !has_value) {
        values_[neg->name] = "false";
        continue;
      }
    }
    if (spec == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (spec->boolean) {
      if (has_value && value != "true" && value != "false" && value != "1" && value != "0") {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " takes true or false, got '", value, "'"));
      }
      values_[name] = has_value ? (value == "1" || value == "true" ? "true" : "false") : "true";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = args[++i];
    }
    values_[name] = value;
  }
  return absl::OkStatus();
}

bool Flags::Has(const std::string& name) const { return values_.count(name) > 0; }

std::string Flags::Get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  const FlagSpec* s = Find(name);
  return s == nullptr ? "" : s->default_value;
}

bool Flags::Bool(const std::string& name) const { return Get(name) == "true"; }

absl::StatusOr<absl::Duration> Flags::Duration(const std::string& name) const {
  absl::Duration d;
  const std::string text = Get(name);
  if (!absl::ParseDuration(text, &d)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " wants a duration such as 30s, 500ms or 1h30m, got '", text, "'"));
  }
  if (d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a finite duration > 0, got '", text, "'"));
  }
  return d;
}

absl::StatusOr<int64_t> Flags::Int(const std::string& name) const {
  int64_t v;
  std::string s = Get(name);
  if (!absl::SimpleAtoi(s, &v)) return absl::InvalidArgumentError(absl::StrCat("--", name, " wants a number, got '", s, "'"));
  return v;
}

std::string Flags::Help() const {
  std::string out = "flags:\n";
  for (const auto& s : specs_) {
    std::string lhs = s.boolean ? absl::StrCat("--", s.name) : absl::StrCat("--", s.name, "=VALUE");
    absl::StrAppendFormat(&out, "  %-26s %s%s\n", lhs, s.help,
                          s.default_value.empty() ? "" : absl::StrCat(" (default ", s.default_value, ")"));
  }
  return out;
}

std::vector<FlagSpec> RuntimeFlagSpecs() {
  return {
      {"accelerators", "how many accelerators (env CAUSEWAY_ACCELERATORS)", ""},
      {"device", "auto, gpu, discrete, integrated, cpu, an index or a UUID (env CAUSEWAY_DEVICE)", ""},
      {"memory-budget", "device memory per accelerator, e.g. 512MiB (env CAUSEWAY_MEMORY_BUDGET)", ""},
      {"ring-slots", "in-flight submissions per accelerator (env CAUSEWAY_RING_SLOTS)", ""},
      {"sharing",
       "auto or devices (one VkDevice each), queues (one VkDevice, a queue each), one-device (one VkDevice, "
       "queues shared where fewer; for testing) (env CAUSEWAY_SHARING)",
       "auto"},
      {"validation", "turn on the Vulkan validation layer (env CAUSEWAY_VALIDATION)", "", true},
      {"external-memory", "copy between VkDevices through imported memory (off: through the host)", "true",
       true},
      {"device-memory",
       "auto (as the driver reports: mapped where host-visible) or discrete (never mapped: staging "
       "everywhere, "
       "as on a discrete GPU) (env CAUSEWAY_DEVICE_MEMORY)",
       ""},
      {"copy-engine",
       "move copies of this size or more off the queues, e.g. 4MiB, or off (env CAUSEWAY_COPY_ENGINE)", ""},
      {"watchdog",
       "report an accelerator on stderr and in the trace when it has had work in flight and finished none "
       "for "
       "this long, e.g. 10s, or off",
       "10s"},
  };
}

absl::StatusOr<RuntimeOptions> RuntimeOptionsFromFlags(const Flags& flags) {
  RuntimeOptions o;
  if (!flags.Get("accelerators").empty()) {
    CAUSEWAY_ASSIGN_OR_RETURN(int64_t n, flags.Int("accelerators"));
    if (n < 1 || n > 256) return absl::InvalidArgumentError(absl::StrCat("--accelerators must be 1..256, got ", n));
    o.accelerators = static_cast<int>(n);
  }
  o.device = flags.Get("device");
  if (!flags.Get("memory-budget").empty()) {
    CAUSEWAY_ASSIGN_OR_RETURN(o.memory_budget, ParseByteSize(flags.Get("memory-budget")));
  }
  if (!flags.Get("ring-slots").empty()) {
    CAUSEWAY_ASSIGN_OR_RETURN(int64_t n, flags.Int("ring-slots"));
    if (n < 1 || n > 1 << 20) return absl::InvalidArgumentError("--ring-slots must be 1..1048576");
    o.ring_capacity = static_cast<uint32_t>(n);
  }
  o.sharing = flags.Get("sharing");
  o.validation = flags.Bool("validation");
  o.use_external_memory = flags.Bool("external-memory");
  o.copy_engine = flags.Get("copy-engine");
  o.device_memory = flags.Get("device-memory");
  if (flags.Get("watchdog") == "off") {
    o.watchdog = absl::InfiniteDuration();
  } else {
    CAUSEWAY_ASSIGN_OR_RETURN(o.watchdog, flags.Duration("watchdog"));
  }
  return o;
}

absl::StatusOr<std::optional<transport::Secret>> SecretFromFlags(const Flags& flags) {
  if (flags.Has("secret-file") && !flags.Get("secret-file").empty()) {
    CAUSEWAY_ASSIGN_OR_RETURN(transport::Secret secret,
                              transport::Secret::FromFile(flags.Get("secret-file")));
    return secret;
  }
  absl::StatusOr<transport::Secret> secret = transport::Secret::FromEnvironment();
  if (secret.ok()) return *std::move(secret);
  if (absl::IsNotFound(secret.status())) return std::nullopt;
  return secret.status();
}

absl::StatusOr<transport::ControllerOptions> ControllerOptionsFromFlags(const Flags& flags,
                                                                        const std::string& name) {
  transport::ControllerOptions options;
  options.name = name;
  CAUSEWAY_ASSIGN_OR_RETURN(options.secret, SecretFromFlags(flags));
  return options;
}

}  // namespace causeway::cli
