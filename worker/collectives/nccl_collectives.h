// Collectives over NCCL, for GPU workers: one rank per GPU. Rank 0 makes the
// NCCL unique id and publishes it in the KeyValueStore; the others read it.
#ifndef RECPS_WORKER_COLLECTIVES_NCCL_COLLECTIVES_H_
#define RECPS_WORKER_COLLECTIVES_NCCL_COLLECTIVES_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/kv_store.h"

namespace recps::worker {

// Joins the group `prefix` (a job/run id, fresh per run: the unique id is
// stored under it) as `rank` of `world_size` on CUDA device `device`.
//
// The returned object's AllReduceSum and Broadcast take DEVICE pointers
// (memory on `device`, or managed memory); a host pointer is
// INVALID_ARGUMENT. Each operation runs on a stream the object owns and is
// complete when the call returns. `timeout` bounds the rendezvous and every
// operation: past it the communicator is aborted and the call fails
// (DEADLINE_EXCEEDED), so a dead peer gives an error, not a hang.
// Builds without NCCL return UNIMPLEMENTED.
#if defined(RECPS_HAVE_NCCL)
absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    KeyValueStore& store, const std::string& prefix, int rank, int world_size,
    int device, absl::Duration timeout = absl::Seconds(300));
#else
inline absl::StatusOr<std::unique_ptr<Collectives>> CreateNcclCollectives(
    KeyValueStore&, const std::string&, int, int, int,
    absl::Duration = absl::Seconds(300)) {
  return absl::UnimplementedError("recps was built without NCCL");
}
#endif

}  // namespace recps::worker

#endif  // RECPS_WORKER_COLLECTIVES_NCCL_COLLECTIVES_H_
