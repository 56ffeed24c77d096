// Status propagation helpers. The Debian abseil has no status macros, so the
// project defines them once, here.
#ifndef RECPS_COMMON_STATUS_MACROS_H_
#define RECPS_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RECPS_CONCAT_INNER_(a, b) a##b
#define RECPS_CONCAT_(a, b) RECPS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function
// if it is not OK.
#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status recps_status_ = (expr);         \
    if (!recps_status_.ok()) return recps_status_; \
  } while (0)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs`, which may be
// a declaration (`ASSIGN_OR_RETURN(auto x, F())`).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  RECPS_ASSIGN_OR_RETURN_IMPL_(RECPS_CONCAT_(recps_statusor_, __LINE__), lhs, rexpr)

#define RECPS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

#endif  // RECPS_COMMON_STATUS_MACROS_H_
