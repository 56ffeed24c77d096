// Which slot-move exports a shard server allows: the coordinator grants a
// move's source the move's units under its move id for a while
// (ShardAdmin.AllowExport) before the target pulls them (ExportRows). An
// export of any other move id, or of units outside its grant, is refused,
// so a certificate that may call ExportRows cannot read rows for a move
// that was never started. docs/security.md.
//
// Thread-safe. Grants are few (one per move in copy) and expire on their
// own; each Allow also drops the expired ones.
#ifndef RECPS_SERVER_SHARD_EXPORT_GRANTS_H_
#define RECPS_SERVER_SHARD_EXPORT_GRANTS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "recps/v1/shard_admin.pb.h"

namespace recps::server {

class ExportGrants {
 public:
  // Grants (or renews) the request's units under its move id.
  // INVALID_ARGUMENT for an empty move id, more than kMaxGrants grants, or
  // a ttl outside 1 ms..1 day.
  absl::Status Allow(const v1::AllowExportRequest& request);
  // OK when `request` names a granted, unexpired move id and only units of
  // its grant; FAILED_PRECONDITION saying which otherwise.
  absl::Status Check(const v1::ExportRowsRequest& request) const;

  static constexpr size_t kMaxGrants = 4096;

 private:
  struct Grant {
    absl::flat_hash_set<uint32_t> slots;
    absl::flat_hash_set<std::string> tables;
    absl::Time expires;
  };
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Grant> grants_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_EXPORT_GRANTS_H_
