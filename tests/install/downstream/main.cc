// Uses an installed Causeway through causeway::causeway, on the CPU driver:
// runs the built-in "add" kernel and checks the sum; checks that a function
// whose kernel would overwrite its input is refused when it is made; drives
// an island server (named by its address by default) through a controller.
// Exits 0 only if every check passes; prints what went wrong otherwise.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "causeway/causeway.h"

// The package's targets bring C++20; this project asks for no standard.
static_assert(__cplusplus >= 202002L, "causeway::causeway should compile its users with C++20");

namespace {

absl::StatusOr<std::unique_ptr<causeway::Runtime>> CpuRuntime() {
  causeway::RuntimeOptions options;
  options.accelerators = 1;
  options.device = "cpu";
  return causeway::Runtime::Create(options);
}

absl::Status CheckAdd() {
  absl::StatusOr<std::unique_ptr<causeway::Runtime>> rt = CpuRuntime();
  if (!rt.ok()) return rt.status();
  causeway::Accelerator* acc = (*rt)->accelerator(0);

  const std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, -6.5f, 0.25f};
  const std::vector<float> b = {10.0f, 20.0f, 30.0f, 40.0f, 50.0f, 6.5f, 0.5f};
  const uint32_t n = static_cast<uint32_t>(a.size());
  const uint64_t bytes = uint64_t{n} * sizeof(float);

  absl::StatusOr<std::shared_ptr<causeway::Buffer>> a_buf = acc->CreateBuffer(bytes);
  if (!a_buf.ok()) return a_buf.status();
  absl::StatusOr<std::shared_ptr<causeway::Buffer>> b_buf = acc->CreateBuffer(bytes);
  if (!b_buf.ok()) return b_buf.status();
  absl::StatusOr<std::shared_ptr<causeway::Buffer>> out_buf = acc->CreateBuffer(bytes);
  if (!out_buf.ok()) return out_buf.status();
  if (absl::Status s = acc->UploadSync(*a_buf, a.data(), bytes); !s.ok()) return s;
  if (absl::Status s = acc->UploadSync(*b_buf, b.data(), bytes); !s.ok()) return s;

  absl::StatusOr<std::shared_ptr<causeway::CommandList>> list = acc->CreateCommandList("downstream add");
  if (!list.ok()) return list.status();
  if (absl::Status s = causeway::ops::Add(**list, *a_buf, *b_buf, *out_buf, n); !s.ok()) return s;
  if (absl::Status s = acc->Submit(*list).Await(); !s.ok()) return s;

  // Sentinel values, so that a download that wrote nothing cannot pass.
  std::vector<float> out(n, -12345.0f);
  if (absl::Status s = acc->DownloadSync(*out_buf, out.data(), bytes); !s.ok()) return s;

  int wrong = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const float expected = a[i] + b[i];  // exact in f32 for these values
    if (out[i] != expected) {
      std::fprintf(stderr, "out[%u] = %g, expected %g + %g = %g\n", i, out[i], a[i], b[i], expected);
      ++wrong;
    }
  }
  if (wrong > 0) {
    return absl::InternalError("add kernel: " + std::to_string(wrong) + " of " + std::to_string(n) +
                               " elements wrong");
  }
  std::printf("downstream: add of %u floats on '%s' is correct\n", n, (*rt)->plan().device->name.c_str());
  return absl::OkStatus();
}

// y = a * x + b with args {1, 0} binds the input x where the kernel writes:
// Function::Create must refuse it, naming the binding.
absl::Status CheckFunctionRules() {
  absl::StatusOr<std::shared_ptr<const causeway::Kernel>> axpb = causeway::Kernel::FromGlsl("axpb", R"(
    #version 450
    layout(local_size_x = 64) in;
    layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
    layout(set = 0, binding = 1, std430) writeonly buffer Y { float y[]; };
    layout(push_constant) uniform Params { uint count; float a; float b; } p;
    void main() {
      const uint i = gl_GlobalInvocationID.x;
      if (i < p.count) y[i] = p.a * x[i] + p.b;
    }
  )");
  if (!axpb.ok()) return axpb.status();
  const causeway::TensorSpec t{{64}, causeway::DType::kF32};
  auto make = [&](std::vector<int> args) {
    return causeway::Function::Create("axpb", {t}, {t}, {},
                                      {{*axpb, std::move(args), std::vector<uint8_t>(12), {1, 1, 1}, {}}});
  };
  if (absl::Status ok = make({0, 1}).status(); !ok.ok()) return ok;
  const absl::Status refused = make({1, 0}).status();
  if (refused.code() != absl::StatusCode::kInvalidArgument ||
      refused.message().find("may write binding 1, given input 0") == absl::string_view::npos) {
    return absl::InternalError("a function whose kernel writes its input 0 was not refused for it: " +
                               refused.ToString());
  }
  std::printf("downstream: Function::Create refuses a kernel that writes an input\n");
  return absl::OkStatus();
}

// An island server in this process, named by its address, and a controller
// that connects to it and allocates a mesh there.
absl::Status CheckController() {
  absl::StatusOr<std::unique_ptr<causeway::Runtime>> rt = CpuRuntime();
  if (!rt.ok()) return rt.status();
  absl::StatusOr<std::unique_ptr<causeway::transport::IslandServer>> server =
      causeway::transport::IslandServer::Create(rt->get(), {});
  if (!server.ok()) return server.status();
  absl::StatusOr<std::unique_ptr<causeway::transport::Controller>> controller =
      causeway::transport::Controller::Connect({(*server)->address().ToString()});
  if (!controller.ok()) return controller.status();
  if ((*controller)->island_name(0) != (*server)->advertised_address()) {
    return absl::InternalError("the island is named '" + (*controller)->island_name(0) +
                               "', expected its address " + (*server)->advertised_address());
  }
  absl::StatusOr<causeway::transport::RemoteMesh> mesh = (*controller)->AllocateMesh(0, {1});
  if (!mesh.ok()) return mesh.status();
  std::printf("downstream: a controller allocated a mesh on island '%s'\n",
              (*controller)->island_name(0).c_str());
  return absl::OkStatus();
}

}  // namespace

int main() {
  for (absl::Status (*check)() : {CheckAdd, CheckFunctionRules, CheckController}) {
    if (absl::Status s = check(); !s.ok()) {
      std::fprintf(stderr, "downstream: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
