#include "common/rpc/gate_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

ABSL_FLAG(int, max_calls_per_client, 1024,
          "most calls one client identity (certificate) may have in flight; "
          "more are refused with RESOURCE_EXHAUSTED (0: no limit; 0..1048576; "
          "mutual TLS only)");
ABSL_FLAG(int, max_bad_requests_per_client, 100,
          "a client making more bad requests (INVALID_ARGUMENT) than this "
          "within --bad_request_window is refused with UNAVAILABLE for "
          "--bad_request_penalty (0: never; mutual TLS only)");
ABSL_FLAG(absl::Duration, bad_request_window, absl::Seconds(10),
          "window of --max_bad_requests_per_client (1s..1h)");
ABSL_FLAG(absl::Duration, bad_request_penalty, absl::Seconds(30),
          "how long a client over --max_bad_requests_per_client is refused "
          "(1s..24h)");

namespace recps::rpc {
namespace {

absl::Status CheckDuration(const char* flag, absl::Duration d,
                           absl::Duration lo, absl::Duration hi) {
  if (d >= lo && d <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", absl::FormatDuration(d), ": must be ",
                   absl::FormatDuration(lo), "..", absl::FormatDuration(hi)));
}

}  // namespace

absl::StatusOr<CallGateOptions> CallGateOptionsFromFlags() {
  CallGateOptions o;
  o.max_calls_per_client = absl::GetFlag(FLAGS_max_calls_per_client);
  o.max_bad_requests = absl::GetFlag(FLAGS_max_bad_requests_per_client);
  o.bad_request_window = absl::GetFlag(FLAGS_bad_request_window);
  o.bad_request_penalty = absl::GetFlag(FLAGS_bad_request_penalty);
  if (o.max_calls_per_client < 0 || o.max_calls_per_client > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_calls_per_client=", o.max_calls_per_client,
                     ": must be 0..1048576"));
  }
  if (o.max_bad_requests < 0 || o.max_bad_requests > 1000000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_bad_requests_per_client=", o.max_bad_requests,
                     ": must be 0..1000000000"));
  }
  if (absl::Status s = CheckDuration("bad_request_window", o.bad_request_window,
                                     absl::Seconds(1), absl::Hours(1));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckDuration("bad_request_penalty", o.bad_request_penalty,
                        absl::Seconds(1), absl::Hours(24));
      !s.ok()) {
    return s;
  }
  return o;
}

}  // namespace recps::rpc
