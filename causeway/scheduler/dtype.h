// Element types and shapes of arrays.
#ifndef CAUSEWAY_SCHEDULER_DTYPE_H_
#define CAUSEWAY_SCHEDULER_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace causeway {

enum class DType : uint8_t { kF32, kF16, kI32 };
const char* DTypeName(DType dtype);  // "f32", "f16", "i32"
size_t DTypeSize(DType dtype);

// Dimensions, outermost first (row-major). Static: every dimension >= 1.
using Shape = std::vector<int64_t>;
int64_t NumElements(const Shape& shape);
std::string ShapeString(const Shape& shape);  // "[4, 128]"

}  // namespace causeway

#endif  // CAUSEWAY_SCHEDULER_DTYPE_H_
