// A traced run: a two-stage pipeline (x * 2 on accelerator 0, then * 3 on
// accelerator 1, the value crossing between them) run 4 times back to back
// with tracing on, written as a Chrome trace (open it in ui.perfetto.dev or
// summarize it with `causeway trace summarize`). Checks the results, and that
// the trace holds every gang call of every run and the devices' own spans.
//
//   traced_run [TRACE.json]      default: traced_run.json in the working directory
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/base/trace.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"

namespace causeway {
namespace {

// How many times `needle` occurs in `text`.
int Count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

absl::Status Run(const std::string& path) {
  constexpr int64_t n = 1 << 16;
  constexpr int kRuns = 4;
  RuntimeOptions options;
  options.accelerators = 2;
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Create(options));
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Island> island, Island::Create(rt.get()));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, island->Connect("traced"));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> first, client->AllocateMesh({1}));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> second, client->AllocateMesh({1}));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Function> twice, Function::Scale({n}, 2.0f));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Function> thrice, Function::Scale({n}, 3.0f));
  ProgramBuilder builder("pipeline");
  builder.Parameter("x", first, {n}, DType::kF32);
  builder.Call("stage0", twice, first, {"x"}, {"y"});
  builder.Call("stage1", thrice, second, {"y"}, {"z"});  // y crosses to accelerator 1 first
  builder.Output("z");
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, builder.Build());
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Executable> exe, client->Load(program));
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000);
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef xa, client->CreateArray(first, {n}, DType::kF32));
  CAUSEWAY_RETURN_IF_ERROR(xa->Upload(x.data(), x.size() * sizeof(float)));

  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<TraceSession> trace, TraceSession::Start(path));
  std::vector<Execution> runs;
  for (int r = 0; r < kRuns; ++r) {  // queued back to back: the stages of runs overlap
    CAUSEWAY_ASSIGN_OR_RETURN(runs.emplace_back(), client->Execute(exe, {xa}));
  }
  for (const Execution& run : runs) CAUSEWAY_RETURN_IF_ERROR(run.Await());
  CAUSEWAY_RETURN_IF_ERROR(trace->Finish());

  std::vector<float> z(n);
  CAUSEWAY_RETURN_IF_ERROR(runs.back().outputs[0]->Download(z.data(), z.size() * sizeof(float)));
  for (int64_t i = 0; i < n; ++i) {
    if (z[i] != 6.0f * x[i]) {
      return absl::InternalError(absl::StrCat("z[", i, "] = ", z[i], ", expected ", 6.0f * x[i]));
    }
  }

  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string json = text.str();
  const int gang_calls = Count(json, "\"name\":\"gang call\""), device_spans = Count(json, "\"cat\":\"device\"");
  // Each run is two gang calls (stage 0; the transfer with stage 1), each
  // with at least one device span.
  if (gang_calls < 2 * kRuns || Count(json, "\"node\":\"stage0\"") < kRuns || device_spans < 2 * kRuns) {
    return absl::InternalError(absl::StrCat(path, " holds ", gang_calls, " gang calls and ", device_spans,
                                            " device spans; expected at least ", 2 * kRuns, " of each"));
  }
  client->Close();
  std::printf("traced_run: %d runs correct; %s holds %d gang calls and %d device spans\n", kRuns, path.c_str(),
              gang_calls, device_spans);
  return absl::OkStatus();
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "traced_run.json";
  if (absl::Status s = causeway::Run(path); !s.ok()) {
    std::fprintf(stderr, "traced_run: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
