// The causeway command line. Results go to stdout; errors to stderr with a
// non-zero exit.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/accelerator.h"
#include "tools/commands.h"
#include "tools/interrupt.h"

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

const Command kCommands[] = {
    {"devices", "list the physical devices and the accelerators that would be made", causeway::cli::DevicesCommand},
    {"demo", "run a chain of matmuls across accelerators, check it, time it", causeway::cli::DemoCommand},
    {"train", "train the benchmark language model on a text corpus, with a summary and a trace",
     causeway::cli::TrainCommand},
    {"island", "host one island behind a socket, for controllers and other islands", causeway::cli::IslandCommand},
    {"launch", "start N island processes on this machine, for development", causeway::cli::LaunchCommand},
    {"run", "run a program described in a program file", causeway::cli::RunCommand},
    {"trace", "read a trace file: summarize it, check its gang order", causeway::cli::TraceCommand},
    {"bench", "run the benchmark suite; write results, plots and BENCHMARKS.md", causeway::cli::BenchCommand},
    {"soak", "run clients over two islands for a while, killing and restarting islands; check it holds",
     causeway::cli::SoakCommand},
};

void PrintHelp(FILE* out) {
  std::fprintf(out, "causeway: an asynchronous dataflow runtime for accelerators on Vulkan\n\n");
  std::fprintf(out, "usage: causeway COMMAND [flags]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "  %-10s %s\n", "help", "this text; 'causeway COMMAND --help' for a command's flags");
}

}  // namespace

int main(int argc, char** argv) {
#ifdef __SANITIZE_ADDRESS__
  // As in the test suite (tests/testing/test_support.cc): keep lavapipe loaded
  // for the life of the process, so that LeakSanitizer does not report its
  // globals as a leak from "<unknown module>" once the loader unloads it.
  dlopen("libvulkan_lvp.so", RTLD_NOW | RTLD_NODELETE);
#endif
  // Debian's abseil is built with mutex deadlock detection on, which walks a
  // lock graph on every lock; the test suite keeps it, tools turn it off.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (argc < 2) {
    PrintHelp(stderr);
    return 2;
  }
  causeway::Tracer::NameThread("main");
  std::string name = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (name == "help" || name == "--help" || name == "-h") {
    if (!args.empty()) {
      for (const auto& c : kCommands) {
        if (args[0] == c.name) return c.run({"--help"});
      }
    }
    PrintHelp(stdout);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (name != c.name) continue;
    // island and launch stop on signals in their own way (their --help).
    if (name != "island" && name != "launch") causeway::cli::StopOnSignals(name);
    const int code = c.run(args);
    if (causeway::AbandonedAccelerators() > 0) {
      // A device still runs work it was given (the line above said which):
      // leave without static destructors, which it could outlive.
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    return code;
  }
  std::fprintf(stderr, "causeway: unknown command '%s'\n\n", name.c_str());
  PrintHelp(stderr);
  return 2;
}
