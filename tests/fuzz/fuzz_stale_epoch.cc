// The stale-epoch payload and status conversion (common/rpc): a status
// with a fuzzed code, message and kShardMapEpochKey payload goes through
// ToGrpcStatus into a server context's trailing metadata, the client reads
// the epoch back (ParseShardMapEpoch, what ShardMapEpochOf does with a
// trailer), and FromGrpcStatus turns a fuzzed gRPC status into absl.
// Checks: no crash or sanitizer report; codes survive both ways; an error
// never becomes OK nor gets an empty message; an epoch parses back only
// from decimal digits and round-trips.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/status_conversion.h"
#include "grpcpp/server_context.h"
#include "grpcpp/test/server_context_test_spouse.h"
#include "tests/fuzz/request_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  FuzzedDataProvider in(data, size);
  // Codes a gRPC status can carry (grpc::StatusCode is 0..16).
  const int code = in.ConsumeIntegralInRange<int>(0, 16);
  const std::string message = in.ConsumeRandomLengthString(64);
  const std::string peer = in.ConsumeRandomLengthString(24);
  const std::string rpc_name = in.ConsumeRandomLengthString(16);
  const bool with_payload = in.ConsumeBool();
  const std::string payload = in.ConsumeRemainingBytesAsString();

  // Server side: the payload becomes a trailer.
  absl::Status status(static_cast<absl::StatusCode>(code), message);
  if (with_payload && !status.ok()) {
    status.SetPayload(kShardMapEpochKey, absl::Cord(payload));
  }
  grpc::ServerContext server_context;
  const grpc::Status sent = rpc::ToGrpcStatus(status, &server_context);
  if (static_cast<int>(sent.error_code()) != code) Fail("ToGrpcStatus code");
  if (!sent.ok() && sent.error_message().empty()) Fail("ToGrpcStatus empty message");
  const auto trailers =
      grpc::testing::ServerContextTestSpouse(&server_context).GetTrailingMetadata();
  const auto it = trailers.find(kShardMapEpochKey);
  if ((it != trailers.end()) != (with_payload && !status.ok())) Fail("trailer presence");

  // Client side: the trailer's value as the epoch, or nothing.
  const std::optional<uint64_t> epoch = rpc::ParseShardMapEpoch(payload);
  if (epoch.has_value()) {
    const std::optional<uint64_t> again = rpc::ParseShardMapEpoch(absl::StrCat(*epoch));
    if (!again.has_value() || *again != *epoch) Fail("epoch does not round-trip");
  }

  // And the status the caller sees.
  const absl::Status got =
      rpc::FromGrpcStatus(grpc::Status(static_cast<grpc::StatusCode>(code), message),
                          peer, rpc_name);
  if (static_cast<int>(got.code()) != code) Fail("FromGrpcStatus code");
  if (!got.ok() && got.message().empty()) Fail("FromGrpcStatus empty message");
  if (!got.ok() && got.message().substr(0, peer.size()) != peer) Fail("FromGrpcStatus peer");
  return 0;
}
