// The embedding client's in-process path (a shard server embedded in the
// worker, client/in_process_shard.h) against its gRPC path: two shard
// servers built alike (same tables, seed, consistency), one reached over
// gRPC, one handed the requests directly, must return the same rows bit for
// bit and end with the same rows after the same pushes, including a
// stale-epoch refusal (the client refreshes its map and re-sends) and a
// retry of a push whose answer was lost (the server drops the duplicate).
#include <algorithm>
#include <atomic>
#include <functional>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/embedding_client.h"
#include "client/in_process_shard.h"
#include "common/rpc/status_conversion.h"
#include "common/wire/shard_map.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "server/shard/shard_process.h"
#include "server/shard/shard_server.h"

namespace recps::server {
namespace {

constexpr char kTables[] = R"pb(
  tables {
    name: "a"
    dim: 8
    num_rows: 1000
    optimizer { kind: ADAGRAD learning_rate: 0.1 }
  }
  tables {
    name: "b"
    dim: 4
    num_rows: 0
    optimizer { kind: SGD learning_rate: 0.5 }
  }
)pb";

std::unique_ptr<ShardProcess> StartShard() {
  ShardProcessOptions o;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kTables, &o.tables));
  o.seed = 7;
  o.consistency.mode = ConsistencyMode::kSync;
  o.consistency.world_size = 1;
  o.standalone = true;
  o.threads = 2;
  o.store_threads = 1;
  absl::StatusOr<std::unique_ptr<ShardProcess>> p = ShardProcess::Create(std::move(o));
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return nullptr;
  EXPECT_TRUE((*p)->Serve().ok());
  return *std::move(p);
}

// Forwards to the embedded server and records what it answered; can make a
// push's answer "lost" (UNAVAILABLE after the server accepted it).
class RecordingShard final : public client::InProcessShard {
 public:
  explicit RecordingShard(client::InProcessShard* inner) : inner_(inner) {}
  const std::string& address() const override { return inner_->address(); }
  void Lookup(const v1::LookupRequest* request, grpc::ByteBuffer* response,
              absl::Time deadline, Done done) override {
    ++lookups_in_bytes;
    inner_->Lookup(request, response, deadline,
                   [this, done = std::move(done)](absl::Status s) mutable {
                     Note(s);
                     std::move(done)(std::move(s));
                   });
  }
  void PushGradients(const v1::PushGradientsRequest* request,
                     v1::PushGradientsResponse* response, Done done) override {
    push_tables_in_bytes += request->tables_size();
    const bool lose = lose_next_push_answer.exchange(false);
    inner_->PushGradients(request, response,
                          [this, lose, done = std::move(done)](absl::Status s) mutable {
                            Note(s);
                            if (lose && s.ok()) s = absl::UnavailableError("answer lost");
                            std::move(done)(std::move(s));
                          });
  }
  void LookupInto(const v1::LookupRequest* request, absl::Span<float* const> rows,
                  uint64_t* incarnation, int64_t* applied_step, absl::Time deadline,
                  Done done) override {
    ++lookups_in_place;
    inner_->LookupInto(request, rows, incarnation, applied_step, deadline,
                       [this, done = std::move(done)](absl::Status s) mutable {
                         Note(s);
                         std::move(done)(std::move(s));
                       });
  }
  void PushGradientsFrom(const v1::PushGradientsRequest* request,
                         absl::Span<const float* const> grads,
                         v1::PushGradientsResponse* response, Done done) override {
    for (int i = 0; i < request->tables_size(); ++i) {
      (grads[i] != nullptr ? push_tables_in_place : push_tables_in_bytes) += 1;
    }
    const bool lose = lose_next_push_answer.exchange(false);
    inner_->PushGradientsFrom(request, grads, response,
                              [this, lose, done = std::move(done)](absl::Status s) mutable {
                                Note(s);
                                if (lose && s.ok()) s = absl::UnavailableError("answer lost");
                                std::move(done)(std::move(s));
                              });
  }
  std::vector<absl::StatusCode> codes() {
    absl::MutexLock lock(&mu_);
    return codes_;
  }
  std::atomic<bool> lose_next_push_answer{false};
  // Which way rows went: in place (the caller's memory) or in messages.
  std::atomic<int> lookups_in_place{0};
  std::atomic<int> lookups_in_bytes{0};
  std::atomic<int> push_tables_in_place{0};
  std::atomic<int> push_tables_in_bytes{0};

 private:
  void Note(const absl::Status& s) {
    absl::MutexLock lock(&mu_);
    codes_.push_back(s.code());
  }
  client::InProcessShard* const inner_;
  absl::Mutex mu_;
  std::vector<absl::StatusCode> codes_;
};

std::unique_ptr<client::EmbeddingClient> MakeClient(const std::string& address,
                                                    client::InProcessShard* in_process) {
  client::EmbeddingClientOptions options;
  options.in_process_shard = in_process;
  options.security = rpc::TransportSecurity::Insecure();
  options.initial_backoff = absl::Milliseconds(1);
  options.max_backoff = absl::Milliseconds(5);
  options.max_ids_per_lookup_request = 16;  // several chunks per lookup
  absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> c =
      client::EmbeddingClient::Create(
          {{"a", 8}, {"b", 4}},
          client::MakeServerShardMapSource({address}, rpc::TransportSecurity::Insecure()),
          options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Moves the server to a new map epoch (same single server): the client's
// next call is refused as stale and must refresh.
void BumpEpoch(ShardProcess& p, uint64_t epoch) {
  ShardMap map = ShardMap::Uniform(epoch, 4096, {p.address()});
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = map.ToProto();
  set.set_self(p.address());
  ASSERT_TRUE(p.server().SetShardMap(set).ok());
}

struct Step {
  std::vector<int64_t> a_ids, b_ids;
};

// Runs `steps` of lookup + push (gradients derived from the rows read) and
// returns every row read, in order.
std::vector<float> Train(client::EmbeddingClient& c, const std::vector<Step>& steps,
                         int64_t first_step, const std::function<void(int)>& before) {
  std::vector<float> read;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (before) before(static_cast<int>(i));
    const Step& s = steps[i];
    std::vector<float> a(s.a_ids.size() * 8), b(s.b_ids.size() * 4);
    const client::LookupSpec specs[] = {{0, s.a_ids, a.data()}, {1, s.b_ids, b.data()}};
    const int64_t step = first_step + static_cast<int64_t>(i);
    EXPECT_TRUE(c.Lookup(step, specs).ok());
    read.insert(read.end(), a.begin(), a.end());
    read.insert(read.end(), b.begin(), b.end());
    std::vector<float> ga(a.size()), gb(b.size());
    for (size_t k = 0; k < a.size(); ++k) ga[k] = 0.25f * a[k] + 0.01f * static_cast<float>(k % 5);
    for (size_t k = 0; k < b.size(); ++k) gb[k] = -0.5f * b[k] + 0.02f;
    const client::PushSpec push[] = {{0, s.a_ids, ga.data()}, {1, s.b_ids, gb.data()}};
    EXPECT_TRUE(c.PushGradients(step, push).ok());
  }
  return read;
}

TEST(InProcessShardTest, SameRowsAndUpdatesAsGrpcWithRefusalAndRetry) {
  std::unique_ptr<ShardProcess> grpc_shard = StartShard();
  std::unique_ptr<ShardProcess> local_shard = StartShard();
  ASSERT_NE(grpc_shard, nullptr);
  ASSERT_NE(local_shard, nullptr);
  RecordingShard recording(local_shard->endpoint());
  std::unique_ptr<client::EmbeddingClient> remote = MakeClient(grpc_shard->address(), nullptr);
  std::unique_ptr<client::EmbeddingClient> local =
      MakeClient(local_shard->address(), &recording);
  ASSERT_NE(remote, nullptr);
  ASSERT_NE(local, nullptr);

  std::vector<Step> steps;
  for (int i = 0; i < 6; ++i) {
    Step s;
    for (int k = 0; k < 40; ++k) s.a_ids.push_back((k * 37 + i * 11) % 1000);
    for (int k = 0; k < 10; ++k) s.b_ids.push_back(int64_t{1} << 40 | (k * 3 + i));
    s.a_ids.push_back(s.a_ids[0]);  // a repeated id: rows summed
    steps.push_back(std::move(s));
  }
  // Step 2: both servers move to epoch 2 (a stale-map refusal each); step 4:
  // the in-process push's answer is lost after the server accepted it.
  auto before = [&](ShardProcess& p, RecordingShard* r) {
    return [&p, r](int i) {
      if (i == 2) BumpEpoch(p, 2);
      if (i == 4 && r != nullptr) r->lose_next_push_answer = true;
    };
  };
  const std::vector<float> remote_read =
      Train(*remote, steps, 0, before(*grpc_shard, nullptr));
  const std::vector<float> local_read = Train(*local, steps, 0, before(*local_shard, &recording));
  ASSERT_EQ(remote_read.size(), local_read.size());
  EXPECT_EQ(0, std::memcmp(remote_read.data(), local_read.data(),
                           remote_read.size() * sizeof(float)));
  EXPECT_EQ(remote->shard_map_epoch(), 2u);
  EXPECT_EQ(local->shard_map_epoch(), 2u);

  // Both ways of handing rows over ran: lookup chunks of distinct ids in
  // place, those with table a's repeated id (its row goes to two places)
  // in bytes; the pushes' rows (the caller's, or table a's summed ones)
  // follow each other, so every table went in place.
  EXPECT_GT(recording.lookups_in_place.load(), 0);
  EXPECT_GT(recording.lookups_in_bytes.load(), 0);
  EXPECT_GT(recording.push_tables_in_place.load(), 0);
  EXPECT_EQ(recording.push_tables_in_bytes.load(), 0);

  // The in-process server saw the refusal and the duplicate push.
  const std::vector<absl::StatusCode> codes = recording.codes();
  // One refusal per request of the step-2 lookup (it is sent in chunks).
  EXPECT_GE(std::count(codes.begin(), codes.end(), absl::StatusCode::kAborted), 1);
  // 6 lookups (several chunks each), 6 pushes, the refused call once more,
  // the lost push once more: the retry was accepted (and dropped) as OK.
  EXPECT_GE(std::count(codes.begin(), codes.end(), absl::StatusCode::kOk), 14);

  // The rows after training: the same, bit for bit (the lost push was
  // applied once, as over gRPC where no answer was lost).
  std::vector<int64_t> all_a(1000);
  for (int i = 0; i < 1000; ++i) all_a[i] = i;
  std::vector<float> ra(1000 * 8), la(1000 * 8);
  ASSERT_TRUE(remote->Lookup(6, std::vector<client::LookupSpec>{{0, all_a, ra.data()}}).ok());
  ASSERT_TRUE(local->Lookup(6, std::vector<client::LookupSpec>{{0, all_a, la.data()}}).ok());
  EXPECT_EQ(0, std::memcmp(ra.data(), la.data(), ra.size() * sizeof(float)));
}

// A stale-epoch refusal from the in-process server carries the epoch the
// client refreshes to, as the gRPC trailer does.
TEST(InProcessShardTest, StaleEpochRefusalCarriesTheEpoch) {
  std::unique_ptr<ShardProcess> shard = StartShard();
  ASSERT_NE(shard, nullptr);
  BumpEpoch(*shard, 5);
  v1::LookupRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  request.mutable_header()->set_step(0);
  v1::TableIds* t = request.add_tables();
  t->set_table("a");
  const int64_t id = 3;
  t->set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  grpc::ByteBuffer response;
  absl::Status got = absl::UnknownError("not called");
  shard->endpoint()->Lookup(&request, &response, absl::Now() + absl::Seconds(10),
                            [&got](absl::Status s) { got = std::move(s); });
  ASSERT_TRUE(absl::IsAborted(got)) << got;
  auto epoch = got.GetPayload(kShardMapEpochKey);
  ASSERT_TRUE(epoch.has_value());
  EXPECT_EQ(rpc::ParseShardMapEpoch(std::string(*epoch)), 5u);
}

// A lookup parked for a step that never comes ends at its deadline with
// DEADLINE_EXCEEDED, as over gRPC.
TEST(InProcessShardTest, ParkedLookupEndsAtItsDeadline) {
  std::unique_ptr<ShardProcess> shard = StartShard();
  ASSERT_NE(shard, nullptr);
  v1::LookupRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  request.mutable_header()->set_step(3);  // steps 0..2 never pushed
  v1::TableIds* t = request.add_tables();
  t->set_table("a");
  const int64_t id = 3;
  t->set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  grpc::ByteBuffer response;
  absl::Notification done;
  absl::Status got;
  shard->endpoint()->Lookup(&request, &response, absl::Now() + absl::Milliseconds(200),
                            [&](absl::Status s) {
                              got = std::move(s);
                              done.Notify();
                            });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got)) << got;
}

}  // namespace
}  // namespace recps::server
