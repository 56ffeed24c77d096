#include "common/rpc/status_conversion.h"

#include "common/wire/same_host_memory.h"

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace recps::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.empty()) message = absl::StatusCodeToString(status.code());
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::move(message));
}

grpc::Status ToGrpcStatus(const absl::Status& status,
                          grpc::ServerContextBase* context) {
  if (context != nullptr) {
    if (absl::optional<absl::Cord> epoch = status.GetPayload(kShardMapEpochKey)) {
      context->AddTrailingMetadata(kShardMapEpochKey, std::string(*epoch));
    }
  }
  return ToGrpcStatus(status);
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view peer,
                            absl::string_view rpc) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = status.error_message();  // a copy: gRPC returns it by value
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat(peer, ": ", rpc, rpc.empty() ? "" : ": ",
                   message.empty()
                       ? absl::StatusCodeToString(
                             static_cast<absl::StatusCode>(status.error_code()))
                       : message));
}

std::optional<uint64_t> ShardMapEpochOf(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto it = trailers.find(kShardMapEpochKey);
  if (it == trailers.end()) return std::nullopt;
  return ParseShardMapEpoch(
      absl::string_view(it->second.data(), it->second.size()));
}

std::optional<uint64_t> ParseShardMapEpoch(absl::string_view value) {
  uint64_t epoch = 0;
  if (!absl::SimpleAtoi(value, &epoch)) return std::nullopt;
  return epoch;
}

bool ServerIsDone(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::DATA_LOSS:
      return true;
    default:
      return false;
  }
}

bool RefusedSameHost(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
         (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
          absl::StartsWith(status.error_message(), kSameHostRefusal));
}

}  // namespace recps::rpc
