// recps-worker's start-up helpers around training: where to resume, which
// local address peers reach, whether the job fits in memory.
#ifndef RECPS_WORKER_WORKER_SETUP_H_
#define RECPS_WORKER_WORKER_SETUP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/coordinator_client.h"
#include "recps/v1/coordinator.pb.h"

namespace recps::worker {

// Where this worker resumes: GetResumeState, retried while the coordinator
// answers UNAVAILABLE (starting, or its shard servers still restoring) until
// --resume_timeout.
absl::StatusOr<v1::GetResumeStateResponse> FetchResumeState(
    client::CoordinatorClient& coordinator, int rank);

// This host's address on the route to `host_port`'s host, so peers on
// other machines can reach the Gloo transport; 127.0.0.1 when that fails.
std::string LocalAddressToward(const std::string& host_port);

// "8G", "512M", "1024" -> bytes (K, M, G, T: powers of 1024).
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// Refuses a job whose estimated memory need exceeds --memory_limit, else
// MemAvailable (checked before anything large is allocated, so a too-large
// job fails with the setting to lower instead of std::bad_alloc).
absl::Status CheckMemory(const v1::JobConfig& job);

}  // namespace recps::worker

#endif  // RECPS_WORKER_WORKER_SETUP_H_
