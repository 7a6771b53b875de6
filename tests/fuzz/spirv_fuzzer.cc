// Fuzz target over what Causeway does with SPIR-V from outside before a
// driver sees it: the header checks, spirv-val and the reflection parser
// (Kernel::FromSpirvBytes), and the reflection parser alone on words that
// were never validated (it must be safe on anything).
//
// Beyond not crashing: a reflection lists bindings sorted by (set, binding)
// and each once, specialization constants sorted by id and each once; a
// module accepted as a kernel reflects the same on its own, and twice the
// same bytes give the same hash. A violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/string_view.h"
#include "causeway/runtime/kernel.h"
#include "causeway/runtime/spirv_reflect.h"
#include "tests/fuzz/fuzz_require.h"

namespace causeway {
namespace {

void Require(bool condition, const char* what) { fuzz::Require(condition, "spirv_fuzzer", what); }

void CheckReflection(const KernelReflection& r) {
  for (size_t i = 1; i < r.bindings.size(); ++i) {
    const KernelBinding &a = r.bindings[i - 1], &b = r.bindings[i];
    Require(a.set < b.set || (a.set == b.set && a.binding < b.binding),
            "bindings are not sorted by (set, binding), each once");
  }
  for (size_t i = 1; i < r.spec_constants.size(); ++i) {
    Require(r.spec_constants[i - 1].id < r.spec_constants[i].id,
            "specialization constants are not sorted, each once");
  }
}

void FuzzOne(const uint8_t* data, size_t size) {
  std::vector<uint32_t> words(size / 4);
  if (!words.empty()) std::memcpy(words.data(), data, words.size() * 4);
  absl::StatusOr<KernelReflection> reflected = ReflectSpirv(words);
  if (reflected.ok()) CheckReflection(*reflected);

  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::shared_ptr<const Kernel>> kernel = Kernel::FromSpirvBytes("fuzz", bytes);
  if (!kernel.ok()) return;
  Require(size % 4 == 0, "a module whose size is not a multiple of 4 was accepted");
  Require(reflected.ok(), "a kernel was accepted whose words do not reflect");
  const KernelReflection& r = (*kernel)->reflection();
  CheckReflection(r);
  Require(r.bindings.size() == reflected->bindings.size() &&
              r.push_constant_size == reflected->push_constant_size &&
              r.local_size == reflected->local_size && r.entry_point == reflected->entry_point,
          "a kernel reflects differently from its words");
  absl::StatusOr<std::shared_ptr<const Kernel>> again = Kernel::FromSpirvBytes("fuzz", bytes);
  Require(again.ok() && (*again)->sha256() == (*kernel)->sha256(), "the same bytes gave another kernel");
}

}  // namespace
}  // namespace causeway

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  causeway::FuzzOne(data, size);
  return 0;
}
