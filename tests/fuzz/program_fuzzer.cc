// Fuzz target over the program-file parser (tools/program_file.h), which
// reads text a user or a tool hands `causeway run`: protobuf text format,
// then every check of the file (meshes, functions, parameters, nodes,
// inputs, clients, runs, expectations), then the program built whole over
// virtual meshes (causeway/scheduler/split.h: no accelerators), as an island would
// build it.
//
// Beyond not crashing: a file that parses prints as text that parses back to
// the same program. A violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/scheduler/split.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_require.h"
#include "tools/program_file.h"

namespace causeway {
namespace {

void Require(bool condition, const char* what) { fuzz::Require(condition, "program_fuzzer", what); }

void FuzzOne(absl::string_view text) {
  // Relative paths in the file resolve against a directory that does not
  // exist: a fuzzed file reads nothing from the machine.
  absl::StatusOr<cli::ProgramFile> file = cli::ParseProgramFile(text, "/nonexistent-fuzz-dir/fuzz.textproto");
  if (!file.ok()) return;
  const ProgramDef& def = file->def.program();
  absl::StatusOr<ProgramDef> again = ParseProgramDefText(ProgramDefToText(def), "again");
  Require(again.ok() && again->SerializeAsString() == def.SerializeAsString(),
          "a program does not survive its text form");
  absl::StatusOr<absl::flat_hash_map<std::string, std::shared_ptr<Mesh>>> meshes = VirtualMeshes(def, "fuzz");
  if (meshes.ok()) BuildProgram(def, *meshes).IgnoreError();
}

}  // namespace
}  // namespace causeway

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf's text parser logs every error it meets; the errors are the
  // point here.
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);
    return true;
  }();
  (void)quiet;
  causeway::FuzzOne(absl::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
