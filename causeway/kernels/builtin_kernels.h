// The built-in kernels of shaders/ as Kernel objects.
#ifndef CAUSEWAY_KERNELS_BUILTIN_KERNELS_H_
#define CAUSEWAY_KERNELS_BUILTIN_KERNELS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "causeway/runtime/kernel.h"

namespace causeway {

// The built-in kernel `name` ("add", "matmul", ...), validated and reflected
// once per process and shared. NotFound (listing the names) for an unknown one.
absl::StatusOr<std::shared_ptr<const Kernel>> BuiltinKernel(absl::string_view name);
std::vector<std::string> BuiltinKernelNames();

// Push constants of the built-in kernels (see causeway/shaders/README.md).
struct CountParams {
  uint32_t count;
};
struct FillParams {
  uint32_t count;
  uint32_t value;
};
struct ScaleParams {
  uint32_t count;
  float alpha;
};
struct CombineParams {
  uint32_t count;
  uint32_t a_offset;
  uint32_t b_offset;
  uint32_t result_offset;
};
struct CombineNParams {
  uint32_t count;
  uint32_t offset[8];  // per operand
  uint32_t result_offset;
};
struct MatmulParams {
  uint32_t m;
  uint32_t n;
  uint32_t k;
};

}  // namespace causeway

#endif  // CAUSEWAY_KERNELS_BUILTIN_KERNELS_H_
