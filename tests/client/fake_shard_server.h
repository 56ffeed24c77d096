// A test double of a shard server for the embedding client's tests: serves
// EmbeddingShard and ShardAdmin on 127.0.0.1 over a trivial row function,
// records every request, checks what a real server would (epoch, rank, step,
// unique and owned ids) and can inject errors and delays.
#ifndef RECPS_TESTS_CLIENT_FAKE_SHARD_SERVER_H_
#define RECPS_TESTS_CLIENT_FAKE_SHARD_SERVER_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/channels.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::client::testing {

// Column c of (table, id): exact in float32, distinct per table.
inline float FakeRowValue(const std::string& table, int64_t id, int c) {
  return static_cast<float>(id % 997) * 0.0625f +
         static_cast<float>(c) * 0.25f +
         static_cast<float>(StableNameKey(table) % 7);
}

class FakeShardServer {
 public:
  // One request as received.
  struct Received {
    bool lookup = false;
    v1::RequestHeader header;
    std::map<std::string, std::vector<int64_t>> ids;  // by table
    std::optional<absl::Duration> deadline_left;      // none: no deadline
    grpc::StatusCode answer = grpc::StatusCode::OK;
  };

  // `tables`: name -> dim. Starts listening on an ephemeral loopback port.
  explicit FakeShardServer(std::map<std::string, int> tables)
      : tables_(std::move(tables)), data_(this), admin_(this) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", rpc::ServerCredentials(rpc::TransportSecurity()),
                             &port);
    builder.RegisterService(&data_);
    builder.RegisterService(&admin_);
    server_ = builder.BuildAndStart();
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~FakeShardServer() { Shutdown(); }

  void Shutdown() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(2));
    server_->Wait();
    server_.reset();
  }

  const std::string& address() const { return address_; }

  void SetMap(const ShardMap& map) {
    absl::MutexLock lock(&mu_);
    map_ = map;
  }
  // Rank and step every data request must carry (step -1: any).
  void Expect(int rank, int64_t step) {
    absl::MutexLock lock(&mu_);
    rank_ = rank;
    step_ = step;
  }
  // Answers the next data requests with these errors, in order.
  void Inject(std::vector<grpc::Status> errors) {
    absl::MutexLock lock(&mu_);
    inject_.insert(inject_.end(), errors.begin(), errors.end());
  }
  // Installs `next` once `n` more data requests were answered OK (a map
  // change that lands between two requests of one call).
  void SetMapAfter(int n, const ShardMap& next) {
    absl::MutexLock lock(&mu_);
    map_after_ = n;
    next_map_ = next;
  }
  void FailAlways(grpc::Status error) {
    absl::MutexLock lock(&mu_);
    always_ = std::move(error);
  }
  // Delays every answer, GetShardMap's too.
  void SetDelay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

  std::vector<Received> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  // Client behaviour a real server would refuse as a bug (not as a retry).
  std::vector<std::string> violations() const {
    absl::MutexLock lock(&mu_);
    return violations_;
  }
  // Sum of accepted gradient rows, by (table, id).
  std::map<std::pair<std::string, int64_t>, std::vector<float>> grads() const {
    absl::MutexLock lock(&mu_);
    return grads_;
  }

 private:
  class Data final : public v1::EmbeddingShard::CallbackService {
   public:
    explicit Data(FakeShardServer* s) : s_(s) {}
    grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* ctx,
                                     const v1::LookupRequest* request,
                                     v1::LookupResponse* response) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(s_->HandleLookup(ctx, *request, response));
      return reactor;
    }
    grpc::ServerUnaryReactor* PushGradients(
        grpc::CallbackServerContext* ctx,
        const v1::PushGradientsRequest* request,
        v1::PushGradientsResponse* response) override {
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(s_->HandlePush(ctx, *request, response));
      return reactor;
    }

   private:
    FakeShardServer* s_;
  };

  class Admin final : public v1::ShardAdmin::CallbackService {
   public:
    explicit Admin(FakeShardServer* s) : s_(s) {}
    grpc::ServerUnaryReactor* GetShardMap(grpc::CallbackServerContext* ctx,
                                          const v1::GetShardMapRequest*,
                                          v1::ShardMap* response) override {
      absl::SleepFor(s_->Delay());
      {
        absl::MutexLock lock(&s_->mu_);
        *response = s_->map_.ToProto();
      }
      grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
      reactor->Finish(grpc::Status::OK);
      return reactor;
    }

   private:
    FakeShardServer* s_;
  };

  static grpc::Status Refuse(grpc::StatusCode code, std::string message) {
    return grpc::Status(code, std::move(message));
  }

  // Records the request and runs the checks shared by both RPCs; on OK
  // `ids` holds each table's decoded ids in request order.
  template <typename Tables>
  grpc::Status Admit(grpc::CallbackServerContext* ctx, bool lookup,
                     const v1::RequestHeader& header, const Tables& tables,
                     std::vector<std::vector<int64_t>>* ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Received r;
    r.lookup = lookup;
    r.header = header;
    const auto deadline = ctx->deadline();
    const auto now = std::chrono::system_clock::now();
    if (deadline < now + std::chrono::hours(24 * 365)) {
      r.deadline_left = absl::FromChrono(deadline - now);
    }
    const size_t violations_before = violations_.size();
    std::set<std::string> seen_tables;
    for (const auto& t : tables) {
      std::vector<int64_t> scratch;
      absl::Span<const int64_t> span;
      if (!DecodeIds(t.ids(), "ids", &scratch, &span).ok()) {
        violations_.push_back("ids not a multiple of 8 bytes");
      }
      ids->emplace_back(span.begin(), span.end());
      r.ids[t.table()] = ids->back();
      if (!seen_tables.insert(t.table()).second) {
        violations_.push_back(absl::StrCat("table ", t.table(), " twice"));
      }
      if (!tables_.count(t.table())) {
        violations_.push_back(absl::StrCat("unknown table ", t.table()));
      }
      if (std::set<int64_t>(span.begin(), span.end()).size() != span.size()) {
        violations_.push_back(absl::StrCat("duplicate ids in ", t.table()));
      }
    }
    grpc::Status status =
        violations_.size() > violations_before
            ? Refuse(grpc::StatusCode::INVALID_ARGUMENT, "malformed tables")
            : Judge(ctx, header, tables, *ids);
    r.answer = status.error_code();
    received_.push_back(std::move(r));
    if (status.ok() && next_map_.has_value() && --map_after_ <= 0) {
      map_ = *std::move(next_map_);
      next_map_.reset();
    }
    return status;
  }

  template <typename Tables>
  grpc::Status Judge(grpc::CallbackServerContext* ctx,
                     const v1::RequestHeader& header, const Tables& tables,
                     const std::vector<std::vector<int64_t>>& ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!inject_.empty()) {
      grpc::Status s = inject_.front();
      inject_.pop_front();
      return s;
    }
    if (always_.has_value()) return *always_;
    const std::string epoch = absl::StrCat(map_.epoch());
    if (header.shard_map_epoch() < map_.epoch()) {
      ctx->AddTrailingMetadata(kShardMapEpochKey, epoch);
      return Refuse(grpc::StatusCode::ABORTED, "stale shard map");
    }
    if (header.shard_map_epoch() > map_.epoch()) {
      return Refuse(grpc::StatusCode::UNAVAILABLE, "shard map behind");
    }
    if (header.worker_rank() != rank_ ||
        (step_ >= 0 && header.step() != step_)) {
      violations_.push_back(absl::StrCat("header ", header.ShortDebugString()));
      return Refuse(grpc::StatusCode::INVALID_ARGUMENT, "bad header");
    }
    const int self = map_.IndexOf(address_);
    for (size_t t = 0; t < ids.size(); ++t) {
      const uint64_t key = StableNameKey(tables[t].table());
      for (int64_t id : ids[t]) {
        if (map_.OwnerOf(key, id) != self) {
          violations_.push_back(absl::StrCat("id ", id, " not owned"));
          ctx->AddTrailingMetadata(kShardMapEpochKey, epoch);
          return Refuse(grpc::StatusCode::ABORTED, "slot not owned");
        }
      }
    }
    return grpc::Status::OK;
  }

  absl::Duration Delay() {
    absl::MutexLock lock(&mu_);
    return delay_;
  }

  grpc::Status HandleLookup(grpc::CallbackServerContext* ctx,
                            const v1::LookupRequest& request,
                            v1::LookupResponse* response) {
    absl::SleepFor(Delay());  // a test double may block its handler
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<int64_t>> ids;
    grpc::Status status =
        Admit(ctx, /*lookup=*/true, request.header(), request.tables(), &ids);
    if (!status.ok()) return status;
    for (int t = 0; t < request.tables_size(); ++t) {
      const std::string& name = request.tables(t).table();
      const int dim = tables_.at(name);
      std::vector<float> values;
      for (int64_t id : ids[t]) {
        for (int c = 0; c < dim; ++c)
          values.push_back(FakeRowValue(name, id, c));
      }
      v1::TableRows* rows = response->add_tables();
      rows->set_table(name);
      rows->set_dim(dim);
      EncodeRows(values.data(), values.size(), request.row_encoding(),
                 rows->mutable_rows());
    }
    return grpc::Status::OK;
  }

  grpc::Status HandlePush(grpc::CallbackServerContext* ctx,
                          const v1::PushGradientsRequest& request,
                          v1::PushGradientsResponse* response) {
    absl::SleepFor(Delay());
    absl::MutexLock lock(&mu_);
    std::vector<std::vector<int64_t>> ids;
    grpc::Status status =
        Admit(ctx, /*lookup=*/false, request.header(), request.tables(), &ids);
    if (!status.ok()) return status;
    for (int t = 0; t < request.tables_size(); ++t) {
      const v1::TableGradients& g = request.tables(t);
      const int dim = tables_.at(g.table());
      std::vector<float> values(ids[t].size() * dim);
      if (!DecodeRows(g.grads(), g.encoding(), values.size(), "grads",
                      values.data())
               .ok()) {
        violations_.push_back(absl::StrCat("bad grads of ", g.table()));
        return Refuse(grpc::StatusCode::INVALID_ARGUMENT, "bad grads");
      }
      for (size_t i = 0; i < ids[t].size(); ++i) {
        std::vector<float>& sum = grads_[{g.table(), ids[t][i]}];
        sum.resize(dim);
        for (int c = 0; c < dim; ++c) sum[c] += values[i * dim + c];
      }
    }
    response->set_applied_step(-1);
    return grpc::Status::OK;
  }

  const std::map<std::string, int> tables_;
  Data data_;
  Admin admin_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  mutable absl::Mutex mu_;
  ShardMap map_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  std::deque<grpc::Status> inject_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> always_ ABSL_GUARDED_BY(mu_);
  int map_after_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<ShardMap> next_map_ ABSL_GUARDED_BY(mu_);
  absl::Duration delay_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::vector<Received> received_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, std::vector<float>> grads_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace recps::client::testing

#endif  // RECPS_TESTS_CLIENT_FAKE_SHARD_SERVER_H_
