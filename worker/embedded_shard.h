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
// DEADLINE_EXCEEDED when no map comes within `wait`. `local_ranks`: the
// workers' ranks in this process (they share it).
absl::StatusOr<std::unique_ptr<server::ShardProcess>> StartEmbeddedShard(
    const v1::JobConfig& job, int world, int local_ranks, const std::string& coordinator,
    absl::Duration wait);

// Waits for every peer: their last evaluation may still read the embedded
// shard's rows, so it stops serving only after this. `collectives` may be
// null (one worker).
void WaitForPeers(Collectives* collectives);

}  // namespace recps::worker

#endif  // RECPS_WORKER_EMBEDDED_SHARD_H_
