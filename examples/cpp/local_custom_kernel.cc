// A local island of two accelerators: a custom GLSL kernel (y = a x + b) runs
// SPMD on each device's half of x, then an all-reduce sums the halves.
// Checks every element against the same arithmetic on the host.
//
//   local_custom_kernel
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "causeway/base/status.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/runtime/kernel.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/island.h"
#include "causeway/scheduler/program.h"

namespace causeway {
namespace {

constexpr char kAxpb[] = R"(
  #version 450
  layout(local_size_x = 64) in;
  layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
  layout(set = 0, binding = 1, std430) writeonly buffer Y { float y[]; };
  layout(push_constant) uniform Params { uint count; float a; float b; } p;
  void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i < p.count) y[i] = p.a * x[i] + p.b;
  }
)";

struct AxpbParams {
  uint32_t count;
  float a, b;
};

absl::Status Run() {
  constexpr int64_t n = 4096;          // the whole array
  constexpr uint32_t half = n / 2;     // one device's shard
  constexpr float a = 3.0f, b = 0.5f;

  RuntimeOptions options;
  options.accelerators = 2;
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Runtime> rt, Runtime::Create(options));
  CAUSEWAY_ASSIGN_OR_RETURN(std::unique_ptr<Island> island, Island::Create(rt.get()));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Client> client, island->Connect("example"));
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Mesh> mesh, client->AllocateMesh({2}));

  // The kernel's bindings are checked against the function's buffers here:
  // binding 1 is written, so it must be given an output (args {0, 1}).
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Kernel> kernel, Kernel::FromGlsl("axpb", kAxpb));
  const TensorSpec shard{{half}, DType::kF32};
  CAUSEWAY_ASSIGN_OR_RETURN(
      std::shared_ptr<const Function> axpb,
      Function::Create(
          "axpb", {shard}, {shard}, {},
          {{kernel, {0, 1}, ops::PushBytes(AxpbParams{half, a, b}), {(half + 63) / 64, 1, 1}, {}}}));

  ProgramBuilder builder("axpb-sum");
  builder.Parameter("x", mesh, {n}, DType::kF32, Sharding::Split(0));  // each device gets half
  builder.Call("axpb", axpb, mesh, {"x"}, {"y"});                      // y split like x
  builder.AllReduce("sum", mesh, "y", "total");                        // total = y_0 + y_1, on both
  builder.Output("total");
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<const Program> program, builder.Build());
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Executable> exe, client->Load(program));

  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 97) * 0.25f;
  CAUSEWAY_ASSIGN_OR_RETURN(ArrayRef xa, client->CreateArray(mesh, {n}, DType::kF32, Sharding::Split(0)));
  CAUSEWAY_RETURN_IF_ERROR(xa->Upload(x.data(), x.size() * sizeof(float)));
  CAUSEWAY_ASSIGN_OR_RETURN(Execution run, client->Execute(exe, {xa}));  // returns at once
  std::vector<float> total(half, -1.0f);
  CAUSEWAY_RETURN_IF_ERROR(run.outputs[0]->Download(total.data(), total.size() * sizeof(float)));

  for (uint32_t i = 0; i < half; ++i) {
    const float want = (a * x[i] + b) + (a * x[i + half] + b);
    if (std::abs(total[i] - want) > 1e-5f * std::abs(want)) {
      return absl::InternalError(absl::StrCat("total[", i, "] = ", total[i], ", expected ", want));
    }
  }
  client->Close();
  std::printf("local_custom_kernel: %u sums of a x + b over 2 accelerators are correct\n", half);
  return absl::OkStatus();
}

}  // namespace
}  // namespace causeway

int main() {
  if (absl::Status s = causeway::Run(); !s.ok()) {
    std::fprintf(stderr, "local_custom_kernel: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
