// An insider with a valid certificate of the cluster's CA, through real
// recps-shard and recps-coordinator processes: every claim a caller makes
// (its role at registration, its rank, the members it acts for, the server
// it dials, its cluster) is checked against its certificate, and one
// identity's quotas keep it from locking the job out. Issue 33;
// docs/security.md ("What an insider can and cannot do").
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc/channels.h"
#include "common/rpc/identity.h"
#include "common/security/certs.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/security/tls_fixture.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/metrics_scrape.h"
#include "tests/testing/resident_memory.h"

namespace recps {
namespace {

class InsiderProcessTest : public TlsProcessTest {
 protected:
  static void SetUpTestSuite() {
    TlsProcessTest::SetUpTestSuite();
    // Worker certificates bound to their ranks, and an admin of another
    // cluster signed by the same CA.
    for (const char* name : {"rank-0", "rank-1"}) {
      ASSERT_TRUE(security::IssueCert(Ca(), Ca(), "worker", name, security::CertOptions()).ok());
    }
    security::CertOptions other;
    other.cluster = "other";
    ASSERT_TRUE(security::IssueCert(Ca(), Ca(), "admin", "other-admin", other).ok());
    ASSERT_TRUE(security::IssueCert(Ca(), Ca(), "shard", "other-shard", other).ok());
  }

  // A coordinator with TLS and `extra` flags (a state dir of its own).
  std::unique_ptr<LocalShard> StartCoordinator(std::vector<std::string> extra) {
    static int n = 0;
    std::vector<std::string> args = {
        absl::StrCat("--state_dir=", dir_->path(), "/coord-", n++), "--num_slots=64",
        "--world_size=2", "--job=" + std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"};
    for (std::string& f : TlsFlags("coordinator")) args.push_back(std::move(f));
    args.insert(args.end(), extra.begin(), extra.end());
    auto c = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  static std::unique_ptr<v1::Coordinator::Stub> CoordinatorAs(const LocalShard& c,
                                                              const std::string& cert) {
    return v1::Coordinator::NewStub(Channel(c.address(), Tls(cert)));
  }

  static grpc::Status Register(v1::Coordinator::Stub* stub, v1::MemberRole role,
                               int rank, const std::string& address,
                               std::string* member_id = nullptr) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::RegisterRequest request;
    request.set_role(role);
    request.set_rank(rank);
    request.set_address(address);
    v1::RegisterResponse response;
    grpc::Status s = stub->Register(&context, request, &response);
    if (member_id != nullptr) *member_id = response.member_id();
    return s;
  }

  static grpc::Status Barrier(v1::Coordinator::Stub* stub, const std::string& name,
                              int count, int rank, int64_t timeout_ms = 30000,
                              absl::Duration deadline = absl::Seconds(10)) {
    grpc::ClientContext context;
    rpc::SetTimeout(deadline, &context);
    v1::BarrierRequest request;
    request.set_name(name);
    request.set_count(count);
    request.set_rank(rank);
    request.set_timeout_ms(timeout_ms);
    v1::BarrierResponse response;
    return stub->Barrier(&context, request, &response);
  }

  static grpc::Status KvSet(v1::Coordinator::Stub* stub, const std::string& key) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::KvSetRequest request;
    request.set_key(key);
    request.set_value("v");
    v1::KvSetResponse response;
    return stub->KvSet(&context, request, &response);
  }

  static grpc::Status Push(const std::shared_ptr<grpc::Channel>& channel, int rank) {
    auto stub = v1::EmbeddingShard::NewStub(channel);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::PushGradientsRequest request;
    request.mutable_header()->set_shard_map_epoch(1);
    request.mutable_header()->set_worker_rank(rank);
    v1::PushGradientsResponse response;
    return stub->PushGradients(&context, request, &response);
  }
};

// Item 1: a worker's certificate cannot register as a shard server (and so
// be given slots and everyone's rows), nor make a real member leave.
TEST_F(InsiderProcessTest, AWorkerCertificateCannotBecomeAShardServerOrMakeOneLeave) {
  auto coordinator = StartCoordinator({"--num_shards=1"});
  ASSERT_NE(coordinator, nullptr);
  auto worker = CoordinatorAs(*coordinator, "worker-a");
  const grpc::Status fake = Register(worker.get(), v1::SHARD_SERVER, -1, "127.0.0.1:9");
  EXPECT_EQ(fake.error_code(), grpc::StatusCode::PERMISSION_DENIED) << fake.error_message();
  EXPECT_TRUE(absl::StrContains(fake.error_message(), "register as SHARD_SERVER"))
      << fake.error_message();

  std::string shard_member;
  auto shard = CoordinatorAs(*coordinator, "shard");
  ASSERT_TRUE(Register(shard.get(), v1::SHARD_SERVER, -1, "127.0.0.1:10", &shard_member).ok());
  grpc::ClientContext context;
  rpc::SetTimeout(absl::Seconds(10), &context);
  v1::LeaveRequest leave;
  leave.set_member_id(shard_member);
  v1::LeaveResponse left;
  const grpc::Status s = worker->Leave(&context, leave, &left);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  // The map was built over the real server only.
  grpc::ClientContext map_context;
  rpc::SetTimeout(absl::Seconds(10), &map_context);
  v1::GetCoordinatorShardMapResponse map;
  ASSERT_TRUE(shard->GetShardMap(&map_context, v1::GetCoordinatorShardMapRequest(), &map).ok());
  ASSERT_EQ(map.shard_map().servers_size(), 1);
  EXPECT_EQ(map.shard_map().servers(0), "127.0.0.1:10");
}

// Replication: only a shard server may forward a push to a backup, so a
// worker's certificate cannot write rows past a primary's checks by posing
// as one (docs/replication.md).
TEST_F(InsiderProcessTest, AWorkerCertificateCannotForwardAPushToABackup) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  auto as = [&](const char* cert) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::ReplicatePushRequest request;
    request.set_primary("127.0.0.1:9");
    v1::PushGradientsResponse response;
    return v1::EmbeddingShard::NewStub(Channel(shard->address(), Tls(cert)))
        ->ReplicatePush(&context, request, &response);
  };
  const grpc::Status worker = as("worker-a");
  EXPECT_EQ(worker.error_code(), grpc::StatusCode::PERMISSION_DENIED) << worker.error_message();
  // A shard server's certificate passes the role check; the map then
  // refuses a primary it does not list.
  const grpc::Status peer = as("shard");
  EXPECT_EQ(peer.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << peer.error_message();
}

// Item 1, the client's side: a server presenting a worker's certificate
// (same CA, right host) is refused at the handshake.
TEST_F(InsiderProcessTest, ClientsRefuseAServerWithoutAServerRole) {
  auto fake = StartShard({}, "worker-a");
  ASSERT_NE(fake, nullptr);
  const grpc::Status s = Stats(Channel(fake->address(), Tls("admin")));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  auto real = StartShard({});
  ASSERT_NE(real, nullptr);
  EXPECT_TRUE(Stats(Channel(real->address(), Tls("admin"))).ok());
}

// Item 5: the cluster part of a certificate is checked both ways.
TEST_F(InsiderProcessTest, AnotherClustersCertificatesAreRefused) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  // Plain gRPC TLS credentials: they do not check the server's cluster, so
  // the call reaches the server's own check.
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ::recps::testing::ReadAll(Ca() + "/ca.crt");
  ssl.pem_private_key = ::recps::testing::ReadAll(Ca() + "/other-admin.key");
  ssl.pem_cert_chain = ::recps::testing::ReadAll(Ca() + "/other-admin.crt");
  const grpc::Status s =
      Stats(grpc::CreateChannel(shard->address(), grpc::SslCredentials(ssl)));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "cluster 'other'")) << s.error_message();
  auto other = StartShard({}, "other-shard");
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(Stats(Channel(other->address(), Tls("admin"))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// Item 2: a worker certificate bound to rank 0 cannot look up, push, wait
// at a barrier, cut a checkpoint or register as rank 1.
TEST_F(InsiderProcessTest, ARankBoundCertificateActsForItsOwnRankOnly) {
  auto shard = StartShard({"--world_size=2"});
  ASSERT_NE(shard, nullptr);
  auto rank0 = Channel(shard->address(), Tls("rank-0"));
  const grpc::Status forged = Push(rank0, 1);
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::PERMISSION_DENIED) << forged.error_message();
  EXPECT_TRUE(absl::StrContains(forged.error_message(), "may act for rank 0 only, not rank 1"))
      << forged.error_message();
  v1::LookupRequest lookup = LookupOf("fixed", 0);
  lookup.mutable_header()->set_worker_rank(1);
  EXPECT_EQ(Lookup(rank0, lookup).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Its own rank is served, and the real rank 1 still pushes.
  EXPECT_TRUE(Push(rank0, 0).ok());
  EXPECT_TRUE(Push(Channel(shard->address(), Tls("rank-1")), 1).ok());

  auto coordinator = StartCoordinator({});
  ASSERT_NE(coordinator, nullptr);
  auto c0 = CoordinatorAs(*coordinator, "rank-0");
  EXPECT_EQ(Register(c0.get(), v1::WORKER, 1, "").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Barrier(c0.get(), "b", 2, 1).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  grpc::ClientContext context;
  rpc::SetTimeout(absl::Seconds(10), &context);
  v1::CheckpointCutRequest cut;
  cut.set_rank(1);
  v1::CheckpointCutResponse response;
  EXPECT_EQ(c0->CheckpointCut(&context, cut, &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// Item 2 for certificates that name no rank (shared by a Job's pods): the
// coordinator binds a rank to the identity that registered it while it
// lives.
TEST_F(InsiderProcessTest, TheCoordinatorBindsARankToTheIdentityThatRegisteredIt) {
  auto coordinator = StartCoordinator({});
  ASSERT_NE(coordinator, nullptr);
  auto a = CoordinatorAs(*coordinator, "worker-a");
  auto b = CoordinatorAs(*coordinator, "worker-b");
  std::string member;
  ASSERT_TRUE(Register(a.get(), v1::WORKER, 1, "", &member).ok());
  const grpc::Status taken = Register(b.get(), v1::WORKER, 1, "");
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::PERMISSION_DENIED) << taken.error_message();
  EXPECT_TRUE(absl::StrContains(taken.error_message(), "is alive under")) << taken.error_message();
  EXPECT_EQ(Barrier(b.get(), "b", 2, 1).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // Its own registration again (a restart) is fine.
  EXPECT_TRUE(Register(a.get(), v1::WORKER, 1, "").ok());
  grpc::ClientContext context;
  rpc::SetTimeout(absl::Seconds(10), &context);
  v1::HeartbeatRequest beat;
  beat.set_member_id(member);
  v1::HeartbeatResponse response;
  EXPECT_EQ(b->Heartbeat(&context, beat, &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// Item 3: barrier waits whose caller cancelled are released at once, one
// client's waits are bounded, and a huge timeout is cut to --max_wait.
TEST_F(InsiderProcessTest, CancelledBarriersAreReleasedAndWaitsAreBounded) {
  auto coordinator = StartCoordinator({"--max_waits_per_client=4", "--max_wait=6s"});
  ASSERT_NE(coordinator, nullptr);
  auto a = CoordinatorAs(*coordinator, "worker-a");
  // Four barriers that never complete, each cancelled by its caller after
  // 300 ms (the client's deadline).
  for (int i = 0; i < 4; ++i) {
    const grpc::Status s = Barrier(a.get(), absl::StrCat("never-", i), 2, 0, 30000,
                                   absl::Milliseconds(300));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  }
  // Released once the server sees the cancels (their own timeout is 30 s).
  // The client's DEADLINE_EXCEEDED comes first: under load the server may
  // learn of a cancel later, and until then the waits hold their slots.
  auto pending_waits = [&] {
    return ::recps::testing::MetricValue(
        ::recps::testing::ScrapeMetrics(coordinator->metrics_port()),
        "recps_coordinator_barrier_pending_waits");
  };
  ASSERT_TRUE(::recps::testing::Eventually([&] { return pending_waits() == 0; },
                                           absl::Seconds(10)));
  // Their slots are free: four more park at once (the fifth is refused).
  struct Parked {
    grpc::ClientContext context;
    v1::BarrierRequest request;
    v1::BarrierResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Parked>> parked;
  for (int i = 0; i < 4; ++i) {
    auto p = std::make_unique<Parked>();
    rpc::SetTimeout(absl::Seconds(20), &p->context);
    p->request.set_name(absl::StrCat("parked-", i));
    p->request.set_count(2);
    p->request.set_rank(0);
    p->request.set_timeout_ms(int64_t{1} << 62);  // cut to --max_wait=6s
    Parked* raw = p.get();
    a->async()->Barrier(&raw->context, &raw->request, &raw->response, [raw](grpc::Status s) {
      raw->status = std::move(s);
      raw->done.Notify();
    });
    parked.push_back(std::move(p));
  }
  // The four are parked (the coordinator's gauge, updated every tick).
  ASSERT_TRUE(::recps::testing::Eventually([&] { return pending_waits() == 4; },
                                           absl::Seconds(10)));
  // A short barrier timeout: were it admitted, it would not park for long.
  const grpc::Status fifth = Barrier(a.get(), "fifth", 2, 0, 200);
  EXPECT_EQ(fifth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << fifth.error_message();
  EXPECT_TRUE(absl::StrContains(fifth.error_message(), "--max_waits_per_client"));
  // Another worker is not affected.
  auto b = CoordinatorAs(*coordinator, "worker-b");
  EXPECT_TRUE(Barrier(b.get(), "alone", 1, 0).ok());
  // 2^62 ms was cut to 6 s: the parked ones time out now, not in 10^8 years.
  for (auto& p : parked) {
    ASSERT_TRUE(p->done.WaitForNotificationWithTimeout(absl::Seconds(15)));
    EXPECT_EQ(p->status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << p->status.error_message();
  }
}

// Item 3: one client's KV keys and registrations are bounded; the KV
// entries of a run go when every worker left.
TEST_F(InsiderProcessTest, KvKeysAndRegistrationsPerClientAreBoundedAndKeysEndWithTheRun) {
  auto coordinator =
      StartCoordinator({"--max_kv_keys_per_client=3", "--max_members_per_client=2"});
  ASSERT_NE(coordinator, nullptr);
  auto a = CoordinatorAs(*coordinator, "worker-a");
  auto b = CoordinatorAs(*coordinator, "worker-b");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(KvSet(a.get(), absl::StrCat("k", i)).ok());
  const grpc::Status fourth = KvSet(a.get(), "k3");
  EXPECT_EQ(fourth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << fourth.error_message();
  EXPECT_TRUE(absl::StrContains(fourth.error_message(), "--max_kv_keys_per_client"));
  EXPECT_TRUE(KvSet(b.get(), "b0").ok());

  std::string m0, m1;
  ASSERT_TRUE(Register(a.get(), v1::WORKER, -1, "", &m0).ok());
  ASSERT_TRUE(Register(a.get(), v1::WORKER, -1, "", &m1).ok());
  const grpc::Status third = Register(a.get(), v1::WORKER, -1, "");
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_TRUE(absl::StrContains(third.error_message(), "--max_members_per_client"));

  for (const std::string& id : {m0, m1}) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::LeaveRequest leave;
    leave.set_member_id(id);
    v1::LeaveResponse left;
    ASSERT_TRUE(a->Leave(&context, leave, &left).ok());
  }
  grpc::ClientContext context;
  rpc::SetTimeout(absl::Seconds(10), &context);
  v1::KvGetRequest get;
  get.set_key("k0");
  v1::KvGetResponse value;
  EXPECT_EQ(a->KvGet(&context, get, &value).error_code(), grpc::StatusCode::NOT_FOUND);
  // The run is over, so a's quota is free again.
  EXPECT_TRUE(KvSet(a.get(), "k3").ok());
}

// Item 5: a push that does not parse is a bad request of its client (it
// was UNIMPLEMENTED and uncounted).
TEST_F(InsiderProcessTest, AnUnparsablePushIsABadRequest) {
  auto shard = StartShard({"--max_bad_requests_per_client=2", "--bad_request_penalty=60s"});
  ASSERT_NE(shard, nullptr);
  grpc::GenericStub stub(Channel(shard->address(), Tls("worker-a")));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    grpc::Slice garbage(std::string("\xff\xff\xff\xff\x0f", 5));
    grpc::ByteBuffer request(&garbage, 1), response;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, "/recps.v1.EmbeddingShard/PushGradients", grpc::StubOptions(),
                   &request, &response, [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << i << ": " << status.error_message();
  }
  EXPECT_EQ(Push(Channel(shard->address(), Tls("worker-a")), 0).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

// Item 5: a shard map epoch far past the current one (2^64-1) is refused,
// so later maps still install.
TEST_F(InsiderProcessTest, AnEpochFarAheadIsRefused) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  auto stub = v1::ShardAdmin::NewStub(Channel(shard->address(), Tls("coordinator")));
  v1::ShardMap current;
  {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    ASSERT_TRUE(stub->GetShardMap(&context, v1::GetShardMapRequest(), &current).ok());
  }
  auto set = [&](uint64_t epoch) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::SetShardMapRequest request;
    *request.mutable_shard_map() = current;
    request.mutable_shard_map()->set_epoch(epoch);
    v1::SetShardMapResponse response;
    return stub->SetShardMap(&context, request, &response);
  };
  const grpc::Status far = set(std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(far.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << far.error_message();
  EXPECT_TRUE(absl::StrContains(far.error_message(), "epochs grow by one")) << far.error_message();
  const grpc::Status next = set(current.epoch() + 1);
  EXPECT_TRUE(next.ok()) << next.error_message();
}

// Item 5: ExportRows reads rows only for a move the coordinator granted
// (AllowExport), and only that move's units.
TEST_F(InsiderProcessTest, ExportRowsNeedsAMoveTheCoordinatorGranted) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  auto export_rows = [&](const std::string& move_id, uint32_t slot) {
    auto stub = v1::ShardAdmin::NewStub(Channel(shard->address(), Tls("shard")));
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::ExportRowsRequest request;
    request.set_move_id(move_id);
    request.add_slots(slot);
    auto reader = stub->ExportRows(&context, request);
    v1::ExportRowsChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  };
  const grpc::Status made_up = export_rows("made-up", 3);
  EXPECT_EQ(made_up.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << made_up.error_message();
  EXPECT_TRUE(absl::StrContains(made_up.error_message(), "no move 'made-up'"))
      << made_up.error_message();
  {
    auto stub = v1::ShardAdmin::NewStub(Channel(shard->address(), Tls("coordinator")));
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(10), &context);
    v1::AllowExportRequest grant;
    grant.set_move_id("m1");
    grant.add_slots(3);
    grant.set_ttl_ms(60000);
    v1::AllowExportResponse response;
    ASSERT_TRUE(stub->AllowExport(&context, grant, &response).ok());
  }
  const grpc::Status granted = export_rows("m1", 3);
  EXPECT_TRUE(granted.ok()) << granted.error_message();
  EXPECT_EQ(export_rows("m1", 4).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// Item 4: the role is checked when a call's headers arrive, before its
// message is read: a reader's 4 x 200 MiB to methods it may not call are
// refused without the servers buffering them.
TEST_F(InsiderProcessTest, ARefusedCallsMessageIsNeverBuffered) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  auto coordinator = StartCoordinator({});
  ASSERT_NE(coordinator, nullptr);
  const std::string big(200 << 20, 'x');
  struct Target {
    LocalShard* server;
    const char* path;
  };
  for (const Target& t : {Target{shard.get(), "/recps.v1.EmbeddingShard/PushGradients"},
                          Target{coordinator.get(), "/recps.v1.Coordinator/KvSet"}}) {
    const int64_t before = testing::ResidentBytes(t.server->pid());
    ASSERT_GT(before, 0);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    grpc::GenericStub stub(grpc::CreateCustomChannel(
        t.server->address(), rpc::ChannelCredentials(Tls("reader")), args));
    struct Call {
      grpc::ClientContext context;
      grpc::ByteBuffer request, response;
      grpc::Status status;
      absl::Notification done;
    };
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < 4; ++i) {
      auto c = std::make_unique<Call>();
      rpc::SetTimeout(absl::Seconds(60), &c->context);
      grpc::Slice slice(big);
      c->request = grpc::ByteBuffer(&slice, 1);
      Call* raw = c.get();
      stub.UnaryCall(&raw->context, t.path, grpc::StubOptions(), &raw->request,
                     &raw->response, [raw](grpc::Status s) {
                       raw->status = std::move(s);
                       raw->done.Notify();
                     });
      calls.push_back(std::move(c));
    }
    for (auto& c : calls) {
      c->done.WaitForNotification();
      EXPECT_EQ(c->status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << t.path << ": " << c->status.error_message();
    }
    const int64_t after = testing::ResidentBytes(t.server->pid());
    // The flow-control windows, not 800 MiB.
    EXPECT_LT(after - before, int64_t{64} << 20) << t.path << ": " << before << " -> " << after;
  }
}

}  // namespace
}  // namespace recps
