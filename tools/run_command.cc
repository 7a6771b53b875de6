// causeway run PROGRAM: runs a program file (tools/program_file.h) on an
// island of this process, or with --connect on running island servers,
// through one client API (causeway/client/client.h), and prints its outputs, its rate
// per client and whether its expectations hold; optionally writes the
// outputs and checks the gang order in a trace.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "causeway/base/env.h"
#include "causeway/base/status.h"
#include "causeway/client/remote_client.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "tools/program_file.h"
#include "tools/trace_analysis.h"

namespace causeway::cli {
namespace {

constexpr int kShownValues = 8;

int Fail(const absl::Status& status, int code) { return cli::Fail("run", status, code); }

std::string ValueString(double v, DType dtype) {
  if (dtype == DType::kI32) return absl::StrCat(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

void PrintOutput(const ProgramFileOutput& out) {
  const std::vector<double> values = ElementsAsDoubles(out.bytes, out.dtype);
  double sum = 0;
  for (double v : values) sum += v;
  std::vector<std::string> shown;
  for (size_t i = 0; i < values.size() && i < kShownValues; ++i)
    shown.push_back(ValueString(values[i], out.dtype));
  std::printf("output %s: %s %s checksum %016" PRIx64 " sum %.9g values [%s%s]\n", out.name.c_str(),
              ShapeString(out.shape).c_str(), DTypeName(out.dtype), OutputChecksum(out.bytes), sum,
              absl::StrJoin(shown, ", ").c_str(), values.size() > kShownValues ? ", ..." : "");
}

// Writes each output as DIR/<name>.bin (raw little-endian elements).
absl::Status WriteOutputs(const std::string& dir, const std::vector<ProgramFileOutput>& outputs) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("--outputs: cannot create ", dir, ": ", ec.message()));
  for (const ProgramFileOutput& out : outputs) {
    if (out.name.empty() || out.name == "." || out.name == ".." ||
        out.name.find_first_of("/\\") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--outputs: output '", out.name, "' is not usable as a file name"));
    }
    const std::filesystem::path path = std::filesystem::path(dir) / (out.name + ".bin");
    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    file.write(out.bytes.data(), static_cast<std::streamsize>(out.bytes.size()));
    file.close();
    if (!file) return absl::DataLossError(absl::StrCat("--outputs: cannot write ", path.string()));
  }
  return absl::OkStatus();
}

// A file removed when this goes out of scope (if named).
struct TemporaryFile {
  std::string path;
  TemporaryFile() = default;
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  ~TemporaryFile() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove(path, ec);
  }
};

}  // namespace

int RunCommand(const std::vector<std::string>& args) {
  auto specs = RuntimeFlagSpecs();
  specs.push_back({"runs", "runs per client (default: the file's `runs`)", ""});
  specs.push_back(
      {"clients", "clients of the island, each loading and running the program (default: the file's)", ""});
  specs.push_back({"outputs", "write each output of the last run as DIR/<name>.bin (raw little-endian)", ""});
  specs.push_back(
      {"check-order", "trace the run and check that every accelerator followed the gang order", "", true});
  specs.push_back(
      {"deadline",
       "fail any run that takes longer (e.g. 1s, 500ms), naming what it was doing; an accelerator "
       "its work still holds is quarantined",
       ""});
  specs.push_back({"connect",
                   "run on these running island servers (HOST:PORT,...; see causeway island) instead of an "
                   "island of this process",
                   ""});
  specs.push_back({"secret-file", "shared secret for --connect beyond loopback (or CAUSEWAY_SECRET)", ""});
  Flags flags(specs);
  if (auto done =
          StartCommand("run",
                       "usage: causeway run PROGRAM [--runs N] [--clients N] [--outputs DIR] [--check-order] "
                       "[--deadline D] "
                       "[--connect HOST:PORT,...] [--trace FILE] [flags]\n\n"
                       "Runs a program file (a program, its inputs, how to run it and what it must give;\n"
                       "tools/program_file.proto, examples in examples/) on an island of this process, or\n"
                       "with --connect on running island servers (a mesh that names an island runs on the\n"
                       "island of that name, the others on the first).\n"
                       "Prints each output's shape, dtype, checksum (FNV-1a 64 of its bytes), sum and first\n"
                       "values, each client's runs per second, and whether the file's expectations hold.\n"
                       "Without --accelerators, makes as many accelerators as the file asks for (the\n"
                       "runtime flags are for an island of this process: not with --connect).\n"
                       "Exit 0: ran and as expected; 1: failed or not as expected; 2: usage.\n\n",
                       flags, args, {1, "PROGRAM file"})) {
    return *done;
  }
  int runs = 0, clients = 0;
  for (auto [name, value, max] : {std::make_tuple("runs", &runs, kMaxProgramFileRuns),
                                  std::make_tuple("clients", &clients, kMaxProgramFileClients)}) {
    if (!flags.Has(name)) continue;
    auto n = flags.Int(name);
    if (!n.ok()) return Fail(n.status(), 2);
    if (*n < 1 || *n > max) {
      return Fail(absl::InvalidArgumentError(absl::StrCat("--", name, " must be 1..", max, ", got ", *n)), 2);
    }
    *value = static_cast<int>(*n);
  }
  absl::Duration deadline = absl::InfiniteDuration();
  if (flags.Has("deadline")) {
    auto d = flags.Duration("deadline");
    if (!d.ok()) return Fail(d.status(), 2);
    deadline = *d;
  }
  std::vector<std::string> islands;
  if (flags.Has("connect")) {
    islands = absl::StrSplit(flags.Get("connect"), ',', absl::SkipWhitespace());
    if (islands.empty()) return Fail(absl::InvalidArgumentError("--connect: no HOST:PORT given"), 2);
    // The islands run already: what would make this process's island, and
    // a trace of this process's accelerators, do not apply.
    for (const FlagSpec& spec : RuntimeFlagSpecs()) {
      if (flags.Has(spec.name)) {
        return Fail(
            absl::InvalidArgumentError(absl::StrCat(
                "--", spec.name, " is for an island of this process; the islands of --connect run already")),
            2);
      }
    }
    if (flags.Bool("check-order")) {
      return Fail(
          absl::InvalidArgumentError(
              "--check-order reads this process's trace; with --connect the work runs in the islands' "
              "processes (trace them with causeway island --trace)"),
          2);
    }
  } else if (flags.Has("secret-file")) {
    return Fail(absl::InvalidArgumentError("--secret-file is for --connect"), 2);
  }
  auto options = RuntimeOptionsFromFlags(flags);
  if (!options.ok()) return Fail(options.status(), 2);
  // --check-order needs a trace: to --trace FILE, else to a file of our
  // own, removed on the way out (after the session, declared later, has
  // written it).
  TemporaryFile own_trace;
  auto trace = flags.StartTrace();
  if (!trace.ok()) return Fail(trace.status(), 1);
  if (flags.Bool("check-order") && *trace == nullptr) {
    own_trace.path =
        (std::filesystem::temp_directory_path() / absl::StrCat("causeway-run-", getpid(), ".json")).string();
    trace = TraceSession::Start(own_trace.path);
    if (!trace.ok()) return Fail(trace.status(), 1);
  }

  auto file = ReadProgramFile(flags.positional()[0]);
  if (!file.ok()) return Fail(file.status(), 1);
  if (!flags.Has("accelerators") && EnvString("CAUSEWAY_ACCELERATORS").empty()) {
    options->accelerators = file->accelerators();
  }
  if (runs == 0) runs = file->runs();
  if (clients == 0) clients = file->clients();

  ProgramFileRunOptions run_options;
  run_options.clients = clients;
  run_options.runs = runs;
  // Enough runs in flight for the devices to stay busy, bounded so that
  // the intermediate buffers of queued runs stay small.
  run_options.window = std::clamp(runs, 2, 8);
  run_options.deadline = deadline;
  absl::StatusOr<ProgramFileResult> result;
  size_t accelerators = 0;
  std::string where;
  if (!islands.empty()) {
    auto options_or = ControllerOptionsFromFlags(flags, "run");
    if (!options_or.ok()) return Fail(options_or.status(), 2);
    const transport::ControllerOptions controller_options = *std::move(options_or);
    // One client tells where the program runs; each of the file's clients
    // is a controller of its own, as separate users would be.
    {
      auto probe = client::RemoteClient::Connect(islands, controller_options);
      if (!probe.ok()) return Fail(probe.status(), 1);
      auto devices = (*probe)->Devices();
      if (!devices.ok()) return Fail(devices.status(), 1);
      accelerators = devices->size();
    }
    where = absl::StrCat(" of ", islands.size(), " island", islands.size() == 1 ? "" : "s");
    result = RunProgramFile(
        *file,
        [&](const std::string& name) -> absl::StatusOr<std::unique_ptr<client::Client>> {
          transport::ControllerOptions o = controller_options;
          o.name = name;
          CAUSEWAY_ASSIGN_OR_RETURN(auto c, client::RemoteClient::Connect(islands, o));
          return std::unique_ptr<client::Client>(std::move(c));
        },
        run_options);
  } else {
    auto rt = Runtime::Create(*options);
    if (!rt.ok()) return Fail(rt.status(), 1);
    accelerators = (*rt)->size();
    IslandOptions island_options;
    island_options.runs_in_flight = run_options.window;
    auto island = Island::Create(rt->get(), island_options);
    if (!island.ok()) return Fail(island.status(), 1);
    result = RunProgramFile(*file, **island, run_options);
  }
  if (!result.ok()) return Fail(result.status(), 1);

  const ProgramDef& program = file->def.program();
  std::printf("program %s: %d client%s x %d run%s on %zu accelerator%s%s\n", program.name().c_str(), clients,
              clients == 1 ? "" : "s", runs, runs == 1 ? "" : "s", accelerators, accelerators == 1 ? "" : "s",
              where.c_str());
  // Every client ran the same program on the same inputs: client 0's
  // outputs stand for all (RunProgramFile checked each against the file).
  for (const ProgramFileOutput& out : result->clients[0].outputs) PrintOutput(out);
  for (const ProgramFileClientResult& c : result->clients) {
    std::printf("client %s: %d runs in %.3f ms, %.1f runs/s (load %.1f ms)\n", c.client.c_str(), c.runs,
                absl::ToDoubleMilliseconds(c.run_time), c.runs_per_second(),
                absl::ToDoubleMilliseconds(c.load_time));
  }
  int code = 0;
  if (file->def.expect_size() > 0) {
    if (result->ok()) {
      std::printf("expect: ok (%d output%s as expected)\n", file->def.expect_size(),
                  file->def.expect_size() == 1 ? "" : "s");
    } else {
      std::printf("expect: FAILED\n");
      for (const std::string& m : result->mismatches) std::fprintf(stderr, "causeway run: %s\n", m.c_str());
      code = 1;
    }
  } else if (!result->ok()) {
    for (const std::string& m : result->mismatches) std::fprintf(stderr, "causeway run: %s\n", m.c_str());
    code = 1;
  }
  if (flags.Has("outputs")) {
    if (absl::Status s = WriteOutputs(flags.Get("outputs"), result->clients[0].outputs); !s.ok()) {
      return Fail(s, 1);
    }
  }

  if (*trace != nullptr) {
    const std::string path = (*trace)->path();
    if (absl::Status s = (*trace)->Finish(); !s.ok()) return Fail(s, 1);
    if (flags.Bool("check-order")) {
      auto parsed = ReadTraceFile(path);
      if (!parsed.ok()) return Fail(parsed.status(), 1);
      const std::vector<OrderViolation> violations = CheckOrder(*parsed);
      if (violations.empty()) {
        std::printf("order: ok (%zu gang calls)\n", parsed->gang_calls.size());
      } else {
        std::printf("order: %zu violation%s\n", violations.size(), violations.size() == 1 ? "" : "s");
        for (const OrderViolation& v : violations) {
          std::printf("  island %s accelerator %d: %s\n", v.island.c_str(), v.accelerator, v.message.c_str());
        }
        code = 1;
      }
    }
  }
  return code;
}

}  // namespace causeway::cli
