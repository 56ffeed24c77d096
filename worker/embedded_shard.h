// recps-worker --embedded_shard: the job's tables served by a shard server
// inside the worker process (the same store, update and step clock as
// recps-shard), reached by this worker without gRPC. Its flags
// (--embedded_shard_listen, _advertise, _metrics_listen, _port_file,
// _tls_cert, _tls_key, _num_slots) are defined in embedded_shard.cc.
#ifndef RECPS_WORKER_EMBEDDED_SHARD_H_
#define RECPS_WORKER_EMBEDDED_SHARD_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "recps/v1/job.pb.h"
#include "server/shard/shard_process.h"
#include "worker/collectives/collectives.h"

namespace recps::worker {

// Starts it, registered with `coordinator` like a recps-shard (or alone,
// without one), and returns once it serves a shard map that lists it;
// DEADLINE_EXCEEDED when no map comes within `wait`.
absl::StatusOr<std::unique_ptr<server::ShardProcess>> StartEmbeddedShard(
    const v1::JobConfig& job, int world, const std::string& coordinator,
    absl::Duration wait);

// Waits for every peer (their last evaluation may still read this worker's
// rows), then stops serving. `collectives` may be null (one worker);
// `shard` may be null (none).
void StopEmbeddedShard(Collectives* collectives, server::ShardProcess* shard);

}  // namespace recps::worker

#endif  // RECPS_WORKER_EMBEDDED_SHARD_H_
