// Status helpers. Debian's abseil (20220623) ships no status macros; these are
// the two every fallible call in Causeway uses.
#ifndef CAUSEWAY_BASE_STATUS_H_
#define CAUSEWAY_BASE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CAUSEWAY_CONCAT_INNER_(a, b) a##b
#define CAUSEWAY_CONCAT_(a, b) CAUSEWAY_CONCAT_INNER_(a, b)

// Returns the status of `expr` from the enclosing function if it is not OK.
#define CAUSEWAY_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status causeway_status_ = (expr);            \
    if (!causeway_status_.ok()) return causeway_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else
// moves the value into `lhs`, which may be a declaration (`auto x`).
#define CAUSEWAY_ASSIGN_OR_RETURN(lhs, rexpr) \
  CAUSEWAY_ASSIGN_OR_RETURN_IMPL_(CAUSEWAY_CONCAT_(causeway_statusor_, __LINE__), lhs, rexpr)
#define CAUSEWAY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = std::move(statusor).value()

#endif  // CAUSEWAY_BASE_STATUS_H_
