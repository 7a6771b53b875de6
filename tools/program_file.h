// Program files: a program (ProgramDef) with the inputs to run it on, how
// many clients run it how many times, the accelerators it needs and the
// outputs it must give, in protobuf text format (tools/program_file.proto).
// `causeway run FILE` reads one and runs it on an island of its own;
// examples/ holds several.
//
// A file is read whole and checked before anything runs: its syntax (errors
// "FILE:LINE:COL: reason", as the text parser gives them), then what the
// text parser cannot see (every parameter has exactly one input, every node
// names values, functions and meshes that exist, an input's data fits its
// parameter, each expectation names an output, a kernel file exists and
// compiles, clients and runs within bounds), each error placed on the line
// of the thing at fault: "FILE:LINE:COL: node 'sum': input 'q' is not ...".
// What only an island can check (shapes against functions, shardings against
// meshes: BuildProgram) is checked by RunProgramFile, whose errors are placed
// the same way.
//
// Example:
//   CAUSEWAY_ASSIGN_OR_RETURN(ProgramFile file, ReadProgramFile("examples/pipeline.textproto"));
//   RuntimeOptions options;
//   options.accelerators = file.accelerators();
//   CAUSEWAY_ASSIGN_OR_RETURN(auto runtime, Runtime::Create(options));
//   CAUSEWAY_ASSIGN_OR_RETURN(auto island, Island::Create(runtime.get()));
//   CAUSEWAY_ASSIGN_OR_RETURN(ProgramFileResult result, RunProgramFile(file, *island));
//   for (const std::string& m : result.mismatches) std::fprintf(stderr, "%s\n", m.c_str());
#ifndef CAUSEWAY_TOOLS_PROGRAM_FILE_H_
#define CAUSEWAY_TOOLS_PROGRAM_FILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "causeway/client/client.h"
#include "causeway/scheduler/dtype.h"
#include "causeway/scheduler/island.h"
#include "tools/program_file.pb.h"  // IWYU pragma: export

namespace causeway::cli {

// Bounds of a program file (the schema's comments give the reasons).
inline constexpr int kMaxProgramFileClients = 64;
inline constexpr int kMaxProgramFileRuns = 1000000;
inline constexpr int kMaxProgramFileAccelerators = 256;
// A data file (an input or an expected output) or a kernel file.
inline constexpr uint64_t kMaxProgramFileDataBytes = uint64_t{1} << 31;

// A program file, read and checked. Immutable once read; share it freely.
struct ProgramFile {
  // As given to ReadProgramFile; errors start with it.
  std::string path;
  // The file's contents with every path resolved: kernels carry `spirv`
  // bytes, file inputs and expectations carry `data`. Needs no file system.
  ProgramFileDef def;
  // Where each named thing of the file starts, 1-based (line, column):
  // "mesh 'a'", "function 'mm'", "parameter 'x'", "node 'sum'", "input 'x'",
  // "expect 'z'", "program 'name'", and "clients:", "runs:", "accelerators:".
  absl::flat_hash_map<std::string, std::pair<int, int>> locations;

  int clients() const { return def.clients() == 0 ? 1 : def.clients(); }
  int runs() const { return def.runs() == 0 ? 1 : def.runs(); }
  // What the island needs (the file's `accelerators`, else the sum of its
  // mesh sizes).
  int accelerators() const;

  // `status` with its message placed in the file: "FILE:LINE:COL: message"
  // at the thing the message names first (one of `locations`), else
  // "FILE: message". The code is kept.
  absl::Status Locate(const absl::Status& status) const;
};

// Reads and checks the program file at `path`; relative paths in it are
// resolved against its directory. NotFound when the file does not exist;
// InvalidArgument for anything wrong in it (see the file comment).
absl::StatusOr<ProgramFile> ReadProgramFile(const std::string& path);
// The same for `text` as if read from `path` (which names it in errors and
// whose directory relative paths are resolved against).
absl::StatusOr<ProgramFile> ParseProgramFile(absl::string_view text, const std::string& path);

// The row-major host bytes of an input for an array of `shape` and `dtype`
// (little-endian elements, f16 as IEEE binary16), as RunProgramFile uploads
// it. `input` must be resolved (`data`, not `file`). InvalidArgument when
// the data does not fit: a wrong byte count, a value that is not an integer
// in range for i32.
absl::StatusOr<std::string> InputBytes(const InputDef& input, const Shape& shape, DType dtype);

// Elements as doubles (f16 widened exactly); `bytes` holds whole elements.
std::vector<double> ElementsAsDoubles(absl::string_view bytes, DType dtype);
// The checksum `causeway run` prints for an output: FNV-1a 64 of its bytes.
uint64_t OutputChecksum(absl::string_view bytes);

struct ProgramFileRunOptions {
  int clients = 0;  // 0: the file's
  int runs = 0;     // 0: the file's (per client)
  // Runs a client keeps in flight behind its newest (the island overload:
  // 0 takes the island's runs_in_flight).
  int window = 4;
  // How long a client may wait for its runs to finish before its run fails.
  absl::Duration timeout = absl::Minutes(10);
  // Each run's deadline (client::ExecuteOptions): past it the run fails
  // naming what it was doing.
  absl::Duration deadline = absl::InfiniteDuration();
};

// One output of one client's last run.
struct ProgramFileOutput {
  std::string name;
  Shape shape;
  DType dtype = DType::kF32;
  std::string bytes;  // row-major, little-endian elements
};

struct ProgramFileClientResult {
  std::string client;  // its name on the island ("run-0", "run-1", ...)
  int runs = 0;
  absl::Duration load_time;  // connect, meshes, Load and inputs
  // From the first Execute to the end of the last run.
  absl::Duration run_time;
  std::vector<ProgramFileOutput> outputs;  // of the last run, in the program's order
  double runs_per_second() const;
};

struct ProgramFileResult {
  std::vector<ProgramFileClientResult> clients;
  // Expectations not met (and clients whose outputs differ from client 0's),
  // one sentence each naming the client, the output and the first elements
  // at fault; empty when every expectation holds.
  std::vector<std::string> mismatches;
  bool ok() const { return mismatches.empty(); }
};

// Makes the client named `name` (one per client of the file) over the
// islands the file runs on: local (client::LocalClient) or remote
// (client::RemoteClient).
using ProgramFileClientFactory =
    std::function<absl::StatusOr<std::unique_ptr<client::Client>>(const std::string& name)>;

// Runs `file`: each client (options.clients, else the file's) connects on a
// thread of its own through `connect`, allocates the file's meshes (a mesh
// that names an island on that island, found by name among the client's;
// the others on its first), loads the program, uploads the inputs, then,
// all clients together, queues its runs without awaiting one before the
// next (options.window bounds how many are in flight), awaits them,
// downloads the outputs of its last run and checks them against the file's
// expectations. Errors (placed in the file where they name a thing of it)
// are what stopped a client ("client 'run-2': ..." when there are several);
// outputs that differ from the expectations are not errors but
// `mismatches`. Thread-safe; blocks until every client is done.
absl::StatusOr<ProgramFileResult> RunProgramFile(const ProgramFile& file,
                                                 const ProgramFileClientFactory& connect,
                                                 const ProgramFileRunOptions& options = {});
// The same on `island`, each client a tenant of it.
absl::StatusOr<ProgramFileResult> RunProgramFile(const ProgramFile& file, Island& island,
                                                 ProgramFileRunOptions options = {.window = 0});

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_PROGRAM_FILE_H_
