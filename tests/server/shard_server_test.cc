// ShardServer without gRPC: every kind of bad input is refused with a clear
// status and leaves every row untouched; lookups and pushes go through.
#include "server/shard_server.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/synchronization/notification.h"
#include "common/wire_format.h"
#include "prometheus/registry.h"
#include "server/shard_metrics.h"
#include "gtest/gtest.h"

namespace recps::server {
namespace {

constexpr char kSelf[] = "127.0.0.1:1";
constexpr uint32_t kSlots = 64;

std::unique_ptr<ShardServer> MakeServer(int world_size = 1,
                                        ShardMap map = ShardMap::Uniform(
                                            3, kSlots, {kSelf})) {
  TableSpec fixed;
  fixed.name = "fixed";
  fixed.dim = 4;
  fixed.num_rows = 100;
  fixed.optimizer.kind = kernels::OptimizerKind::kSgd;
  fixed.optimizer.learning_rate = 0.5f;
  TableSpec dynamic = fixed;
  dynamic.name = "dynamic";
  dynamic.num_rows = 0;
  dynamic.dim = 3;
  StoreOptions store_options;
  store_options.num_slots = kSlots;
  store_options.max_rows_per_table = 1000;
  auto store = CreateHostEmbeddingStore({fixed, dynamic}, store_options);
  EXPECT_TRUE(store.ok()) << store.status();
  ShardServerOptions options;
  options.self_address = kSelf;
  options.num_slots = kSlots;
  options.max_ids_per_request = 1000;
  options.consistency.world_size = world_size;
  options.consistency.step_timeout = absl::Seconds(5);
  options.work_threads = 2;
  auto server = ShardServer::Create(*std::move(store), std::move(map), options, nullptr);
  EXPECT_TRUE(server.ok()) << server.status();
  return *std::move(server);
}

v1::RequestHeader Header(int64_t step = 0, int rank = 0, uint64_t epoch = 3) {
  v1::RequestHeader h;
  h.set_shard_map_epoch(epoch);
  h.set_step(step);
  h.set_worker_rank(rank);
  return h;
}

std::string Ids(std::vector<int64_t> ids) {
  std::string s;
  EncodeIds(ids, &s);
  return s;
}

std::string Floats(std::vector<float> v) {
  std::string s;
  EncodeRows(v.data(), v.size(), v1::ROW_ENCODING_FLOAT32, &s);
  return s;
}

// Also checks that the hand-serialized response parses as a
// v1::LookupResponse.
absl::Status LookupSync(ShardServer& server, const v1::LookupRequest& req,
                        v1::LookupResponse* resp) {
  absl::Notification done;
  absl::Status status;
  SerializedLookupResponse serialized;
  server.Lookup(&req, &serialized, [&](absl::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  if (status.ok() && !resp->ParseFromString(serialized.ToString())) {
    return absl::InternalError("the lookup response does not parse");
  }
  return status;
}

absl::Status PushSync(ShardServer& server, const v1::PushGradientsRequest& req) {
  absl::Notification done;
  absl::Status status;
  v1::PushGradientsResponse resp;
  server.PushGradients(&req, &resp, [&](absl::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

v1::LookupRequest Lookup(const std::string& table, std::vector<int64_t> ids,
                         int64_t step = 0) {
  v1::LookupRequest req;
  *req.mutable_header() = Header(step);
  auto* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Ids(ids));
  return req;
}

v1::PushGradientsRequest Push(const std::string& table, std::vector<int64_t> ids,
                              std::vector<float> grads, int64_t step = 0) {
  v1::PushGradientsRequest req;
  *req.mutable_header() = Header(step);
  auto* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Ids(ids));
  t->set_grads(Floats(grads));
  return req;
}

std::vector<float> RowsOf(const v1::LookupResponse& resp, int i = 0) {
  const std::string& b = resp.tables(i).rows();
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

TEST(ShardServer, LookupThenPushAppliesSgd) {
  auto server = MakeServer();
  v1::LookupResponse before;
  ASSERT_TRUE(LookupSync(*server, Lookup("fixed", {1, 2}), &before).ok());
  ASSERT_EQ(before.tables(0).dim(), 4);
  ASSERT_TRUE(PushSync(*server, Push("fixed", {2}, {1, 2, 3, 4})).ok());
  v1::LookupResponse after;
  ASSERT_TRUE(LookupSync(*server, Lookup("fixed", {1, 2}, 1), &after).ok());
  std::vector<float> b = RowsOf(before), a = RowsOf(after);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(a[j], b[j]);                           // id 1 untouched
    EXPECT_EQ(a[4 + j], b[4 + j] - 0.5f * (j + 1));  // id 2: w - lr * g
  }
}

TEST(ShardServer, Fp16LookupHalvesThePayload) {
  auto server = MakeServer();
  v1::LookupRequest req = Lookup("dynamic", {5, -5, std::numeric_limits<int64_t>::max()});
  req.set_row_encoding(v1::ROW_ENCODING_FLOAT16);
  v1::LookupResponse resp;
  ASSERT_TRUE(LookupSync(*server, req, &resp).ok());
  EXPECT_EQ(resp.tables(0).rows().size(), 3u * 3 * 2);
}

// Each bad request: its status code, a phrase of its message, and no row
// may change (checked by looking up every touched row before and after).
struct BadCase {
  const char* name;
  absl::StatusCode code;
  const char* phrase;
};

class ShardServerBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = MakeServer(2);
    ASSERT_TRUE(LookupSync(*server_, Lookup("fixed", {1, 2, 3}), &before_).ok());
  }
  void ExpectRowsUnchanged() {
    // Read at step 0 again (still allowed: nothing applied in this test).
    v1::LookupResponse now;
    ASSERT_TRUE(LookupSync(*server_, Lookup("fixed", {1, 2, 3}), &now).ok());
    EXPECT_EQ(RowsOf(now), RowsOf(before_));
    EXPECT_EQ(server_->store().Info(0).rows, 3);
  }
  void ExpectPushRefused(const v1::PushGradientsRequest& req,
                         absl::StatusCode code, const char* phrase) {
    const absl::Status s = PushSync(*server_, req);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(phrase), absl::string_view::npos) << s;
    ExpectRowsUnchanged();
  }
  void ExpectLookupRefused(const v1::LookupRequest& req, absl::StatusCode code,
                           const char* phrase) {
    v1::LookupResponse resp;
    const absl::Status s = LookupSync(*server_, req, &resp);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(s.message().find(phrase), absl::string_view::npos) << s;
    ExpectRowsUnchanged();
  }
  std::unique_ptr<ShardServer> server_;
  v1::LookupResponse before_;
};

TEST_F(ShardServerBadInput, UnknownTable) {
  ExpectLookupRefused(Lookup("nope", {1}), absl::StatusCode::kNotFound, "nope");
  ExpectPushRefused(Push("nope", {1}, {1, 1, 1, 1}), absl::StatusCode::kNotFound, "nope");
}

TEST_F(ShardServerBadInput, IdBeyondFixedTable) {
  ExpectLookupRefused(Lookup("fixed", {1, 100}), absl::StatusCode::kInvalidArgument, "100");
  ExpectPushRefused(Push("fixed", {100}, {1, 1, 1, 1}),
                    absl::StatusCode::kInvalidArgument, "100");
}

TEST_F(ShardServerBadInput, GradientWidthOrLengthMismatch) {
  ExpectPushRefused(Push("fixed", {1}, {1, 1, 1}), absl::StatusCode::kInvalidArgument,
                    "expected 4 values");
  v1::PushGradientsRequest odd = Push("fixed", {1}, {1, 1, 1, 1});
  odd.mutable_tables(0)->mutable_grads()->push_back('x');
  ExpectPushRefused(odd, absl::StatusCode::kInvalidArgument, "17 bytes");
}

TEST_F(ShardServerBadInput, NanAndInfGradients) {
  ExpectPushRefused(Push("fixed", {1}, {1, std::nanf(""), 1, 1}),
                    absl::StatusCode::kInvalidArgument, "1");
  ExpectPushRefused(Push("fixed", {2}, {1, 1, INFINITY, 1}),
                    absl::StatusCode::kInvalidArgument, "2");
}

TEST_F(ShardServerBadInput, DuplicateIdsInOnePush) {
  ExpectPushRefused(Push("fixed", {3, 3}, {1, 1, 1, 1, 1, 1, 1, 1}),
                    absl::StatusCode::kInvalidArgument, "3");
}

TEST_F(ShardServerBadInput, RequestOverTheSizeLimit) {
  std::vector<int64_t> many(1001);
  for (int i = 0; i < 1001; ++i) many[i] = i;
  ExpectLookupRefused(Lookup("dynamic", many), absl::StatusCode::kResourceExhausted,
                      "max_ids_per_request=1000");
}

TEST_F(ShardServerBadInput, StaleEpochCarriesTheCurrentOne) {
  v1::LookupRequest req = Lookup("fixed", {1});
  req.mutable_header()->set_shard_map_epoch(2);
  v1::LookupResponse resp;
  const absl::Status s = LookupSync(*server_, req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(s.GetPayload(kShardMapEpochKey).has_value());
  EXPECT_EQ(std::string(*s.GetPayload(kShardMapEpochKey)), "3");
  ExpectRowsUnchanged();
}

TEST_F(ShardServerBadInput, StepFromThePastInSyncMode) {
  v1::PushGradientsRequest r0 = Push("fixed", {1}, {0, 0, 0, 0});
  ASSERT_TRUE(PushSync(*server_, r0).ok());
  r0.mutable_header()->set_worker_rank(1);
  ASSERT_TRUE(PushSync(*server_, r0).ok());  // step 0 applied (zero grads)
  ExpectPushRefused(Push("fixed", {1}, {1, 1, 1, 1}, 0),
                    absl::StatusCode::kFailedPrecondition, "already applied");
}

TEST_F(ShardServerBadInput, RankOutsideTheJob) {
  v1::PushGradientsRequest req = Push("fixed", {1}, {1, 1, 1, 1});
  req.mutable_header()->set_worker_rank(2);
  ExpectPushRefused(req, absl::StatusCode::kInvalidArgument, "rank 2");
}

TEST_F(ShardServerBadInput, MalformedIdBytes) {
  v1::LookupRequest req = Lookup("fixed", {1});
  req.mutable_tables(0)->mutable_ids()->append("abc");
  ExpectLookupRefused(req, absl::StatusCode::kInvalidArgument, "11 bytes of ids");
}

TEST_F(ShardServerBadInput, EmptyLookup) {
  v1::LookupRequest req;
  *req.mutable_header() = Header();
  ExpectLookupRefused(req, absl::StatusCode::kInvalidArgument, "empty lookup");
}

TEST(ShardServer, IdsOfAnotherServersSlotsAreRefusedWithTheEpoch) {
  ShardMap map = ShardMap::Uniform(3, kSlots, {kSelf, "127.0.0.1:2"});
  auto server = MakeServer(1, map);
  // Find an id the other server owns.
  int64_t foreign = 0;
  while (map.OwnerOf(StableNameKey("dynamic"), foreign) == 0) ++foreign;
  v1::LookupResponse resp;
  const absl::Status s = LookupSync(*server, Lookup("dynamic", {foreign}), &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_NE(s.message().find("not owned"), absl::string_view::npos) << s;
}

TEST(ShardServer, NoMapYetMeansUnavailable) {
  auto server = MakeServer(1, ShardMap());
  v1::LookupResponse resp;
  EXPECT_EQ(LookupSync(*server, Lookup("fixed", {1}), &resp).code(),
            absl::StatusCode::kUnavailable);
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = ShardMap::Uniform(3, kSlots, {kSelf}).ToProto();
  ASSERT_TRUE(server->SetShardMap(set).ok());
  EXPECT_TRUE(LookupSync(*server, Lookup("fixed", {1}), &resp).ok());
  // An older or equal epoch is refused.
  EXPECT_EQ(server->SetShardMap(set).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShardServer, StatsReportRowsAndSlots) {
  auto server = MakeServer();
  v1::LookupResponse resp;
  ASSERT_TRUE(LookupSync(*server, Lookup("dynamic", {1, 2, 3, 4}), &resp).ok());
  v1::StatsRequest req;
  req.set_include_slots(true);
  v1::StatsResponse stats;
  ASSERT_TRUE(server->Stats(req, &stats).ok());
  EXPECT_EQ(stats.total_rows(), 4);
  EXPECT_EQ(stats.slots_size(), static_cast<int>(kSlots));
  int64_t slot_rows = 0;
  for (const auto& s : stats.slots()) slot_rows += s.rows();
  EXPECT_EQ(slot_rows, 4);
  EXPECT_EQ(stats.shard_map_epoch(), 3u);
  EXPECT_GT(stats.resident_bytes(), 0);
}

// Stats carries each RPC's count, errors and latency histogram.
TEST(ShardMetricsTest, RpcStatsForStats) {
  prometheus::Registry registry;
  ShardMetrics metrics(registry);
  for (int i = 0; i < 3; ++i) metrics.RecordRequest("Lookup", absl::StatusCode::kOk, 0.001);
  metrics.RecordRequest("Lookup", absl::StatusCode::kNotFound, 0.2);
  metrics.RecordRequest("PushGradients", absl::StatusCode::kOk, 1000.0);
  v1::StatsResponse response;
  metrics.AppendRpcStats(&response);
  ASSERT_EQ(response.rpcs_size(), 2);
  const v1::RpcStats& lookup = response.rpcs(0);
  EXPECT_EQ(lookup.rpc(), "Lookup");
  EXPECT_EQ(lookup.count(), 4);
  EXPECT_EQ(lookup.errors(), 1);
  EXPECT_NEAR(lookup.latency_seconds_sum(), 0.203, 1e-9);
  ASSERT_EQ(lookup.bucket_counts_size(), lookup.bucket_upper_seconds_size() + 1);
  int64_t total = 0;
  for (int i = 0; i < lookup.bucket_counts_size(); ++i) {
    total += lookup.bucket_counts(i);
    if (i > 0 && i < lookup.bucket_upper_seconds_size()) {
      EXPECT_LT(lookup.bucket_upper_seconds(i - 1), lookup.bucket_upper_seconds(i));
    }
  }
  EXPECT_EQ(total, 4);
  const v1::RpcStats& push = response.rpcs(1);
  EXPECT_EQ(push.rpc(), "PushGradients");
  EXPECT_EQ(push.errors(), 0);
  EXPECT_EQ(push.bucket_counts(push.bucket_counts_size() - 1), 1);  // overflow
}

}  // namespace
}  // namespace recps::server
