#include "causeway/base/checked_size.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway {
namespace {

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<uint64_t> CheckedMul(uint64_t a, uint64_t b, absl::string_view what) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", a, " x ", b, " does not fit in 64 bits"));
  }
  return product;
}

absl::StatusOr<uint64_t> CheckedAdd(uint64_t a, uint64_t b, absl::string_view what) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", a, " + ", b, " does not fit in 64 bits"));
  }
  return sum;
}

absl::StatusOr<uint64_t> CheckedElementCount(absl::Span<const int64_t> shape, uint64_t max_elements) {
  max_elements = std::min(max_elements, kMaxShapeElements);
  uint64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeText(shape), " has dimension ", i, " = ",
                                                     shape[i],
                                                     "; every dimension must be >= 1 (shapes are static)"));
    }
    if (__builtin_mul_overflow(elements, static_cast<uint64_t>(shape[i]), &elements) ||
        elements > max_elements) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeText(shape), " has more than ", max_elements, " elements"));
    }
  }
  return elements;
}

absl::StatusOr<uint64_t> CheckedByteSize(absl::Span<const int64_t> shape, uint64_t element_bytes,
                                         uint64_t max_bytes) {
  absl::StatusOr<uint64_t> elements = CheckedElementCount(shape);
  if (!elements.ok()) return elements.status();
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(*elements, element_bytes, &bytes) || bytes > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeText(shape), " of ", element_bytes,
                                                   "-byte elements is more than ", max_bytes, " bytes"));
  }
  return bytes;
}

absl::Status CheckRange(uint64_t offset, uint64_t length, uint64_t size, absl::string_view what) {
  if (offset > size || length > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", length, " bytes at offset ", offset,
                                                   " run past the end of a ", size, "-byte object"));
  }
  return absl::OkStatus();
}

}  // namespace causeway
