// The coordinator's key-value store (KvSet/KvGet/KvWait) as the
// KeyValueStore that Gloo and NCCL rendezvous through, for workers on
// several machines. Calls ride out a coordinator restart (see
// client/coordinator_client.h).
#ifndef RECPS_WORKER_COLLECTIVES_COORDINATOR_KV_STORE_H_
#define RECPS_WORKER_COLLECTIVES_COORDINATOR_KV_STORE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "worker/collectives/kv_store.h"

namespace recps::worker {

class CoordinatorKeyValueStore : public KeyValueStore {
 public:
  // `client` is not owned and must outlive the store.
  explicit CoordinatorKeyValueStore(client::CoordinatorClient* client)
      : client_(client) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;

 private:
  client::CoordinatorClient* const client_;
};

// A rendezvous prefix fresh for this start of the job, the same on every
// rank: "<base>/<nonce>". The coordinator keeps its KV entries across runs
// and restarts, so a fixed prefix would hand a restarted job the Gloo
// addresses of the previous one. Rank 0 stores a new nonce and then meets
// the others at a barrier (barriers are not stored), after which the others
// read it: nobody can read the old one. DEADLINE_EXCEEDED naming the
// missing ranks when they do not all arrive within `timeout`.
absl::StatusOr<std::string> FreshRendezvousPrefix(client::CoordinatorClient& client,
                                                  const std::string& base, int rank,
                                                  int world_size,
                                                  absl::Duration timeout);

}  // namespace recps::worker

#endif  // RECPS_WORKER_COLLECTIVES_COORDINATOR_KV_STORE_H_
