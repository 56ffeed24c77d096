// ShardServer without gRPC: every kind of bad input is refused with a clear
// status and leaves every row untouched; lookups and pushes go through.
#include "server/shard/shard_server.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/hashing.h"
#include "common/wire/replica_placement.h"
#include "common/wire/wire_format.h"
#include "prometheus/registry.h"
#include "server/shard/shard_metrics.h"
#include "kernels/embedding_optimizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/shard/shard_server_calls.h"

namespace recps::server {
namespace {

using shard_calls::Floats;
using shard_calls::Header;
using shard_calls::Ids;
using shard_calls::kSelf;
using shard_calls::Lookup;
using shard_calls::LookupSync;
using shard_calls::Push;
using shard_calls::PushSync;
using shard_calls::RowsOf;

constexpr uint32_t kSlots = 64;

std::unique_ptr<ShardServer> MakeServer(int world_size = 1,
                                        ShardMap map = ShardMap::Uniform(
                                            3, kSlots, {kSelf})) {
  config::TableSpec fixed;
  fixed.name = "fixed";
  fixed.dim = 4;
  fixed.num_rows = 100;
  fixed.optimizer.kind = OptimizerKind::kSgd;
  fixed.optimizer.learning_rate = 0.5f;
  config::TableSpec dynamic = fixed;
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

// 16-bit gradients are widened on the server and applied as the fp32 values
// they encode (the push decodes straight into its buffer).
TEST(ShardServer, HalfAndBf16GradientsApplyTheirDecodedValues) {
  for (v1::RowEncoding enc : {v1::ROW_ENCODING_FLOAT16, v1::ROW_ENCODING_BFLOAT16}) {
    auto server = MakeServer();
    v1::LookupResponse before;
    ASSERT_TRUE(LookupSync(*server, Lookup("fixed", {7, 8}), &before).ok());
    const std::vector<float> g = {0.1f, -2.5f, 3.3333f, 1e-3f, 7, 0.5f, -0.25f, 100.7f};
    v1::PushGradientsRequest req = Push("fixed", {8, 7}, g);
    std::string bytes;
    EncodeRows(g.data(), g.size(), enc, &bytes);
    req.mutable_tables(0)->set_grads(bytes);
    req.mutable_tables(0)->set_encoding(enc);
    ASSERT_TRUE(PushSync(*server, req).ok());
    std::vector<float> decoded(g.size());
    ASSERT_TRUE(DecodeRows(bytes, enc, g.size(), "g", decoded.data()).ok());
    v1::LookupResponse after;
    ASSERT_TRUE(LookupSync(*server, Lookup("fixed", {7, 8}, 1), &after).ok());
    const std::vector<float> b = RowsOf(before), a = RowsOf(after);
    for (int j = 0; j < 4; ++j) {
      // id 8 got gradient row 0, id 7 row 1 (SGD, lr 0.5).
      EXPECT_EQ(a[4 + j], b[4 + j] - 0.5f * decoded[j]) << v1::RowEncoding_Name(enc);
      EXPECT_EQ(a[j], b[j] - 0.5f * decoded[4 + j]) << v1::RowEncoding_Name(enc);
      EXPECT_NEAR(decoded[j], g[j], std::abs(g[j]) / 100) << v1::RowEncoding_Name(enc);
    }
  }
}

// An in-process caller's rows (LookupInto, PushGradients with `grads`):
// the same rows and the same update as through messages, and the requests
// that cannot go in place are refused, touching nothing.
TEST(ShardServer, RowsInPlaceMatchTheMessagePathAndBadOnesAreRefused) {
  auto via_bytes = MakeServer(), in_place = MakeServer();
  // Table fixed's gradients in place, dynamic's in the request's bytes.
  const std::vector<float> g = {1, 2, 3, 4, -1, -2, -3, -4};
  const std::vector<float> dg = {0.5f, 1, 2};
  v1::PushGradientsRequest push = Push("fixed", {7, 9}, g);
  *push.add_tables() = Push("dynamic", {-3}, dg).tables(0);
  ASSERT_TRUE(PushSync(*via_bytes, push).ok());
  push.mutable_tables(0)->clear_grads();
  const float* grads[] = {g.data(), nullptr};
  auto push_in_place = [&](const v1::PushGradientsRequest& req,
                           absl::Span<const float* const> rows) {
    absl::Notification done;
    absl::Status status;
    v1::PushGradientsResponse resp;
    in_place->PushGradients(&req, &resp, [&](absl::Status s) {
      status = s;
      done.Notify();
    }, rows);
    done.WaitForNotification();
    return status;
  };
  const absl::Status pushed = push_in_place(push, grads);
  ASSERT_TRUE(pushed.ok()) << pushed;

  auto lookup_into = [&](const v1::LookupRequest& req, absl::Span<float* const> rows) {
    absl::Notification done;
    absl::Status status;
    in_place->LookupInto(&req, rows, [&](absl::Status s) {
      status = s;
      done.Notify();
    });
    done.WaitForNotification();
    return status;
  };
  v1::LookupResponse expected;
  ASSERT_TRUE(LookupSync(*via_bytes, Lookup("fixed", {9, 7, 8}, 1), &expected).ok());
  std::vector<float> rows(3 * 4, -7.f);
  float* out[] = {rows.data()};
  ASSERT_TRUE(lookup_into(Lookup("fixed", {9, 7, 8}, 1), out).ok());
  EXPECT_EQ(rows, RowsOf(expected));
  ASSERT_TRUE(LookupSync(*via_bytes, Lookup("dynamic", {-3}, 1), &expected).ok());
  std::vector<float> dynamic_row(3);
  float* dynamic_out[] = {dynamic_row.data()};
  ASSERT_TRUE(lookup_into(Lookup("dynamic", {-3}, 1), dynamic_out).ok());
  EXPECT_EQ(dynamic_row, RowsOf(expected));

  // Refused: updated_only, 16-bit rows, a null or missing destination,
  // gradients both in place and in bytes, a count that is not the tables'.
  v1::LookupRequest req = Lookup("fixed", {9}, 1);
  req.set_updated_only(true);
  EXPECT_EQ(lookup_into(req, out).code(), absl::StatusCode::kInvalidArgument);
  req = Lookup("fixed", {9}, 1);
  req.set_row_encoding(v1::ROW_ENCODING_FLOAT16);
  EXPECT_EQ(lookup_into(req, out).code(), absl::StatusCode::kInvalidArgument);
  float* null_row[] = {nullptr};
  EXPECT_EQ(lookup_into(Lookup("fixed", {9}, 1), null_row).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lookup_into(Lookup("fixed", {9}, 1), {}).code(),
            absl::StatusCode::kInvalidArgument);
  const float* one[] = {g.data()};
  EXPECT_EQ(push_in_place(Push("fixed", {7, 9}, g, 1), one).code(),
            absl::StatusCode::kInvalidArgument);
  push.mutable_header()->set_step(1);
  EXPECT_EQ(push_in_place(push, one).code(), absl::StatusCode::kInvalidArgument);
  // Nothing above changed a row: both servers still agree.
  for (const auto& [table, ids] : {std::pair<std::string, std::vector<int64_t>>{"fixed", {7, 9}},
                                   {"dynamic", {-3}}}) {
    v1::LookupResponse a, b;
    ASSERT_TRUE(LookupSync(*via_bytes, Lookup(table, ids, 1), &a).ok());
    ASSERT_TRUE(LookupSync(*in_place, Lookup(table, ids, 1), &b).ok());
    EXPECT_EQ(RowsOf(a), RowsOf(b)) << table;
  }
}

// Sync mode's correction lookup (updated_only) answers exactly the rows the
// newest applied step updated, step after step: for the fixed table through
// a bitmap over its ids (whose bits of the step before must be cleared),
// for the dynamic one through a hash set.
TEST(ShardServer, UpdatedOnlyLookupAnswersTheNewestStepsRowsStepAfterStep) {
  auto positions = [](const v1::TableRows& t) {
    EXPECT_TRUE(t.updated_only());
    std::vector<int32_t> p(t.positions().size() / 4);
    std::memcpy(p.data(), t.positions().data(), t.positions().size());
    return p;
  };
  for (const std::string table : {"fixed", "dynamic"}) {
    SCOPED_TRACE(table);
    auto server = MakeServer();
    const int dim = table == "fixed" ? 4 : 3;
    const std::vector<float> g(2 * dim, 0.25f);
    ASSERT_TRUE(PushSync(*server, Push(table, {1, 2}, g, 0)).ok());
    v1::LookupRequest req = Lookup(table, {1, 3, 2}, 1);
    req.set_updated_only(true);
    v1::LookupResponse resp;
    ASSERT_TRUE(LookupSync(*server, req, &resp).ok());
    EXPECT_EQ(positions(resp.tables(0)), (std::vector<int32_t>{0, 2}));
    EXPECT_EQ(resp.tables(0).rows().size(), 2u * dim * 4);

    ASSERT_TRUE(PushSync(*server, Push(table, {3}, std::vector<float>(dim, 1), 1)).ok());
    req = Lookup(table, {1, 2, 3, 4}, 2);
    req.set_updated_only(true);
    ASSERT_TRUE(LookupSync(*server, req, &resp).ok());
    EXPECT_EQ(positions(resp.tables(0)), (std::vector<int32_t>{2}));  // 1, 2 are old
    v1::LookupResponse full;
    ASSERT_TRUE(LookupSync(*server, Lookup(table, {3}, 2), &full).ok());
    EXPECT_EQ(resp.tables(0).rows(), full.tables(0).rows());
  }
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

TEST(ShardServer, APrimaryWhoseLeaseLapsedTakesNoPushesOrLookups) {
  // Replication 2: this server's slots are backed up on another.
  ShardMap map = ShardMap::Uniform(3, kSlots, {kSelf, "127.0.0.1:2"});
  ASSERT_TRUE(AddBackups(2, {}, &map).ok());
  auto server = MakeServer(1, map);
  int64_t own = 0;
  while (map.OwnerOf(StableNameKey("fixed"), own) != 0) ++own;
  server->SetLeaseHeldUntil(absl::Now() - absl::Milliseconds(1));
  absl::Status s = PushSync(*server, Push("fixed", {own}, {1, 2, 3, 4}));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr("coordinator lease lapsed"));
  // Nor lookups: its clock may never move again once its backups took over.
  v1::LookupResponse looked;
  s = LookupSync(*server, Lookup("fixed", {own}), &looked);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // Renewed: the push goes on to its backup (which this test has not).
  server->SetLeaseHeldUntil(absl::Now() + absl::Seconds(10));
  s = PushSync(*server, Push("fixed", {own}, {1, 2, 3, 4}));
  EXPECT_THAT(s.message(), ::testing::Not(::testing::HasSubstr("lease")));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("cannot forward the push to backup"));
  // Without replication there is nothing to fence.
  auto alone = MakeServer();
  alone->SetLeaseHeldUntil(absl::Now() - absl::Seconds(1));
  EXPECT_TRUE(PushSync(*alone, Push("fixed", {1}, {1, 2, 3, 4})).ok());
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
  // The same map again is a retry: OK. An older epoch, or the same epoch
  // with other contents, was already delivered: ALREADY_EXISTS.
  EXPECT_TRUE(server->SetShardMap(set).ok());
  v1::SetShardMapRequest older;
  *older.mutable_shard_map() = ShardMap::Uniform(2, kSlots, {kSelf}).ToProto();
  EXPECT_EQ(server->SetShardMap(older).code(), absl::StatusCode::kAlreadyExists);
  v1::SetShardMapRequest other;
  *other.mutable_shard_map() =
      ShardMap::Uniform(3, kSlots, {kSelf, "127.0.0.1:2"}).ToProto();
  EXPECT_EQ(server->SetShardMap(other).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(server->GetShardMap().servers_size(), 1);
}

TEST(ShardServer, MapMovingASlotWithRowsIsRefusedNamingIt) {
  auto server = MakeServer();  // epoch 3, every slot here
  v1::LookupResponse before;
  ASSERT_TRUE(LookupSync(*server, Lookup("dynamic", {7}), &before).ok());
  const uint32_t slot = SlotOf(StableNameKey("dynamic"), 7, kSlots);
  // Epoch 4: the other server takes every slot but one that holds no row.
  v1::ShardMap moving = ShardMap::Uniform(4, kSlots, {kSelf}).ToProto();
  moving.add_servers("127.0.0.1:2");
  for (int s = 0; s < moving.slot_owner_size(); ++s) moving.set_slot_owner(s, 1);
  const uint32_t kept = (slot + 1) % kSlots;
  moving.set_slot_owner(kept, 0);
  v1::SetShardMapRequest set;
  *set.mutable_shard_map() = moving;
  const absl::Status s = server->SetShardMap(set);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), ::testing::HasSubstr(absl::StrCat(
                               "slot ", slot, " (1 rows) -> 127.0.0.1:2")));
  EXPECT_THAT(s.message(), ::testing::HasSubstr("would move 1 slot(s)"));
  EXPECT_EQ(server->GetShardMap().epoch(), 3u);
  // Moving only empty slots installs.
  moving.set_slot_owner(slot, 0);
  *set.mutable_shard_map() = moving;
  EXPECT_TRUE(server->SetShardMap(set).ok());
  EXPECT_EQ(server->GetShardMap().epoch(), 4u);
  v1::LookupRequest again = Lookup("dynamic", {7});
  again.mutable_header()->set_shard_map_epoch(4);
  v1::LookupResponse after;
  ASSERT_TRUE(LookupSync(*server, again, &after).ok());
  EXPECT_EQ(RowsOf(before), RowsOf(after));
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
