// A single controller driving two island servers, through the client API
// (causeway/client/client.h) that local islands answer too: x is scaled on
// island 0, the result crosses to island 1 (over a socket, as between hosts)
// and is added to itself there. The program is a ProgramDef, written here in
// protobuf text as a program file would hold it. Checks z = 4 x exactly.
//
//   remote_two_islands                      starts two island servers in
//                                           this process, on loopback
//   remote_two_islands HOST:PORT HOST:PORT  uses running islands
//                                           (`causeway island --listen ...`)
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/client/remote_client.h"
#include "causeway/distributed/island_server.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/program_def.pb.h"
#include "google/protobuf/text_format.h"

namespace causeway {
namespace {

constexpr int64_t kN = 1024;

constexpr char kProgram[] = R"pb(
  name: "two-islands"
  meshes { name: "a" dims: 1 }
  meshes { name: "b" dims: 1 }
  functions { name: "twice" scale { shape: 1024 alpha: 2 } }
  functions { name: "add" elementwise { op: "add" shape: 1024 } }
  parameters { value: "x" mesh: "a" shape: 1024 }
  nodes { name: "scale" call { function: "twice" mesh: "a" inputs: "x" outputs: "y" } }
  nodes { name: "sum" call { function: "add" mesh: "b" inputs: [ "y", "y" ] outputs: "z" } }
  outputs: "z"
)pb";

absl::Status Run(std::vector<std::string> addresses) {
  // Without addresses, two islands in this process, each over a runtime of
  // its own, as two `causeway island` processes would be.
  std::vector<std::unique_ptr<Runtime>> runtimes;
  std::vector<std::unique_ptr<transport::IslandServer>> servers;
  if (addresses.empty()) {
    for (int i = 0; i < 2; ++i) {
      RuntimeOptions options;
      options.accelerators = 1;
      CAUSEWAY_ASSIGN_OR_RETURN(runtimes.emplace_back(), Runtime::Create(options));
      CAUSEWAY_ASSIGN_OR_RETURN(servers.emplace_back(),
                                transport::IslandServer::Create(runtimes.back().get(), {}));
      addresses.push_back(servers.back()->address().ToString());
    }
  }
  if (addresses.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat("expected 2 island addresses, got ", addresses.size()));
  }

  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::RemoteClient::Connect(addresses));
  CAUSEWAY_ASSIGN_OR_RETURN(client::Mesh a, c->AllocateMesh(0, {1}));
  CAUSEWAY_ASSIGN_OR_RETURN(client::Mesh b, c->AllocateMesh(1, {1}));
  ProgramDef def;
  if (!google::protobuf::TextFormat::ParseFromString(kProgram, &def)) {
    return absl::InternalError("the program text does not parse");
  }
  CAUSEWAY_ASSIGN_OR_RETURN(auto program, c->Load(def, {{"a", a}, {"b", b}}));

  std::vector<float> x(kN), z(kN, -1.0f);
  for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>(i) - 100.0f;
  CAUSEWAY_ASSIGN_OR_RETURN(client::Array xa, c->CreateArray(a, {kN}, DType::kF32));
  CAUSEWAY_RETURN_IF_ERROR(c->Upload(xa, x.data(), x.size() * sizeof(float)));
  CAUSEWAY_ASSIGN_OR_RETURN(client::Run run, c->Execute(program, {xa}));  // returns at once
  CAUSEWAY_RETURN_IF_ERROR(run.done.Await());
  CAUSEWAY_RETURN_IF_ERROR(c->Download(run.outputs[0], z.data(), z.size() * sizeof(float)));

  for (int64_t i = 0; i < kN; ++i) {
    if (z[i] != 4.0f * x[i]) {  // exact: small integers times powers of two
      return absl::InternalError(absl::StrCat("z[", i, "] = ", z[i], ", expected ", 4.0f * x[i]));
    }
  }
  CAUSEWAY_ASSIGN_OR_RETURN(std::vector<client::Device> devices, c->Devices());
  std::printf("remote_two_islands: z = 4 x over islands '%s' and '%s' is correct\n",
              devices.front().island_name.c_str(), devices.back().island_name.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace causeway

int main(int argc, char** argv) {
  if (absl::Status s = causeway::Run(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "remote_two_islands: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
