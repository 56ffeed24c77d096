#include "worker/collectives/coordinator_kv_store.h"

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace recps::worker {

absl::Status CoordinatorKeyValueStore::Set(const std::string& key,
                                           const std::string& value) {
  return client_->KvSet(key, value);
}

absl::StatusOr<std::string> CoordinatorKeyValueStore::Get(const std::string& key,
                                                          absl::Duration timeout) {
  return client_->KvGet(key, timeout);
}

absl::Status CoordinatorKeyValueStore::Wait(const std::vector<std::string>& keys,
                                            absl::Duration timeout) {
  if (keys.empty()) return absl::OkStatus();
  return client_->KvWait(keys, timeout);
}

absl::StatusOr<std::string> FreshRendezvousPrefix(client::CoordinatorClient& client,
                                                  const std::string& base, int rank,
                                                  int world_size,
                                                  absl::Duration timeout) {
  const std::string key = absl::StrCat(base, "/nonce");
  if (rank == 0) {
    absl::BitGen gen;
    const std::string nonce = absl::StrFormat(
        "%x-%x", absl::ToUnixMicros(absl::Now()), absl::Uniform<uint32_t>(gen));
    RETURN_IF_ERROR(client.KvSet(key, nonce));
  }
  RETURN_IF_ERROR(
      client.Barrier(absl::StrCat(base, "/rendezvous"), world_size, rank, timeout));
  ASSIGN_OR_RETURN(std::string nonce, client.KvGet(key, timeout));
  return absl::StrCat(base, "/", nonce);
}

}  // namespace recps::worker
