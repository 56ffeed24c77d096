#include "client/embedding_client.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/in_process_shard.h"
#include "client/routed_batch.h"
#include "client/shard_fanout.h"
#include "common/rpc/retry.h"
#include "common/rpc/status_conversion.h"
#include "common/hashing.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"

namespace recps::client {
namespace {

using internal::RoutedBatch;

// Most ids one call may carry: Dedup's inverse indices are int32.
constexpr size_t kMaxIdsPerCall = size_t{1} << 30;

// An in-process call's rows that the server reads or writes in place
// (InProcessShard::LookupInto, PushGradientsFrom).
struct InProcessRows {
  bool lookup = false;  // the lookup's rows go to `rows`, one per table
  std::vector<float*> rows;
  std::vector<const float*> grads;  // per table of the push; null: in bytes
};

// The two RPCs as the round loop sees them. A "part" is positions
// [begin, end) of one server's ids of the round (RoutedBatch).
struct LookupRpc {
  using Request = v1::LookupRequest;
  using Response = grpc::ByteBuffer;  // parsed by RoutedBatch::ConsumeLookup
  static constexpr char kName[] = "Lookup";
  // Only servers that own some id get a lookup.
  static constexpr bool kEveryServer = false;
  // Lookups carry no push part id.
  static constexpr bool kParts = false;
  // A large part is split into requests of at most
  // max_ids_per_lookup_request ids.
  static constexpr bool kChunked = true;

  static void Start(const internal::ServerStubs& stubs,
                    grpc::ClientContext* ctx, const Request* request,
                    Response* response,
                    std::function<void(grpc::Status)> done) {
    stubs.raw_lookup->UnaryCall(ctx, internal::LookupMethodName(),
                                grpc::StubOptions(), request, response,
                                std::move(done));
  }
  static void StartInProcess(InProcessShard& shard, absl::Time deadline,
                             const Request* request, Response* response,
                             InProcessRows* direct, uint64_t* incarnation,
                             InProcessShard::Done done) {
    if (direct->lookup) {
      shard.LookupInto(request, direct->rows, incarnation, deadline, std::move(done));
    } else {
      shard.Lookup(request, response, deadline, std::move(done));
    }
  }
  static void Build(RoutedBatch& batch, int server, int32_t begin,
                    int32_t end, v1::RowEncoding encoding, Request* request) {
    request->set_row_encoding(encoding);
    batch.BuildLookup(server, begin, end, request);
  }
  static void BuildInProcess(RoutedBatch& batch, int server, int32_t begin,
                             int32_t end, v1::RowEncoding encoding,
                             Request* request, InProcessRows* direct) {
    Build(batch, server, begin, end, encoding, request);
    direct->lookup = encoding == v1::ROW_ENCODING_FLOAT32 &&
                     batch.DirectLookupRows(server, begin, end, &direct->rows);
  }
  // Rows written in place leave no response to consume.
  static bool ConsumedInPlace(const InProcessRows& direct) { return direct.lookup; }
  static absl::Status Consume(const RoutedBatch& batch, int server,
                              int32_t begin, int32_t end,
                              v1::RowEncoding encoding, Response* response,
                              uint64_t* incarnation) {
    return batch.ConsumeLookup(server, begin, end, encoding, response,
                               incarnation);
  }
};

struct PushRpc {
  using Request = v1::PushGradientsRequest;
  using Response = v1::PushGradientsResponse;
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

  static void Start(const internal::ServerStubs& stubs,
                    grpc::ClientContext* ctx, const Request* request,
                    Response* response,
                    std::function<void(grpc::Status)> done) {
    stubs.shard->async()->PushGradients(ctx, request, response,
                                        std::move(done));
  }
  // Accepted pushes return at once; no deadline to pass.
  static void StartInProcess(InProcessShard& shard, absl::Time,
                             const Request* request, Response* response,
                             InProcessRows* direct, uint64_t*,
                             InProcessShard::Done done) {
    if (std::any_of(direct->grads.begin(), direct->grads.end(),
                    [](const float* g) { return g != nullptr; })) {
      shard.PushGradientsFrom(request, direct->grads, response, std::move(done));
    } else {
      shard.PushGradients(request, response, std::move(done));
    }
  }
  static void Build(RoutedBatch& batch, int server, int32_t, int32_t,
                    v1::RowEncoding encoding, Request* request) {
    batch.BuildPush(server, encoding, request);
  }
  static void BuildInProcess(RoutedBatch& batch, int server, int32_t,
                             int32_t, v1::RowEncoding encoding,
                             Request* request, InProcessRows* direct) {
    batch.BuildPush(server, encoding, request, &direct->grads);
  }
  static bool ConsumedInPlace(const InProcessRows&) { return false; }
  static absl::Status Consume(const RoutedBatch&, int, int32_t, int32_t,
                              v1::RowEncoding, Response* response,
                              uint64_t* incarnation) {
    *incarnation = response->incarnation();
    return absl::OkStatus();
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
      map_(std::make_shared<const ShardMap>(std::move(map))),
      stubs_(std::make_unique<internal::StubCache>(options_.security)),
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
  return CurrentMap()->epoch();
}

std::shared_ptr<const ShardMap> EmbeddingClient::CurrentMap() const {
  absl::MutexLock lock(&map_mu_);
  return map_;
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
  auto next = std::make_shared<const ShardMap>(std::move(map));
  absl::MutexLock lock(&map_mu_);
  // Re-checked under the lock: a watcher and a refresh may race.
  if (next->epoch() > map_->epoch()) map_ = std::move(next);
  return map_->epoch();
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
                                     absl::Span<const LookupSpec> batch) {
  return LookupImpl(step, batch, /*updated_only=*/false);
}

absl::Status EmbeddingClient::LookupUpdated(int64_t step,
                                            absl::Span<const LookupSpec> batch) {
  return LookupImpl(step, batch, /*updated_only=*/true);
}

absl::Status EmbeddingClient::LookupImpl(int64_t step,
                                         absl::Span<const LookupSpec> batch,
                                         bool updated_only) {
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
  const std::shared_ptr<const ShardMap> map = CurrentMap();
  routed->PrepareLookup(batch, tables_, table_keys_, *map);
  routed->updated_only = updated_only;
  absl::Status status = Run<LookupRpc>(step, *routed);
  ReleaseBatch(std::move(routed));
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
  const std::shared_ptr<const ShardMap> map = CurrentMap();
  routed->PreparePush(batch, tables_, table_keys_, *map);
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
absl::Status EmbeddingClient::Run(int64_t step, RoutedBatch& batch) {
  struct Call {
    int server = -1;
    int32_t begin = 0;  // the part of the server's ids this call carries
    int32_t end = 0;
    const std::string* address = nullptr;
    // Handed to options_.in_process_shard instead of sent over gRPC.
    bool in_process = false;
    InProcessRows direct;  // in process: rows read or written in place
    std::optional<uint64_t> server_epoch;  // of an in-process refusal
    grpc::ClientContext ctx;
    typename Rpc::Request request;
    typename Rpc::Response response;
    grpc::Status status;
    uint64_t part = 0;      // push part id (Rpc::kParts)
    absl::Status consumed;  // Rpc::Consume's verdict on an OK response
    uint64_t incarnation = 0;  // of the server that answered (0: unknown)
    // The incarnation the request named (RequestHeader.incarnation; 0: none).
    uint64_t sent_incarnation = 0;
  };
  // A server's requests of the round: `parts` near-equal parts of its
  // `count` ids.
  struct Server {
    int index;
    int32_t count;
    int32_t parts;
  };
  internal::RetryState retry(options_, Rpc::kName);
  // Push: servers that accepted this step's push; the others get one (empty
  // if need be) in the next round, also servers new in a refreshed map.
  absl::flat_hash_set<std::string> accepted;
  // Push: the part id of each server's last request whose outcome is
  // unknown (UNAVAILABLE, CANCELLED by the server): its retry keeps the id.
  absl::flat_hash_map<std::string, uint64_t> unsure_parts;
  std::vector<std::unique_ptr<Call>> calls;
  std::vector<Server> servers;
  for (;;) {
    const std::shared_ptr<const ShardMap> map = CurrentMap();
    RETURN_IF_ERROR(batch.Route(*map));
    calls.clear();
    servers.clear();
    int32_t most_parts = 0;
    for (int s = 0; s < map->num_servers(); ++s) {
      const int32_t count = batch.CountFor(s);
      // Pushes: also an empty one to every server that owns something and
      // has not accepted this step's push, never to one that owns nothing
      // (joined and not given a share yet, or drained): it takes part in no
      // step, and one started while the job trains would refuse the step.
      if (count == 0 &&
          !(Rpc::kEveryServer && map->OwnsAnything(s) &&
            !accepted.contains(map->servers()[s]))) {
        continue;
      }
      int32_t parts = 1;
      if (Rpc::kChunked) {
        const int64_t chunk = options_.max_ids_per_lookup_request;
        parts = static_cast<int32_t>(std::max<int64_t>(
            1, (int64_t{count} + chunk - 1) / chunk));
      }
      servers.push_back({s, count, parts});
      most_parts = std::max(most_parts, parts);
    }
    if (servers.empty()) return absl::OkStatus();

    // Chunk k of every server before chunk k + 1 of any, so that every
    // server starts working at once. All chunks are sent together: a server
    // looks up chunk k + 1 while chunk k is on the wire or being copied out
    // here.
    for (int32_t k = 0; k < most_parts; ++k) {
      for (const Server& sv : servers) {
        if (k >= sv.parts) continue;
        auto call = std::make_unique<Call>();
        call->server = sv.index;
        call->begin = static_cast<int32_t>(int64_t{sv.count} * k / sv.parts);
        call->end =
            static_cast<int32_t>(int64_t{sv.count} * (k + 1) / sv.parts);
        call->address = &map->servers()[sv.index];
        call->in_process = options_.in_process_shard != nullptr &&
                           *call->address == options_.in_process_shard->address();
        v1::RequestHeader* header = call->request.mutable_header();
        header->set_shard_map_epoch(map->epoch());
        header->set_step(step);
        header->set_worker_rank(options_.worker_rank);
        // A restarted server refuses this at once with DATA_LOSS; without it
        // a sync-mode lookup would wait there for a step its fresh clock
        // never reaches (until the step timeout).
        call->sent_incarnation = KnownIncarnation(*call->address);
        header->set_incarnation(call->sent_incarnation);
        if (Rpc::kParts) {
          const auto unsure = unsure_parts.find(*call->address);
          call->part = unsure != unsure_parts.end()
                           ? unsure->second
                           : next_push_part_.fetch_add(1);
          if (call->part == 0) call->part = next_push_part_.fetch_add(1);
          header->set_push_part(call->part);
        }
        if (call->in_process) {
          Rpc::BuildInProcess(batch, sv.index, call->begin, call->end,
                              options_.encoding, &call->request, &call->direct);
        } else {
          Rpc::Build(batch, sv.index, call->begin, call->end, options_.encoding,
                     &call->request);
        }
        calls.push_back(std::move(call));
      }
    }

    internal::DoneQueue done(static_cast<int>(calls.size()));
    // Remote calls first: an in-process call may run to completion on this
    // thread before it returns, and the remote servers work meanwhile.
    for (size_t i = 0; i < calls.size(); ++i) {
      Call& c = *calls[i];
      if (c.in_process) continue;
      rpc::SetTimeout(options_.rpc_timeout, &c.ctx);
      // An OK response is consumed (rows copied out) on the gRPC thread that
      // received it, while its bytes are still in that core's cache and
      // while other responses are in flight, not after a hop to this
      // thread. Shard bench, 16k ids, 17 interleaved pairs: median +10% ids/s
      // (-18% to +33%), client CPU per call 0-16% lower.
      Rpc::Start(stubs_->Get(*c.address), &c.ctx, &c.request, &c.response,
                 [this, &c, &batch,
                  queued = done.Callback(static_cast<int>(i), &c.status)](
                     grpc::Status status) {
                   if (status.ok()) {
                     c.consumed = Rpc::Consume(batch, c.server, c.begin, c.end,
                                               options_.encoding, &c.response,
                                               &c.incarnation);
                   }
                   queued(std::move(status));
                 });
    }
    const absl::Time deadline = absl::Now() + options_.rpc_timeout;
    for (size_t i = 0; i < calls.size(); ++i) {
      Call& c = *calls[i];
      if (!c.in_process) continue;
      // The same status the gRPC path would see (codes and messages), and
      // the epoch of a stale-map refusal, which gRPC sends as a trailer.
      Rpc::StartInProcess(
          *options_.in_process_shard, deadline, &c.request, &c.response,
          &c.direct, &c.incarnation,
          [this, &c, &batch,
           queued = done.Callback(static_cast<int>(i), &c.status)](
              absl::Status status) {
            if (status.ok()) {
              c.consumed = Rpc::ConsumedInPlace(c.direct)
                               ? absl::OkStatus()
                               : Rpc::Consume(batch, c.server, c.begin, c.end,
                                              options_.encoding, &c.response,
                                              &c.incarnation);
            } else if (auto epoch =
                           status.GetPayload(kShardMapEpochKey)) {
              c.server_epoch = rpc::ParseShardMapEpoch(std::string(*epoch));
            }
            queued(rpc::ToGrpcStatus(status));
          });
    }
    bool failed = false;
    bool again = false;
    unsure_parts.clear();
    // Drain every call, even after a failure: they own their buffers.
    for (int i = done.Next(); i >= 0; i = done.Next()) {
      Call& c = *calls[i];
      if (failed) continue;
      const internal::CallVerdict verdict =
          c.in_process
              ? retry.Judge(*c.address, c.status, c.server_epoch, deadline)
              : retry.Judge(*c.address, c.status, c.ctx);
      switch (verdict) {
        case internal::CallVerdict::kOk: {
          if (!c.consumed.ok()) {
            retry.FailResponse(*c.address, c.consumed);
            failed = true;
          } else if (absl::Status lost = CheckIncarnation(*c.address, c.incarnation);
                     !lost.ok()) {
            retry.FailResponse(*c.address, lost);
            failed = true;
          } else if (Rpc::kEveryServer) {
            accepted.insert(*c.address);
          }
          break;
        }
        case internal::CallVerdict::kRetry:
          // Only this request's ids; the next map may send them elsewhere.
          batch.Requeue(c.server, c.begin, c.end);
          again = true;
          // ABORTED (stale map) is a refusal: the server took nothing.
          if (Rpc::kParts &&
              c.status.error_code() != grpc::StatusCode::ABORTED) {
            unsure_parts[*c.address] = c.part;
          }
          break;
        case internal::CallVerdict::kFail:
          // The server's own incarnation check (RequestHeader.incarnation):
          // it is a new process at this address. Fails every later call too.
          if (c.sent_incarnation != 0 &&
              c.status.error_code() == grpc::StatusCode::DATA_LOSS) {
            (void)NoteRefusedIncarnation(*c.address, c.sent_incarnation,
                                         c.status.error_message());
          }
          failed = true;
          break;
      }
      // No point waiting for the rest; cancelling a finished call is a no-op.
      // An in-process call cannot be cancelled: it ends by its deadline.
      if (failed) {
        for (const std::unique_ptr<Call>& other : calls) {
          if (!other->in_process) other->ctx.TryCancel();
        }
      }
    }
    if (failed) {
      absl::Status lost = LostStatus();
      return lost.ok() ? retry.error() : lost;
    }
    if (!again) return absl::OkStatus();
    RETURN_IF_ERROR(retry.BeforeNextRound(
        map->epoch(), [this](uint64_t wanted) { return RefreshMap(wanted); }));
    batch.NextRound();
  }
}

}  // namespace recps::client
