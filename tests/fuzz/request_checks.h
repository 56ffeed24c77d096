// What every request fuzzer checks of a refused request: a code a client
// can act on (never OK-but-wrong, UNKNOWN or INTERNAL, which mean a bug),
// and a message that says something.
#ifndef RECPS_TESTS_FUZZ_REQUEST_CHECKS_H_
#define RECPS_TESTS_FUZZ_REQUEST_CHECKS_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"

namespace recps::fuzz {

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "FUZZ CHECK FAILED: %s\n", what.c_str());
  std::abort();
}

// `data_loss`: DATA_LOSS is a fair answer too (files on disk).
// RECPS_FUZZ_VERBOSE=1 prints each input's outcome (to debug a target or a
// seed: run the target on the file).
inline void Report(const char* what, const absl::Status& s) {
  static const bool verbose = std::getenv("RECPS_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
}

inline void CheckRefusal(const absl::Status& s, const char* what,
                         bool data_loss = false) {
  if (data_loss && s.code() == absl::StatusCode::kDataLoss) {
    if (s.message().empty()) Fail(std::string(what) + " refused without a message");
    return;
  }
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      break;
    default:
      Fail(std::string(what) + " refused with an unexpected code: " + s.ToString());
  }
  if (s.message().empty()) Fail(std::string(what) + " refused without a message");
}

}  // namespace recps::fuzz

#endif  // RECPS_TESTS_FUZZ_REQUEST_CHECKS_H_
