// Runs the built-in "add" kernel through an installed Causeway on the CPU
// driver and checks the sum. Exits 0 only if every element is right; prints
// what went wrong otherwise.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/ops.h"
#include "runtime/runtime.h"

namespace {

absl::Status Run() {
  causeway::RuntimeOptions options;
  options.accelerators = 1;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<causeway::Runtime>> rt = causeway::Runtime::Create(options);
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

}  // namespace

int main() {
  absl::Status s = Run();
  if (!s.ok()) {
    std::fprintf(stderr, "downstream: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
