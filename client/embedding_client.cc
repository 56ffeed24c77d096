#include "client/embedding_client.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/routed_batch.h"
#include "client/shard_fanout.h"
#include "client/shard_transport.h"
#include "common/rpc/retry.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"

namespace recps::client {
namespace {

using internal::CallPart;
using internal::CallResult;
using internal::RoutedBatch;
using internal::ShardCall;
using internal::ShardTransport;

// Most ids one call may carry: Dedup's inverse indices are int32.
constexpr size_t kMaxIdsPerCall = size_t{1} << 30;

// The two RPCs as the round loop sees them. A "part" is positions
// [begin, end) of one server's ids of the round (RoutedBatch).
struct LookupRpc {
  static constexpr char kName[] = "Lookup";
  // Only servers that own some id get a lookup.
  static constexpr bool kEveryServer = false;
  // Lookups carry no push part id.
  static constexpr bool kParts = false;
  // A large part is split into requests of at most
  // max_ids_per_lookup_request ids.
  static constexpr bool kChunked = true;

  static std::unique_ptr<ShardCall> New(ShardTransport& transport) {
    return transport.NewLookup();
  }
};

struct PushRpc {
  static constexpr char kName[] = "PushGradients";
  // Sync servers count a step done once every rank pushed, ids or not:
  // every server that owns something in the map gets a push.
  static constexpr bool kEveryServer = true;
  // Never split in one round: one part per server and round. A request
  // carries a part id (RequestHeader.push_part): a retry of a request whose
  // outcome is unknown (UNAVAILABLE, a server-side CANCELLED) keeps it, so
  // the server drops it if the first attempt was accepted; ids re-routed
  // after a stale-epoch refusal (never accepted) go out with a new id, and a
  // server that already accepted this step's push merges them in.
  static constexpr bool kChunked = false;
  static constexpr bool kParts = true;

  static std::unique_ptr<ShardCall> New(ShardTransport& transport) {
    return transport.NewPush();
  }
};

absl::Status CheckMap(const ShardMap& map,
                      const std::vector<TableSchema>& tables) {
  if (map.num_slots() == 0 || map.num_servers() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard map of epoch ", map.epoch(), " has no slots or no servers"));
  }
  // Column groups must cover each split table's width as this client
  // knows it.
  if (map.has_table_routing()) {
    for (const TableSchema& t : tables) {
      if (absl::Status s = map.CheckWidth(t.name, t.dim); !s.ok()) {
        return absl::FailedPreconditionError(s.message());
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const EmbeddingClientOptions& o) {
  if (o.worker_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_rank ", o.worker_rank, " is negative"));
  }
  if (BytesPerElement(o.encoding) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown row encoding ", static_cast<int>(o.encoding)));
  }
  if (o.rpc_timeout <= absl::ZeroDuration() ||
      o.rpc_timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        "rpc_timeout must be positive and finite");
  }
  if (o.max_attempts < 1) {
    return absl::InvalidArgumentError("max_attempts must be at least 1");
  }
  if (o.max_ids_per_lookup_request < 1) {
    return absl::InvalidArgumentError(
        "max_ids_per_lookup_request must be at least 1");
  }
  if (o.initial_backoff < absl::ZeroDuration() ||
      o.max_backoff < o.initial_backoff) {
    return absl::InvalidArgumentError(
        "need 0 <= initial_backoff <= max_backoff");
  }
  return absl::OkStatus();
}

// Checks what Lookup and PushGradients share: step, table index, sizes.
template <typename Spec>
absl::Status CheckBatch(int64_t step, absl::Span<const Spec> batch,
                        size_t num_tables) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " < 0"));
  }
  size_t total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].table < 0 ||
        static_cast<size_t>(batch[i].table) >= num_tables) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec ", i, ": table index ", batch[i].table,
                       " not in [0, ", num_tables, ")"));
    }
    total += batch[i].ids.size();
  }
  if (total >= kMaxIdsPerCall) {
    return absl::InvalidArgumentError(
        absl::StrCat(total, " ids in one call; the limit is ", kMaxIdsPerCall));
  }
  return absl::OkStatus();
}

}  // namespace

struct EmbeddingClient::Routing {
  ShardMap map;
  // Of map.servers()[s], chosen when the map is installed; owned by
  // transports_.
  std::vector<ShardTransport*> transports;
};

struct EmbeddingClient::Rounds {
  Rounds(const EmbeddingClientOptions& options, const char* rpc)
      : retry(options, rpc) {}

  internal::RetryState retry;
  // Push: servers that accepted this step's push; the others get one (empty
  // if need be) in the next round, also servers new in a refreshed map.
  absl::flat_hash_set<std::string> accepted;
  // Push: the part id of each server's last request whose outcome is
  // unknown (UNAVAILABLE, CANCELLED by the server): its retry keeps the id.
  absl::flat_hash_map<std::string, uint64_t> unsure_parts;

  // A server's requests of the round: `parts` near-equal parts of its
  // `count` ids.
  struct Server {
    int index;
    int32_t count;
    int32_t parts;
  };
  std::vector<Server> servers;
  std::vector<std::unique_ptr<ShardCall>> calls;
  bool failed = false;  // a call failed: the round ends the call
  bool again = false;   // some ids go out again next round
  // Lookup: the oldest LookupResponse.applied_step answered so far.
  std::optional<int64_t> oldest_applied;
};

absl::StatusOr<std::unique_ptr<EmbeddingClient>> EmbeddingClient::Create(
    std::vector<TableSchema> tables, std::unique_ptr<ShardMapSource> source,
    EmbeddingClientOptions options) {
  RETURN_IF_ERROR(CheckOptions(options));
  if (options.encoding == v1::ROW_ENCODING_UNSPECIFIED) {
    options.encoding = v1::ROW_ENCODING_FLOAT32;
  }
  if (source == nullptr) {
    return absl::InvalidArgumentError("no shard map source");
  }
  absl::flat_hash_set<std::string> names;
  for (const TableSchema& t : tables) {
    if (t.name.empty() || t.dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", t.name, "' of dim ", t.dim, ": need a name and dim > 0"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", t.name, "' listed twice"));
    }
  }
  // Servers may still be starting: retry UNAVAILABLE like a data call.
  absl::StatusOr<ShardMap> map = source->Fetch();
  rpc::Backoff backoff({options.initial_backoff, options.max_backoff, 0.2});
  for (int attempt = 1; !map.ok() && absl::IsUnavailable(map.status()) &&
                        attempt < options.max_attempts;
       ++attempt) {
    absl::SleepFor(backoff.Next());
    map = source->Fetch();
  }
  if (!map.ok()) {
    return absl::Status(
        map.status().code(),
        absl::StrCat("fetching the first shard map: ", map.status().message()));
  }
  RETURN_IF_ERROR(CheckMap(*map, tables));
  return std::unique_ptr<EmbeddingClient>(
      new EmbeddingClient(std::move(tables), std::move(source),
                          std::move(options), *std::move(map)));
}

EmbeddingClient::EmbeddingClient(std::vector<TableSchema> tables,
                                 std::unique_ptr<ShardMapSource> source,
                                 EmbeddingClientOptions options, ShardMap map)
    : tables_(std::move(tables)),
      options_(std::move(options)),
      source_(std::move(source)),
      transports_(std::make_unique<internal::Transports>(
          options_.security, options_.in_process_shard, options_.same_host_rows)),
      routing_(MakeRouting(std::move(map))),
      next_push_part_(absl::Uniform<uint64_t>(absl::BitGen()) | 1) {
  for (size_t i = 0; i < tables_.size(); ++i) {
    table_index_[tables_[i].name] = static_cast<int>(i);
    table_keys_.push_back(StableNameKey(tables_[i].name));
  }
}

EmbeddingClient::~EmbeddingClient() = default;

int EmbeddingClient::FindTable(std::string_view name) const {
  const auto it = table_index_.find(std::string(name));
  return it == table_index_.end() ? -1 : it->second;
}

uint64_t EmbeddingClient::shard_map_epoch() const {
  return CurrentRouting()->map.epoch();
}

std::shared_ptr<const EmbeddingClient::Routing>
EmbeddingClient::CurrentRouting() const {
  absl::MutexLock lock(&map_mu_);
  return routing_;
}

std::shared_ptr<const EmbeddingClient::Routing> EmbeddingClient::MakeRouting(
    ShardMap map) {
  auto routing = std::make_shared<Routing>();
  routing->transports.reserve(map.num_servers());
  for (const std::string& address : map.servers()) {
    routing->transports.push_back(transports_->For(address));
  }
  routing->map = std::move(map);
  return routing;
}

absl::StatusOr<uint64_t> EmbeddingClient::RefreshMap(uint64_t wanted_epoch) {
  absl::MutexLock refresh_lock(&refresh_mu_);
  // Another call may have refreshed while this one waited for the lock.
  const uint64_t current = shard_map_epoch();
  if (current >= wanted_epoch) return current;
  ASSIGN_OR_RETURN(ShardMap fetched, source_->Fetch());
  RETURN_IF_ERROR(CheckMap(fetched, tables_));
  return InstallIfNewer(std::move(fetched));
}

uint64_t EmbeddingClient::InstallIfNewer(ShardMap map) {
  std::shared_ptr<const Routing> next = MakeRouting(std::move(map));
  std::shared_ptr<const Routing> installed;
  {
    absl::MutexLock lock(&map_mu_);
    // Re-checked under the lock: a watcher and a refresh may race.
    if (next->map.epoch() <= routing_->map.epoch()) return routing_->map.epoch();
    routing_ = std::move(next);
    installed = routing_;
  }
  // A server that owns nothing now (failed over, drained) holds no row of
  // this client's: a process restarted at its address later (a backup that
  // rejoins, then is promoted) is a new server, not one that lost rows.
  absl::MutexLock lock(&incarnation_mu_);
  absl::erase_if(incarnations_, [&](const auto& entry) {
    const int index = installed->map.IndexOf(entry.first);
    return index < 0 || !installed->map.OwnsAnything(index);
  });
  return installed->map.epoch();
}

absl::Status EmbeddingClient::OfferShardMap(ShardMap map) {
  if (map.epoch() <= shard_map_epoch()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckMap(map, tables_));
  InstallIfNewer(std::move(map));
  return absl::OkStatus();
}

std::unique_ptr<RoutedBatch> EmbeddingClient::AcquireBatch() {
  absl::MutexLock lock(&pool_mu_);
  if (free_batches_.empty()) return std::make_unique<RoutedBatch>();
  std::unique_ptr<RoutedBatch> batch = std::move(free_batches_.back());
  free_batches_.pop_back();
  return batch;
}

void EmbeddingClient::ReleaseBatch(std::unique_ptr<RoutedBatch> batch) {
  absl::MutexLock lock(&pool_mu_);
  free_batches_.push_back(std::move(batch));
}

absl::Status EmbeddingClient::CheckIncarnation(const std::string& address,
                                               uint64_t incarnation) {
  if (incarnation == 0) return absl::OkStatus();  // a server that sends none
  absl::MutexLock lock(&incarnation_mu_);
  if (!lost_.ok()) return lost_;
  auto [it, first] = incarnations_.try_emplace(address, incarnation);
  if (first || it->second == incarnation) return absl::OkStatus();
  lost_ = absl::DataLossError(absl::StrCat(
      "shard server ", address, " restarted: its incarnation was ",
      absl::Hex(it->second, absl::kZeroPad16), " and is now ",
      absl::Hex(incarnation, absl::kZeroPad16),
      ". The rows it held were lost (it serves freshly initialised rows); "
      "this client fails every later call. Restore the job from a "
      "checkpoint to continue"));
  return lost_;
}

absl::Status EmbeddingClient::LostStatus() const {
  absl::MutexLock lock(&incarnation_mu_);
  return lost_;
}

uint64_t EmbeddingClient::KnownIncarnation(const std::string& address) const {
  absl::MutexLock lock(&incarnation_mu_);
  const auto it = incarnations_.find(address);
  return it == incarnations_.end() ? 0 : it->second;
}

absl::Status EmbeddingClient::NoteRefusedIncarnation(const std::string& address,
                                                     uint64_t known,
                                                     const std::string& why) {
  absl::MutexLock lock(&incarnation_mu_);
  if (!lost_.ok()) return lost_;
  // `why`, the server's refusal, names both incarnations (ShardServer::
  // CheckHeader); `known` only in case a message does not.
  const std::string known_hex = absl::StrCat(absl::Hex(known, absl::kZeroPad16));
  lost_ = absl::DataLossError(absl::StrCat(
      "shard server ", address, " restarted: ",
      absl::StrContains(why, known_hex)
          ? ""
          : absl::StrCat("its incarnation was ", known_hex, "; "),
      why,
      ". This client fails every later call. Restore the job from a "
      "checkpoint to continue"));
  return lost_;
}

absl::Status EmbeddingClient::Lookup(int64_t step,
                                     absl::Span<const LookupSpec> batch,
                                     LookupInfo* info) {
  return LookupImpl(step, batch, /*updated_only=*/false, info);
}

absl::Status EmbeddingClient::LookupUpdated(int64_t step,
                                            absl::Span<const LookupSpec> batch,
                                            LookupInfo* info) {
  return LookupImpl(step, batch, /*updated_only=*/true, info);
}

absl::Status EmbeddingClient::LookupImpl(int64_t step,
                                         absl::Span<const LookupSpec> batch,
                                         bool updated_only, LookupInfo* info) {
  RETURN_IF_ERROR(CheckBatch(step, batch, tables_.size()));
  RETURN_IF_ERROR(LostStatus());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].ids.empty() && batch[i].out == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("lookup spec ", i, ": no output buffer"));
    }
  }
  std::unique_ptr<RoutedBatch> routed = AcquireBatch();
  // Column groups come from this map; it lives until the call ends.
  const std::shared_ptr<const Routing> routing = CurrentRouting();
  routed->PrepareLookup(batch, tables_, table_keys_, routing->map);
  routed->updated_only = updated_only;
  std::optional<int64_t> oldest_applied;
  absl::Status status = Run<LookupRpc>(step, *routed, &oldest_applied);
  ReleaseBatch(std::move(routed));
  if (info != nullptr) {
    // A read after the step was applied (a sync prefetch answered late)
    // is not stale: 0.
    info->staleness_steps =
        oldest_applied.has_value() ? std::max<int64_t>(0, step - 1 - *oldest_applied) : -1;
  }
  return status;
}

absl::Status EmbeddingClient::PushGradients(int64_t step,
                                            absl::Span<const PushSpec> batch) {
  RETURN_IF_ERROR(CheckBatch(step, batch, tables_.size()));
  RETURN_IF_ERROR(LostStatus());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!batch[i].ids.empty() && batch[i].grads == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("push spec ", i, ": no gradients"));
    }
  }
  std::unique_ptr<RoutedBatch> routed = AcquireBatch();
  const std::shared_ptr<const Routing> routing = CurrentRouting();
  routed->PreparePush(batch, tables_, table_keys_, routing->map);
  absl::Status status = Run<PushRpc>(step, *routed);
  ReleaseBatch(std::move(routed));
  return status;
}

// Rounds: route the pending ids by the current map, send each server's ids
// concurrently (one request per server, or for a large lookup one per chunk
// of at most max_ids_per_lookup_request ids, all at once), and handle
// replies as they arrive. Ids of requests that were answered UNAVAILABLE,
// CANCELLED by the server, or "stale map" stay pending for the next round,
// after a backoff and/or one map refresh (internal::RetryState::Judge
// decides), where they are routed again; any other error ends the call.
template <typename Rpc>
absl::Status EmbeddingClient::Run(int64_t step, RoutedBatch& batch,
                                  std::optional<int64_t>* oldest_applied) {
  Rounds rounds(options_, Rpc::kName);
  uint64_t last_epoch = 0;
  for (;;) {
    const std::shared_ptr<const Routing> routing = CurrentRouting();
    // A failover's map: each server's clocks of the units it took over
    // must see every rank's push of the step, so every owner gets one
    // again (an empty one, where its clocks have it already, is a no-op).
    if (Rpc::kEveryServer && last_epoch != 0 && routing->map.epoch() != last_epoch &&
        routing->map.replication() > 1) {
      rounds.accepted.clear();
    }
    last_epoch = routing->map.epoch();
    RETURN_IF_ERROR(batch.Route(routing->map));
    MakeCalls<Rpc>(step, *routing, batch, rounds);
    if (rounds.calls.empty()) return absl::OkStatus();
    internal::DoneQueue done(static_cast<int>(rounds.calls.size()));
    StartCalls(*routing, rounds, done);
    JudgeCalls<Rpc>(routing->map, batch, done, rounds);
    if (oldest_applied != nullptr) *oldest_applied = rounds.oldest_applied;
    if (rounds.failed) {
      absl::Status lost = LostStatus();
      return lost.ok() ? rounds.retry.error() : lost;
    }
    if (!rounds.again) return absl::OkStatus();
    RETURN_IF_ERROR(rounds.retry.BeforeNextRound(
        routing->map.epoch(), routing->map.replication() > 1,
        [this](uint64_t wanted) { return RefreshMap(wanted); }));
    batch.NextRound();
  }
}

// The servers that get a request this round, and in how many parts; then
// the calls, chunk k of every server before chunk k + 1 of any, so that
// every server starts working at once. All chunks are sent together: a
// server looks up chunk k + 1 while chunk k is on the wire or being copied
// out here.
template <typename Rpc>
void EmbeddingClient::MakeCalls(int64_t step, const Routing& routing,
                                RoutedBatch& batch, Rounds& rounds) {
  const ShardMap& map = routing.map;
  rounds.calls.clear();
  rounds.servers.clear();
  int32_t most_parts = 0;
  for (int s = 0; s < map.num_servers(); ++s) {
    const int32_t count = batch.CountFor(s);
    // Pushes: also an empty one to every server that owns something and
    // has not accepted this step's push, never to one that owns nothing
    // (joined and not given a share yet, or drained): it takes part in no
    // step, and one started while the job trains would refuse the step.
    if (count == 0 &&
        !(Rpc::kEveryServer && map.OwnsAnything(s) &&
          !rounds.accepted.contains(map.servers()[s]))) {
      continue;
    }
    int32_t parts = 1;
    if (Rpc::kChunked) {
      const int64_t chunk = options_.max_ids_per_lookup_request;
      parts = static_cast<int32_t>(
          std::max<int64_t>(1, (int64_t{count} + chunk - 1) / chunk));
    }
    rounds.servers.push_back({s, count, parts});
    most_parts = std::max(most_parts, parts);
  }
  for (int32_t k = 0; k < most_parts; ++k) {
    for (const Rounds::Server& sv : rounds.servers) {
      if (k >= sv.parts) continue;
      const CallPart part{
          sv.index, static_cast<int32_t>(int64_t{sv.count} * k / sv.parts),
          static_cast<int32_t>(int64_t{sv.count} * (k + 1) / sv.parts)};
      std::unique_ptr<ShardCall> call = Rpc::New(*routing.transports[sv.index]);
      FillHeader(step, map.epoch(), map.servers()[sv.index], Rpc::kParts,
                 rounds, call->header());
      call->Build(batch, part, options_.encoding);
      rounds.calls.push_back(std::move(call));
    }
  }
}

void EmbeddingClient::FillHeader(int64_t step, uint64_t epoch,
                                 const std::string& address, bool with_part,
                                 const Rounds& rounds,
                                 v1::RequestHeader& header) {
  header.set_shard_map_epoch(epoch);
  header.set_step(step);
  header.set_worker_rank(options_.worker_rank);
  // A restarted server refuses this at once with DATA_LOSS; without it a
  // sync-mode lookup would wait there for a step its fresh clock never
  // reaches (until the step timeout).
  header.set_incarnation(KnownIncarnation(address));
  if (with_part) {
    const auto unsure = rounds.unsure_parts.find(address);
    uint64_t part = unsure != rounds.unsure_parts.end()
                        ? unsure->second
                        : next_push_part_.fetch_add(1);
    if (part == 0) part = next_push_part_.fetch_add(1);
    header.set_push_part(part);
  }
}

void EmbeddingClient::StartCalls(const Routing& routing, Rounds& rounds,
                                 internal::DoneQueue& done) {
  // Calls that may run to completion on this thread go last, so that the
  // other servers work meanwhile.
  for (const bool last : {false, true}) {
    for (size_t i = 0; i < rounds.calls.size(); ++i) {
      ShardCall& call = *rounds.calls[i];
      if (routing.transports[call.part().server]->works_on_caller_thread() !=
          last) {
        continue;
      }
      call.Start(absl::Now() + options_.rpc_timeout,
                 [&done, i] { done.Push(static_cast<int>(i)); });
    }
  }
}

// Drains every call, even after a failure: they own their buffers.
template <typename Rpc>
void EmbeddingClient::JudgeCalls(const ShardMap& map, RoutedBatch& batch,
                                 internal::DoneQueue& done, Rounds& rounds) {
  rounds.failed = false;
  rounds.again = false;
  // A replicated map keeps the unsure parts of earlier rounds: a later
  // refusal (ABORTED: a stale map) of the retry says nothing of the first
  // attempt, and the server may hold it. Ids that a failover routes to a
  // server anew go to the clock of the lost primary's units there, which
  // tells retries by their ids (docs/replication.md), so the kept id
  // drops only what the server already took. Without replication (slot
  // moves may route new ids to a server's own clock) each round starts
  // afresh.
  if (map.replication() <= 1) rounds.unsure_parts.clear();
  for (int i = done.Next(); i >= 0; i = done.Next()) {
    if (rounds.failed) continue;
    ShardCall& c = *rounds.calls[i];
    const CallResult& r = c.result();
    const std::string& address = map.servers()[c.part().server];
    // The call's incarnation check failed: a new process at the address. A
    // replicated map's newer epoch gives its rows to its backups; the
    // incarnation stays known meanwhile, so the new process is never read
    // as the old one.
    const bool restarted = c.header().incarnation() != 0 &&
                           r.status.error_code() == grpc::StatusCode::DATA_LOSS;
    const internal::CallVerdict verdict =
        restarted && map.replication() > 1
            ? rounds.retry.AwaitFailover(address, r.status)
            : rounds.retry.Judge(address, r.status, r.server_epoch, r.deadline);
    switch (verdict) {
      case internal::CallVerdict::kOk:
        if (!r.consumed.ok()) {
          rounds.retry.FailResponse(address, r.consumed);
          rounds.failed = true;
        } else if (absl::Status lost = CheckIncarnation(address, r.incarnation);
                   !lost.ok()) {
          rounds.retry.FailResponse(address, lost);
          rounds.failed = true;
        } else if (Rpc::kEveryServer) {
          rounds.accepted.insert(address);
          rounds.unsure_parts.erase(address);
        } else if (r.applied_step.has_value()) {
          rounds.oldest_applied = std::min(
              rounds.oldest_applied.value_or(*r.applied_step), *r.applied_step);
        }
        break;
      case internal::CallVerdict::kRetry:
        // Only this request's ids; the next map may send them elsewhere.
        batch.Requeue(c.part().server, c.part().begin, c.part().end);
        rounds.again = true;
        // ABORTED (stale map) and a new process's refusal took nothing of
        // this request (an earlier one's part stays unsure, above).
        if (Rpc::kParts && !restarted &&
            r.status.error_code() != grpc::StatusCode::ABORTED) {
          rounds.unsure_parts[address] = c.header().push_part();
        }
        break;
      case internal::CallVerdict::kFail:
        // The server's own incarnation check (RequestHeader.incarnation):
        // it is a new process at this address. Fails every later call too.
        if (c.header().incarnation() != 0 &&
            r.status.error_code() == grpc::StatusCode::DATA_LOSS) {
          (void)NoteRefusedIncarnation(address, c.header().incarnation(),
                                       r.status.error_message());
        }
        rounds.failed = true;
        break;
    }
    // No point waiting for the rest; cancelling a finished call is a no-op.
    if (rounds.failed) {
      for (const std::unique_ptr<ShardCall>& other : rounds.calls) {
        other->Cancel();
      }
    }
  }
}

}  // namespace recps::client
