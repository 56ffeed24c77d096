#include "server/shard/export_grants.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace recps::server {

absl::Status ExportGrants::Allow(const v1::AllowExportRequest& request) {
  constexpr int64_t kMaxTtlMs = int64_t{86400} * 1000;
  if (request.move_id().empty() || request.move_id().size() > 256) {
    return absl::InvalidArgumentError("allow export: move_id must be 1..256 bytes");
  }
  if (request.ttl_ms() < 1 || request.ttl_ms() > kMaxTtlMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allow export ", request.move_id(), ": ttl_ms ", request.ttl_ms(),
        " is outside 1..", kMaxTtlMs));
  }
  const absl::Time now = absl::Now();
  Grant grant;
  grant.slots.insert(request.slots().begin(), request.slots().end());
  grant.tables.insert(request.tables().begin(), request.tables().end());
  grant.expires = now + absl::Milliseconds(request.ttl_ms());
  absl::MutexLock lock(&mu_);
  absl::erase_if(grants_, [now](const auto& g) { return g.second.expires <= now; });
  if (grants_.size() >= kMaxGrants && !grants_.contains(request.move_id())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allow export ", request.move_id(), ": ", grants_.size(),
        " moves hold grants already, the limit is ", kMaxGrants));
  }
  grants_[request.move_id()] = std::move(grant);
  return absl::OkStatus();
}

absl::Status ExportGrants::Check(const v1::ExportRowsRequest& request) const {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  auto it = grants_.find(request.move_id());
  if (it == grants_.end() || it->second.expires <= now) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export rows: no move '", request.move_id().substr(0, 64),
        "' is copying from this server (the coordinator grants each move's "
        "export before its copy; AllowExport)"));
  }
  for (uint32_t slot : request.slots()) {
    if (!it->second.slots.contains(slot)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export rows: slot ", slot, " is not part of move ", request.move_id()));
    }
  }
  for (const std::string& table : request.tables()) {
    if (!it->second.tables.contains(table)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export rows: table '", table.substr(0, 64), "' is not part of move ",
          request.move_id()));
    }
  }
  return absl::OkStatus();
}

}  // namespace recps::server
