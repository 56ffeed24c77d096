// The RPC layer's pieces that need no server: status conversion both ways
// and the retry pacing.
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "common/rpc/retry.h"
#include "common/rpc/status_conversion.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recps::rpc {
namespace {

using ::testing::HasSubstr;

TEST(StatusConversion, CodesAndMessagesSurviveTheRoundTrip) {
  const grpc::Status g =
      ToGrpcStatus(absl::InvalidArgumentError("table 't': id 7 is outside [0, 4)"));
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(g.error_message(), "table 't': id 7 is outside [0, 4)");
  const absl::Status back = FromGrpcStatus(g, "shard server 10.0.0.1:7100", "Lookup");
  EXPECT_TRUE(absl::IsInvalidArgument(back));
  EXPECT_EQ(back.message(),
            "shard server 10.0.0.1:7100: Lookup: table 't': id 7 is outside [0, 4)");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "x", "y").ok());
}

TEST(StatusConversion, AnEmptyMessageBecomesTheCodeName) {
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("")).error_message(), "UNAVAILABLE");
  const absl::Status s = FromGrpcStatus(
      grpc::Status(grpc::StatusCode::UNIMPLEMENTED, ""), "127.0.0.1:5", "GetJob");
  EXPECT_EQ(s.message(), "127.0.0.1:5: GetJob: UNIMPLEMENTED");
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::INTERNAL, "boom"),
                           "cannot ask the coordinator", "")
                .message(),
            "cannot ask the coordinator: boom");
}

TEST(Backoff, DoublesUpToTheCapWithinTheJitter) {
  Backoff b({absl::Milliseconds(10), absl::Milliseconds(50), 0.2});
  const double want_ms[] = {10, 20, 40, 50, 50};
  for (double want : want_ms) {
    const double got = absl::ToDoubleMilliseconds(b.Next());
    EXPECT_GE(got, want * 0.8 - 1e-9);
    EXPECT_LE(got, want * 1.2 + 1e-9);
  }
  b.Reset();
  EXPECT_LE(absl::ToDoubleMilliseconds(b.Next()), 12.0 + 1e-9);
  Backoff exact({absl::Milliseconds(3), absl::Milliseconds(5), 0.0});
  EXPECT_EQ(exact.Next(), absl::Milliseconds(3));
  EXPECT_EQ(exact.Next(), absl::Milliseconds(5));
}

TEST(RetryUnavailable, RetriesOnlyUnavailableAndStopsAtTheDeadline) {
  int calls = 0;
  grpc::Status s = RetryUnavailable(
      absl::Now() + absl::Seconds(10), {absl::Milliseconds(1), absl::Milliseconds(2), 0},
      [&] {
        ++calls;
        return calls < 3 ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")
                         : grpc::Status(grpc::StatusCode::NOT_FOUND, "no key");
      });
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);

  calls = 0;
  s = RetryUnavailable(absl::Now() + absl::Milliseconds(30),
                       {absl::Milliseconds(5), absl::Milliseconds(5), 0}, [&] {
                         ++calls;
                         return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
                       });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_GE(calls, 2);

  // Never sleeps past the deadline: an hour's wait is cut to the 50 ms left,
  // then one last try (none when the first came after the deadline). A wait
  // not cut would hold this test for an hour.
  calls = 0;
  s = RetryUnavailable(absl::Now() + absl::Milliseconds(50),
                       {absl::Hours(1), absl::Hours(1), 0}, [&] {
                         ++calls;
                         return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
                       });
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_GE(calls, 1);
  EXPECT_LE(calls, 2);
}

}  // namespace
}  // namespace recps::rpc
