#include "causeway/scheduler/dtype.h"

#include "absl/strings/str_join.h"

namespace causeway {

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "?";
}

size_t DTypeSize(DType dtype) { return dtype == DType::kF16 ? 2 : 4; }

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

}  // namespace causeway
