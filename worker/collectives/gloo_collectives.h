// Collectives over Gloo's TCP transport, for CPU workers. Ranks find each
// other through a KeyValueStore (Debian's Gloo has no TCP store of its own).
#ifndef RECPS_WORKER_COLLECTIVES_GLOO_COLLECTIVES_H_
#define RECPS_WORKER_COLLECTIVES_GLOO_COLLECTIVES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/kv_store.h"

namespace recps::worker {

// Joins the group `prefix` (a job/run id: keys of different runs never
// collide) as `rank` of `world_size`, listening on `hostname` with a port
// the OS picks, and connects to every other rank. Blocks until all ranks
// have joined; DEADLINE_EXCEEDED naming a missing rank after `timeout`.
// The same `timeout` bounds every later operation, so a peer that hangs
// gives an error instead of a hang; a peer that dies gives UNAVAILABLE.
//
// Gloo throws; no exception leaves this module. Ignores SIGPIPE for the
// process (if it was at its default), so a write to a dead peer's socket
// fails with an error rather than killing the worker.
absl::StatusOr<std::unique_ptr<Collectives>> CreateGlooCollectives(
    KeyValueStore& store, const std::string& prefix, int rank, int world_size,
    const std::string& hostname = "127.0.0.1",
    absl::Duration timeout = absl::Seconds(60));

}  // namespace recps::worker

#endif  // RECPS_WORKER_COLLECTIVES_GLOO_COLLECTIVES_H_
