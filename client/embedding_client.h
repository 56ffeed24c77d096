// The embedding client: what a worker uses to read and update embedding rows
// on many shard servers at once.
//
// A call deduplicates each table's ids, routes every distinct id to the
// server that owns its slot (ShardMap::OwnerOf), sends one request per server
// carrying all tables (a large lookup: several, see
// max_ids_per_lookup_request), concurrently, and scatters the returned rows
// into the caller's buffers. Stale shard maps are refreshed and only the refused ids
// re-sent; servers that are starting or behind are retried with backoff.
#ifndef RECPS_CLIENT_EMBEDDING_CLIENT_H_
#define RECPS_CLIENT_EMBEDDING_CLIENT_H_

#include <cstdint>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire/shard_map.h"
#include "common/rpc/channels.h"
#include "recps/v1/shard.pb.h"

namespace recps::client {

class InProcessShard;

namespace internal {
class DoneQueue;
class Transports;
struct RoutedBatch;
}  // namespace internal

struct TableSchema {
  std::string name;
  int dim = 0;  // floats per row, > 0
};

struct EmbeddingClientOptions {
  // This worker's rank, sent in every request header.
  int worker_rank = 0;
  // Encoding of rows and gradients on the wire. FLOAT16 / BFLOAT16 halve the
  // bytes at the cost of precision (about 3 and 2 significant digits).
  v1::RowEncoding encoding = v1::ROW_ENCODING_FLOAT32;
  // Deadline of every RPC attempt. A sync-mode lookup waits for the slowest
  // worker's push, so keep this well above a step time.
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Rounds of requests per call, the first included, before a server that
  // stays UNAVAILABLE or CANCELLED (or keeps refusing the map) fails the
  // call.
  int max_attempts = 8;
  // With a replicated shard map (docs/replication.md), how long a call
  // keeps retrying past max_attempts: a lost server's backups own its rows
  // once its coordinator lease ran out and the coordinator promoted them
  // (the lease plus a tick), and the call carries on there. Its retries
  // then wait at most 200 ms each, each looking for a newer map.
  absl::Duration failover_wait = absl::Seconds(30);
  // Wait before a retry round; doubles each round up to max_backoff (with
  // +-20% jitter so that many workers do not retry in lockstep).
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(2);
  // How channels to the servers authenticate (common/rpc/channels.h).
  rpc::TransportSecurity security;
  // Most ids (over all tables) in one Lookup request. A server's part of a
  // larger lookup is split into that many near-equal chunks, all sent at
  // once, so the server looks up one chunk while the previous one is on the
  // wire or being copied out by the client; each chunk is retried (and
  // re-routed) on its own. Pushes are never split: one per server and call.
  // Each request costs the server ~0.1 ms of CPU beyond its ids; with the
  // server's one-copy responses, 4096-id chunks no longer bought latency on
  // loopback and took ~25% more server CPU on 64k-id lookups than one
  // request (docs/shard-server.md, Benchmark), so a server's part is split
  // only beyond 16k ids.
  int max_ids_per_lookup_request = 16384;
  // A shard server in this process (recps-worker --embedded_shard), or
  // null. Requests for the server at its address() are handed to it
  // directly (no serialization, socket or thread hop); routing, retries,
  // stale epochs and incarnations are handled as for any server. Not owned:
  // it must outlive the client.
  InProcessShard* in_process_shard = nullptr;
  // Same-host rows (docs/shard-server.md): to a server on this host's
  // loopback, pushes and lookup answers go through shared memory instead
  // of the socket; a server that cannot map it gets bytes.
  bool same_host_rows = true;
};

// Where the client gets the current shard map: at start and whenever a
// server reports a newer epoch. Fetch may be called from several threads,
// but never concurrently by one EmbeddingClient.
class ShardMapSource {
 public:
  virtual ~ShardMapSource() = default;
  virtual absl::StatusOr<ShardMap> Fetch() = 0;
};

// Asks every server in `servers` for its map (ShardAdmin.GetShardMap) and
// returns the newest valid one; fails (UNAVAILABLE) only when none answers
// with one.
std::unique_ptr<ShardMapSource> MakeServerShardMapSource(
    std::vector<std::string> servers,
    rpc::TransportSecurity security = rpc::TransportSecurity());

// Rows of `ids` (which may repeat) of table index `table` go to `out`,
// ids.size() x dim floats, row i for ids[i].
struct LookupSpec {
  int table = -1;
  absl::Span<const int64_t> ids;
  float* out = nullptr;
  // The caller promises `ids` are distinct (a worker that deduplicated them
  // itself): the client takes them as its unique ids without hashing them a
  // second time. Repeated ids with this set are a caller bug (their rows
  // would be fetched twice; a push would send one id twice).
  bool distinct = false;
};

// What a lookup learned besides its rows.
struct LookupInfo {
  // How many steps stale the rows read were (docs/training.md, Staleness):
  // `step - 1` minus the oldest LookupResponse.applied_step among the
  // servers that answered (the newest step whose pushes from every worker
  // each had applied when it read them), at least 0. 0 in sync mode; at
  // most k in bounded mode. -1 when no server sent one (older servers).
  int64_t staleness_steps = -1;
};

// One gradient row per id, ids.size() x dim floats. Ids should be distinct;
// rows of a repeated id (also across specs of one table) are summed.
struct PushSpec {
  int table = -1;
  absl::Span<const int64_t> ids;
  const float* grads = nullptr;
  bool distinct = false;  // as LookupSpec::distinct
};

// Thread-safe: Lookup and PushGradients may run concurrently (for example a
// lookup of step t+1 while step t's push is in flight).
// A process that moves megabytes per call should call TuneDataPlaneProcess()
// (common/malloc_tuning.h) first; without it, a run may get every response's
// receive buffers freshly mapped, at 2-3 times the client's CPU per call.
class EmbeddingClient {
 public:
  // Checks the schemas (distinct non-empty names, dim > 0) and options, and
  // fetches the first shard map from `source`.
  static absl::StatusOr<std::unique_ptr<EmbeddingClient>> Create(
      std::vector<TableSchema> tables, std::unique_ptr<ShardMapSource> source,
      EmbeddingClientOptions options);
  ~EmbeddingClient();

  EmbeddingClient(const EmbeddingClient&) = delete;
  EmbeddingClient& operator=(const EmbeddingClient&) = delete;

  // Index of the table called `name` in the schema list, or -1.
  int FindTable(std::string_view name) const;
  const std::vector<TableSchema>& tables() const { return tables_; }

  // Fills every spec's `out`. Specs may name the same table; each distinct
  // (table, id) is fetched once. gRPC's threads write each server's rows
  // into `out` as its response arrives; every write is done when Lookup
  // returns, whatever it returns. On error, `out` may be partly written; the
  // message names the server that failed. INVALID_ARGUMENT for a bad spec
  // (nothing sent), UNAVAILABLE / CANCELLED / ABORTED once retries are used
  // up, otherwise the server's own code. `info`, if set, receives the
  // lookup's staleness on success.
  absl::Status Lookup(int64_t step, absl::Span<const LookupSpec> batch,
                      LookupInfo* info = nullptr);

  // Sync mode's exact overlap (docs/training.md): every spec's `out`
  // already holds its rows as read while step `step - 1` was being applied
  // (a Lookup with step `step - 1` sent during that step). Waits like a
  // lookup of `step` and overwrites only the rows that step `step - 1`
  // updated on their server; a server that cannot tell sends every row.
  // The caller must redo a plain Lookup if the shard map's epoch changed
  // since the first read (rows that moved are not covered). `info` as for
  // Lookup (this read's staleness: that of the rows as corrected).
  absl::Status LookupUpdated(int64_t step, absl::Span<const LookupSpec> batch,
                             LookupInfo* info = nullptr);

  // Sends each distinct (table, id)'s gradient to its owner, and an empty
  // push to every other server of the map that owns something (a server
  // that owns nothing takes part in no step), so that servers in sync mode
  // know this rank is done with `step`. OK means every such server
  // accepted the push.
  //
  // Both fail with DATA_LOSS, in every consistency mode, once a server the
  // client has used answers with a new incarnation or refuses the one the
  // request named (it restarted and lost its rows; the refusal comes at
  // once, before any wait for a step); the message names the server and
  // both incarnations.
  absl::Status PushGradients(int64_t step, absl::Span<const PushSpec> batch);

  // Epoch of the shard map the client routes by now.
  uint64_t shard_map_epoch() const;

  // Routes by `map` from now on if its epoch is newer than the current one
  // (else ignores it): a map pushed by a watcher (ShardMapWatcher) reaches
  // the client before a server has to refuse a stale epoch. Safe while
  // calls are in flight: they send their next round by it. FAILED_PRECONDITION
  // (nothing changes) for a map without servers or whose column groups do
  // not match the tables' dims.
  absl::Status OfferShardMap(ShardMap map);

 private:
  EmbeddingClient(std::vector<TableSchema> tables,
                  std::unique_ptr<ShardMapSource> source,
                  EmbeddingClientOptions options, ShardMap map);

  // A shard map with the transport of each of its servers (see the .cc).
  struct Routing;
  // What one Lookup or PushGradients keeps across its rounds (see the .cc).
  struct Rounds;

  std::shared_ptr<const Routing> CurrentRouting() const;
  // `map` with each server's transport: in process for
  // options_.in_process_shard's address, gRPC for the others.
  std::shared_ptr<const Routing> MakeRouting(ShardMap map);
  // Installs `map` if it is newer than the current one; returns the epoch
  // routed by afterwards. REQUIRES: CheckMap passed.
  uint64_t InstallIfNewer(ShardMap map);
  // Fetches a map from the source unless the current one already has
  // `wanted_epoch`; installs it when newer. One fetch at a time. Returns the
  // epoch routed by afterwards.
  absl::StatusOr<uint64_t> RefreshMap(uint64_t wanted_epoch);

  // Remembers the incarnation of each server address on its first answer;
  // DATA_LOSS (from then on, for every call) when it changes: the server
  // restarted and its rows were reinitialised. 0 (not sent) is ignored.
  absl::Status CheckIncarnation(const std::string& address,
                                uint64_t incarnation);
  // OK, or the DATA_LOSS that CheckIncarnation found.
  absl::Status LostStatus() const;
  // The incarnation `address` answered with so far (0: none yet): every
  // request names it (RequestHeader.incarnation), so that a restarted
  // server refuses with DATA_LOSS at once instead of parking a lookup for
  // a step its fresh clock never reaches.
  uint64_t KnownIncarnation(const std::string& address) const;
  // Records the DATA_LOSS of a server that refused the incarnation a
  // request named (`why`: its message); later calls fail with it too.
  absl::Status NoteRefusedIncarnation(const std::string& address,
                                      uint64_t known, const std::string& why);

  absl::Status LookupImpl(int64_t step, absl::Span<const LookupSpec> batch,
                          bool updated_only, LookupInfo* info);
  // Sends `batch` in rounds until every part is accepted (see the .cc).
  // `oldest_applied`, if set, receives the oldest applied_step of the
  // lookup answers (nullopt: none carried one).
  template <typename Rpc>
  absl::Status Run(int64_t step, internal::RoutedBatch& batch,
                   std::optional<int64_t>* oldest_applied = nullptr);
  // A round's steps: make and build its calls, start them, and judge them
  // as they finish.
  template <typename Rpc>
  void MakeCalls(int64_t step, const Routing& routing,
                 internal::RoutedBatch& batch, Rounds& rounds);
  void FillHeader(int64_t step, uint64_t epoch, const std::string& address,
                  bool with_part, const Rounds& rounds,
                  v1::RequestHeader& header);
  void StartCalls(const Routing& routing, Rounds& rounds,
                  internal::DoneQueue& done);
  template <typename Rpc>
  void JudgeCalls(const ShardMap& map, internal::RoutedBatch& batch,
                  internal::DoneQueue& done, Rounds& rounds);

  // Reuses routing buffers across calls, so a steady training loop does
  // not allocate them per step.
  std::unique_ptr<internal::RoutedBatch> AcquireBatch();
  void ReleaseBatch(std::unique_ptr<internal::RoutedBatch> batch);

  const std::vector<TableSchema> tables_;
  const EmbeddingClientOptions options_;
  absl::flat_hash_map<std::string, int> table_index_;
  std::vector<uint64_t> table_keys_;  // StableNameKey of each table

  std::unique_ptr<ShardMapSource> source_ ABSL_PT_GUARDED_BY(refresh_mu_);
  absl::Mutex refresh_mu_;  // held while fetching from source_
  // Before routing_: every Routing points into it.
  std::unique_ptr<internal::Transports> transports_;
  mutable absl::Mutex map_mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(map_mu_);

  // Push part ids (RequestHeader.push_part): a random base per client, so
  // a restarted worker never repeats an id a server remembers, plus a count.
  std::atomic<uint64_t> next_push_part_;

  mutable absl::Mutex incarnation_mu_;
  absl::flat_hash_map<std::string, uint64_t> incarnations_
      ABSL_GUARDED_BY(incarnation_mu_);
  absl::Status lost_ ABSL_GUARDED_BY(incarnation_mu_);

  absl::Mutex pool_mu_;
  std::vector<std::unique_ptr<internal::RoutedBatch>> free_batches_
      ABSL_GUARDED_BY(pool_mu_);
};

}  // namespace recps::client

#endif  // RECPS_CLIENT_EMBEDDING_CLIENT_H_
