// The coordinator's domain class with a fake clock and a RocksDB state dir:
// no gRPC, no sleeping.
#include "server/coordinator/coordinator.h"

#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "common/wire/replica_placement.h"
#include "common/wire/shard_map.h"
#include "server/coordinator/coordinator_store.h"
#include "tests/testing/local_shard.h"

namespace recps::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CoordinatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<Coordinator> Open(int num_shards = 2, int replication = 0) {
    auto store = CoordinatorStore::Open(dir_.path() + "/state");
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    CoordinatorOptions options;
    options.num_shards = num_shards;
    options.num_slots = 64;
    options.lease = absl::Seconds(10);
    options.replication = replication;
    options.stall = stall_;
    options.clock = [this] { return now_; };
    auto c = Coordinator::Create(*std::move(store), options, &registry_);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return nullptr;
    (*c)->SetMapPusher([this](const std::string& address, const v1::ShardMap& map) {
      pushed_.emplace_back(address, map.epoch());
    });
    return *std::move(c);
  }

  static v1::RegisterRequest Shard(const std::string& address) {
    v1::RegisterRequest r;
    r.set_role(v1::SHARD_SERVER);
    r.set_address(address);
    return r;
  }
  static v1::RegisterRequest Worker(int rank) {
    v1::RegisterRequest r;
    r.set_role(v1::WORKER);
    r.set_address("127.0.0.1:" + std::to_string(9000 + rank));
    r.set_rank(rank);
    return r;
  }
  static v1::BarrierRequest Arrive(const std::string& name, int count, int rank,
                                   int64_t timeout_ms = 5000) {
    v1::BarrierRequest r;
    r.set_name(name);
    r.set_count(count);
    r.set_rank(rank);
    r.set_timeout_ms(timeout_ms);
    return r;
  }

  // The value of metric `name` with label role=`role`, or -1.
  double Metric(const std::string& name, const std::string& role) const {
    return Metric(name, "role", role);
  }
  double Metric(const std::string& name, const std::string& label_name,
                const std::string& label_value) const {
    for (const auto& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const auto& m : family.metric) {
        for (const auto& label : m.label) {
          if (label.name == label_name && label.value == label_value) {
            return family.type == prometheus::MetricType::Counter ? m.counter.value
                                                                   : m.gauge.value;
          }
        }
      }
    }
    return -1;
  }

  recps::testing::TempDir dir_;
  prometheus::Registry registry_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  absl::Duration stall_ = absl::ZeroDuration();  // the coordinator's default
  std::vector<std::pair<std::string, uint64_t>> pushed_;
};

TEST_F(CoordinatorTest, RegisterAndHeartbeat) {
  auto c = Open();
  auto r = c->Register(Worker(0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->member_id(), "worker-0");
  EXPECT_EQ(r->lease_ms(), 10000);
  EXPECT_FALSE(r->has_job());
  v1::HeartbeatRequest hb;
  hb.set_member_id("worker-0");
  EXPECT_TRUE(c->Heartbeat(hb).ok());
  hb.set_member_id("nobody");
  EXPECT_TRUE(absl::IsNotFound(c->Heartbeat(hb).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(c->Register(v1::RegisterRequest()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(c->Register(Shard("")).status()));
  // The same rank registering again keeps its id.
  EXPECT_EQ(c->Register(Worker(0))->member_id(), "worker-0");
  EXPECT_EQ(c->Register(Worker(1))->member_id(), "worker-1");
}

TEST_F(CoordinatorTest, LeaseExpiryMarksMemberExpired) {
  auto c = Open();
  ASSERT_TRUE(c->Register(Worker(0)).ok());
  ASSERT_TRUE(c->Register(Worker(1)).ok());
  v1::HeartbeatRequest hb;
  hb.set_member_id("worker-1");
  now_ += absl::Seconds(6);
  ASSERT_TRUE(c->Heartbeat(hb).ok());
  now_ += absl::Seconds(6);  // worker-0: 12 s silent; worker-1: 6 s
  c->Tick();
  v1::ListMembersResponse list = c->ListMembers();
  ASSERT_EQ(list.members_size(), 2);
  EXPECT_EQ(list.members(0).state(), v1::EXPIRED);
  EXPECT_EQ(list.members(1).state(), v1::ALIVE);
  EXPECT_EQ(list.lease_expirations(), 1);
  EXPECT_EQ(Metric("recps_coordinator_lease_expirations_total", "worker"), 1);
  hb.set_member_id("worker-0");
  EXPECT_TRUE(absl::IsFailedPrecondition(c->Heartbeat(hb).status()));
  // Registering again revives the same member.
  EXPECT_EQ(c->Register(Worker(0))->member_id(), "worker-0");
  EXPECT_EQ(c->ListMembers().members(0).state(), v1::ALIVE);
}

TEST_F(CoordinatorTest, LeaveMarksMemberLeftNotExpiredAndSurvivesRestart) {
  {
    auto c = Open();
    ASSERT_TRUE(c->Register(Worker(0)).ok());
    ASSERT_TRUE(c->Register(Worker(1)).ok());
    v1::LeaveRequest leave;
    leave.set_member_id("worker-0");
    ASSERT_TRUE(c->Leave(leave).ok());
    EXPECT_TRUE(c->Leave(leave).ok()) << "leaving twice is fine";
    now_ += absl::Seconds(30);
    c->Tick();  // worker-1 expires; worker-0 has left and does not
    v1::ListMembersResponse list = c->ListMembers();
    ASSERT_EQ(list.members_size(), 2);
    EXPECT_EQ(list.members(0).state(), v1::LEFT);
    EXPECT_EQ(list.members(1).state(), v1::EXPIRED);
    EXPECT_EQ(list.lease_expirations(), 1);
    v1::HeartbeatRequest hb;
    hb.set_member_id("worker-0");
    absl::Status s = c->Heartbeat(hb).status();
    EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("left"));
    leave.set_member_id("worker-9");
    EXPECT_TRUE(absl::IsNotFound(c->Leave(leave)));
  }
  auto c = Open();  // the same store: LEFT is kept
  EXPECT_EQ(c->ListMembers().members(0).state(), v1::LEFT);
  EXPECT_EQ(c->Register(Worker(0))->member_id(), "worker-0");
  EXPECT_EQ(c->ListMembers().members(0).state(), v1::ALIVE);
}

TEST_F(CoordinatorTest, ShardMapBuiltOnceEnoughShardsRegistered) {
  auto c = Open(/*num_shards=*/2);
  std::vector<uint64_t> watched;
  const int64_t watch = c->Watch(0, [&](const v1::ShardMap& m) { watched.push_back(m.epoch()); });
  ASSERT_TRUE(c->Register(Shard("127.0.0.1:7002")).ok());
  EXPECT_TRUE(absl::IsUnavailable(c->GetShardMap().status()));
  EXPECT_THAT(c->GetShardMap().status().message(), HasSubstr("1 of 2"));
  ASSERT_TRUE(c->Register(Shard("127.0.0.1:7001")).ok());
  auto map = c->GetShardMap();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 1u);
  EXPECT_EQ(map->num_slots(), 64u);
  // Sorted by address, not by arrival.
  EXPECT_THAT(map->servers(), ElementsAre("127.0.0.1:7001", "127.0.0.1:7002"));
  EXPECT_EQ(pushed_.size(), 2u);
  EXPECT_THAT(watched, ElementsAre(1u));
  // A late third server is registered but changes no map.
  ASSERT_TRUE(c->Register(Shard("127.0.0.1:7000")).ok());
  EXPECT_EQ(c->GetShardMap()->servers_size(), 2);
  // A server of the map that registers again (restarted) gets it again.
  ASSERT_TRUE(c->Register(Shard("127.0.0.1:7002")).ok());
  EXPECT_EQ(pushed_.back(), std::make_pair(std::string("127.0.0.1:7002"), uint64_t{1}));
  c->Unwatch(watch);
  // A watcher that knows epoch 1 gets nothing until a newer map.
  std::vector<uint64_t> late;
  c->Unwatch(c->Watch(1, [&](const v1::ShardMap& m) { late.push_back(m.epoch()); }));
  EXPECT_TRUE(late.empty());
}

TEST_F(CoordinatorTest, ALostShardServersBackupsArePromotedInANewEpoch) {
  auto c = Open(/*num_shards=*/3, /*replication=*/2);
  std::vector<uint64_t> watched;
  const int64_t watch = c->Watch(0, [&](const v1::ShardMap& m) { watched.push_back(m.epoch()); });
  for (const char* a : {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}) {
    ASSERT_TRUE(c->Register(Shard(a)).ok());
  }
  auto first = c->GetShardMap();
  ASSERT_TRUE(first.ok()) << first.status();
  auto before = ShardMap::FromProto(*first);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->replication(), 2);
  const auto heartbeat = [&](const std::string& id) {
    v1::HeartbeatRequest hb;
    hb.set_member_id(id);
    return c->Heartbeat(hb).ok();
  };
  // shard-0 (127.0.0.1:7000, index 0) goes silent.
  pushed_.clear();
  now_ += absl::Seconds(6);
  ASSERT_TRUE(heartbeat("shard-1") && heartbeat("shard-2"));
  now_ += absl::Seconds(6);
  c->Tick();
  auto after = c->GetShardMap();
  ASSERT_TRUE(after.ok());
  auto want = PromoteBackups(*before, 0);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(after->SerializeAsString(), want->ToProto().SerializeAsString());
  EXPECT_EQ(after->epoch(), 2u);
  EXPECT_THAT(pushed_, ElementsAre(std::make_pair(std::string("127.0.0.1:7001"), uint64_t{2}),
                                   std::make_pair(std::string("127.0.0.1:7002"), uint64_t{2})));
  EXPECT_THAT(watched, ElementsAre(1u, 2u));
  EXPECT_EQ(Metric("recps_coordinator_failovers_total", "result", "promoted"), 1);
  // shard-1 goes too: the units it took over have no copy left. The map
  // stays (the job falls back to its checkpoint restart).
  now_ += absl::Seconds(6);
  ASSERT_TRUE(heartbeat("shard-2"));
  now_ += absl::Seconds(6);
  c->Tick();
  EXPECT_EQ(c->GetShardMap()->epoch(), 2u);
  EXPECT_EQ(Metric("recps_coordinator_failovers_total", "result", "data_loss"), 1);
  c->Unwatch(watch);
}

TEST_F(CoordinatorTest, ACoordinatorThatStalledGivesFreshLeasesNotFailovers) {
  stall_ = absl::Milliseconds(50);
  auto c = Open(/*num_shards=*/3, /*replication=*/2);
  for (const char* a : {"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"}) {
    ASSERT_TRUE(c->Register(Shard(a)).ok());
  }
  c->Tick();
  // The coordinator stops for longer than the lease (its clock runs on,
  // heartbeats go unanswered): silent members, but its own silence.
  absl::SleepFor(absl::Milliseconds(100));
  now_ += absl::Seconds(12);
  c->Tick();
  const v1::ListMembersResponse members = c->ListMembers();
  for (const v1::Member& m : members.members()) EXPECT_EQ(m.state(), v1::ALIVE);
  EXPECT_EQ(c->GetShardMap()->epoch(), 1u);
  // Ticking on, a silent server's lease runs out as usual.
  now_ += absl::Seconds(6);
  for (const char* id : {"shard-1", "shard-2"}) {
    v1::HeartbeatRequest hb;
    hb.set_member_id(id);
    ASSERT_TRUE(c->Heartbeat(hb).ok());
  }
  now_ += absl::Seconds(6);
  c->Tick();
  EXPECT_EQ(c->ListMembers().members(0).state(), v1::EXPIRED);
  EXPECT_EQ(c->GetShardMap()->epoch(), 2u);
}

TEST_F(CoordinatorTest, KvSetGetAndWait) {
  auto c = Open();
  ASSERT_TRUE(c->KvSet("nccl/uid", "abc").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(c->KvSet("", "x")));
  absl::StatusOr<std::string> got;
  c->KvGet("nccl/uid", absl::ZeroDuration(), [&](absl::StatusOr<std::string> v) { got = v; });
  EXPECT_EQ(*got, "abc");
  c->KvGet("absent", absl::ZeroDuration(), [&](absl::StatusOr<std::string> v) { got = v; });
  EXPECT_TRUE(absl::IsNotFound(got.status()));

  // A waiting get finishes when the key is set...
  bool called = false;
  c->KvGet("later", absl::Seconds(5), [&](absl::StatusOr<std::string> v) {
    called = true;
    got = v;
  });
  EXPECT_FALSE(called);
  ASSERT_TRUE(c->KvSet("later", "v2").ok());
  ASSERT_TRUE(called);
  EXPECT_EQ(*got, "v2");
  // ...and times out otherwise.
  called = false;
  c->KvGet("never", absl::Seconds(5), [&](absl::StatusOr<std::string> v) {
    called = true;
    got = v;
  });
  now_ += absl::Seconds(4);
  c->Tick();
  EXPECT_FALSE(called);
  now_ += absl::Seconds(2);
  c->Tick();
  ASSERT_TRUE(called);
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status()));

  absl::Status wait_status = absl::UnknownError("not called");
  c->KvWait({"a", "b"}, absl::Seconds(5), [&](absl::Status s) { wait_status = s; });
  ASSERT_TRUE(c->KvSet("a", "1").ok());
  EXPECT_TRUE(absl::IsUnknown(wait_status));
  ASSERT_TRUE(c->KvSet("b", "2").ok());
  EXPECT_TRUE(wait_status.ok()) << wait_status;
  c->KvWait({"a", "c"}, absl::Seconds(1), [&](absl::Status s) { wait_status = s; });
  now_ += absl::Seconds(2);
  c->Tick();
  EXPECT_TRUE(absl::IsDeadlineExceeded(wait_status));
  EXPECT_THAT(wait_status.message(), HasSubstr("c"));
}

TEST_F(CoordinatorTest, BarrierCompletes) {
  auto c = Open();
  std::vector<absl::Status> done(3, absl::UnknownError("pending"));
  for (int rank : {0, 2}) {
    c->Barrier(Arrive("init", 3, rank), [&, rank](absl::Status s) { done[rank] = s; });
  }
  EXPECT_TRUE(absl::IsUnknown(done[0]));
  c->Barrier(Arrive("init", 3, 1), [&](absl::Status s) { done[1] = s; });
  for (const absl::Status& s : done) EXPECT_TRUE(s.ok()) << s;
  // The name can be reused once complete; a mismatched count is refused.
  c->Barrier(Arrive("init", 2, 0), [&](absl::Status s) { done[0] = s; });
  c->Barrier(Arrive("init", 3, 1), [&](absl::Status s) { done[1] = s; });
  EXPECT_TRUE(absl::IsInvalidArgument(done[1]));
  c->Barrier(Arrive("bad", 2, 5), [&](absl::Status s) { done[2] = s; });
  EXPECT_TRUE(absl::IsInvalidArgument(done[2]));
  // At shutdown, pending arrivals are told.
  c->CancelWaits(absl::UnavailableError("stopping"));
  EXPECT_TRUE(absl::IsUnavailable(done[0])) << done[0];
}

TEST_F(CoordinatorTest, BarrierTimesOutNamingTheMissing) {
  auto c = Open();
  std::vector<absl::Status> done(2, absl::UnknownError("pending"));
  for (int rank : {0, 1}) {
    c->Barrier(Arrive("step-10", 4, rank), [&, rank](absl::Status s) { done[rank] = s; });
  }
  now_ += absl::Seconds(6);
  c->Tick();
  for (const absl::Status& s : done) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("2 of 4 arrived"));
    EXPECT_THAT(s.message(), HasSubstr("missing rank(s) 2, 3"));
  }
  // By member id: the registered workers that did not come are named.
  ASSERT_TRUE(c->Register(Worker(0)).ok());
  ASSERT_TRUE(c->Register(Worker(1)).ok());
  v1::BarrierRequest by_id;
  by_id.set_name("m");
  by_id.set_count(2);
  by_id.set_rank(-1);
  by_id.set_member_id("worker-0");
  by_id.set_timeout_ms(1000);
  absl::Status s;
  c->Barrier(by_id, [&](absl::Status st) { s = st; });
  now_ += absl::Seconds(2);
  c->Tick();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s));
  EXPECT_THAT(s.message(), HasSubstr("workers not arrived: worker-1"));
}

// A job config::ValidateJobConfig accepts.
v1::JobConfig ValidJob() {
  v1::JobConfig job;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(R"(
    name: "j"
    tables { name: "t0" dim: 8 num_rows: 1000 optimizer { kind: SGD learning_rate: 0.1 } }
    features { name: "f0" table: "t0" }
    model { bottom_mlp: 8 top_mlp: 1 }
    training { batch_size: 32 steps: 10 seed: 7 eval_batches: 1 eval_interval: 5
               dense_optimizer { kind: SGD learning_rate: 0.1 } }
    data { synthetic { seed: 1 num_dense: 4
                       features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 } } })",
                                                          &job));
  return job;
}

TEST_F(CoordinatorTest, RestartKeepsMembersMapEpochJobAndKv) {
  v1::JobConfig job = ValidJob();
  job.mutable_training()->set_batch_size(128);
  {
    auto c = Open();
    ASSERT_TRUE(c->SetJob(job).ok());
    ASSERT_TRUE(c->Register(Shard("127.0.0.1:7001")).ok());
    ASSERT_TRUE(c->Register(Shard("127.0.0.1:7002")).ok());
    ASSERT_TRUE(c->Register(Worker(0)).ok());
    ASSERT_TRUE(c->KvSet("gloo/rank0", "addr").ok());
    ASSERT_EQ(c->shard_map_epoch(), 1u);
  }
  now_ += absl::Hours(1);  // down longer than a lease
  auto c = Open();
  v1::ListMembersResponse list = c->ListMembers();
  ASSERT_EQ(list.members_size(), 3);
  EXPECT_EQ(list.members(0).member_id(), "shard-0");
  EXPECT_EQ(list.members(2).member_id(), "worker-0");
  c->Tick();  // fresh leases after a restart: nobody expires at once
  EXPECT_EQ(c->ListMembers().lease_expirations(), 0);
  auto map = c->GetShardMap();
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->epoch(), 1u);
  EXPECT_THAT(map->servers(), ElementsAre("127.0.0.1:7001", "127.0.0.1:7002"));
  EXPECT_EQ(c->GetJob()->training().batch_size(), 128);
  absl::StatusOr<std::string> got;
  c->KvGet("gloo/rank0", absl::ZeroDuration(), [&](absl::StatusOr<std::string> v) { got = v; });
  EXPECT_EQ(*got, "addr");
  // New members continue the numbering; the same job is accepted, another not.
  EXPECT_EQ(c->Register(Worker(1))->member_id(), "worker-1");
  EXPECT_TRUE(c->SetJob(job).ok());
  job.mutable_training()->set_batch_size(64);
  EXPECT_TRUE(absl::IsFailedPrecondition(c->SetJob(job)));
}

TEST_F(CoordinatorTest, StoreErrorsAreStatuses) {
  // A file where the directory should be.
  const std::string file = dir_.WriteFile("not-a-dir", "x");
  EXPECT_FALSE(CoordinatorStore::Open(file + "/state").ok());
  EXPECT_TRUE(absl::IsInvalidArgument(CoordinatorStore::Open("").status()));
  // A second open of a state dir in use is refused, not crashed on.
  auto first = CoordinatorStore::Open(dir_.path() + "/held");
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = CoordinatorStore::Open(dir_.path() + "/held");
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  // A record that does not parse is DATA_LOSS at load.
  ASSERT_TRUE((*first)->Put("member/x", "\xff\xff garbage").ok());
  ASSERT_TRUE((*first)->Put("kv/a", "1").ok());
  ASSERT_TRUE((*first)->Put("kv/b", "2").ok());
  auto scan = (*first)->Scan("kv/");
  ASSERT_TRUE(scan.ok());
  EXPECT_EQ(scan->size(), 2u);
  auto c = Coordinator::Create(*std::move(first), CoordinatorOptions(), nullptr);
  EXPECT_TRUE(absl::IsDataLoss(c.status())) << c.status();
}

}  // namespace
}  // namespace recps::server
