// Mutual TLS, roles and per-client limits through real recps-shard and
// recps-coordinator processes, with certificates made by
// common/security/certs.h (the openssl command). docs/security.md.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc/call_gate.h"
#include "common/rpc/channels.h"
#include "common/rpc/identity.h"
#include "common/security/certs.h"
#include "google/protobuf/descriptor.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/auth_context.h"
#include "gtest/gtest.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/security/tls_fixture.h"
#include "tests/testing/local_shard.h"
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {


TEST_F(TlsProcessTest, DaemonsRefuseToStartWithoutTlsOrInsecure) {
  for (const char* binary :
       {RECPS_SHARD_BINARY, RECPS_COORDINATOR_BINARY, RECPS_WORKER_BINARY}) {
    const std::string log = dir_->path() + "/noflags.log";
    const std::string command = absl::StrCat(binary, " > ", log, " 2>&1");
    EXPECT_EQ(Shell(command), 2) << binary;
    const std::string text = ::recps::testing::ReadAll(log);
    EXPECT_TRUE(absl::StrContains(text, "--tls_ca") &&
                absl::StrContains(text, "--insecure"))
        << binary << ": " << text;
  }
}

TEST_F(TlsProcessTest, PlaintextOtherCaExpiredAndWrongHostAreRefused) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  // Our own reader certificate works.
  ASSERT_TRUE(Stats(Channel(shard->address(), Tls("reader"))).ok());

  const grpc::Status plaintext =
      Stats(Channel(shard->address(), rpc::TransportSecurity::Insecure()));
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE)
      << plaintext.error_message();

  // A client certificate of another CA (the client trusts ours).
  const grpc::Status other_ca =
      Stats(Channel(shard->address(), Tls("admin", dir_->path() + "/other")));
  EXPECT_EQ(other_ca.error_code(), grpc::StatusCode::UNAVAILABLE)
      << other_ca.error_message();

  const grpc::Status expired =
      Stats(Channel(shard->address(), Tls("admin", dir_->path() + "/expired")));
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAVAILABLE)
      << expired.error_message();

  // A server whose certificate names another host.
  auto wrong = StartShard({}, "wronghost");
  ASSERT_NE(wrong, nullptr);
  // The connection is made (its certificate names a server role of our
  // CA), but gRPC checks the dialled host against it before each call is
  // sent: refused UNAUTHENTICATED.
  const grpc::Status wrong_host =
      Stats(Channel(wrong->address(), Tls("reader")));
  EXPECT_EQ(wrong_host.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << wrong_host.error_message();
  // The shard that refused them still serves.
  EXPECT_TRUE(Stats(Channel(shard->address(), Tls("reader"))).ok());
}

TEST_F(TlsProcessTest, RolesAreCheckedAndRefusalsCounted) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  auto worker = Channel(shard->address(), Tls("worker"));
  auto reader = Channel(shard->address(), Tls("reader"));
  auto admin = Channel(shard->address(), Tls("admin"));

  // A worker may not change the shard map.
  {
    auto stub = v1::ShardAdmin::NewStub(worker);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::SetShardMapResponse response;
    const grpc::Status s =
        stub->SetShardMap(&context, v1::SetShardMapRequest(), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_message(),
              "role 'worker' may not call ShardAdmin.SetShardMap (needs admin "
              "or coordinator)");
  }
  // reader: stats yes, push no.
  EXPECT_TRUE(Stats(reader).ok());
  {
    auto stub = v1::EmbeddingShard::NewStub(reader);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::PushGradientsRequest request;
    request.mutable_header()->set_shard_map_epoch(1);
    v1::PushGradientsResponse response;
    const grpc::Status s = stub->PushGradients(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_message(),
              "role 'reader' may not call EmbeddingShard.PushGradients (needs "
              "admin or worker)");
  }
  // admin: both.
  EXPECT_TRUE(Stats(admin).ok());
  {
    auto stub = v1::EmbeddingShard::NewStub(admin);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::PushGradientsRequest request;
    request.mutable_header()->set_shard_map_epoch(1);
    v1::PushGradientsResponse response;
    const grpc::Status s = stub->PushGradients(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Lookups of a dynamic table create rows: worker only, even for admin.
  EXPECT_TRUE(Lookup(worker, LookupOf("dyn", 0)).ok());
  EXPECT_TRUE(Lookup(admin, LookupOf("fixed", 0)).ok());
  const grpc::Status dynamic = Lookup(admin, LookupOf("dyn", 0));
  EXPECT_EQ(dynamic.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(dynamic.error_message(), "dynamic table"))
      << dynamic.error_message();
  EXPECT_TRUE(absl::StrContains(dynamic.error_message(), "needs worker"))
      << dynamic.error_message();

  const std::string metrics = testing::ScrapeMetrics(shard->metrics_port());
  EXPECT_EQ(testing::MetricValue(metrics,
                                 "recps_rpc_denied_total{role=\"worker\",rpc="
                                 "\"ShardAdmin.SetShardMap\"}"),
            1)
      << metrics;
  EXPECT_EQ(testing::MetricValue(metrics,
                                 "recps_rpc_denied_total{role=\"reader\",rpc="
                                 "\"EmbeddingShard.PushGradients\"}"),
            1);
  EXPECT_EQ(testing::MetricValue(metrics,
                                 "recps_rpc_denied_total{role=\"admin\",rpc="
                                 "\"EmbeddingShard.Lookup\"}"),
            1);
}

// `name` in the file that defines `message` (naming a message links its
// generated code, which registers the file).
const google::protobuf::ServiceDescriptor* Service(
    const google::protobuf::Descriptor* message, const std::string& name) {
  const google::protobuf::ServiceDescriptor* s =
      message->file()->FindServiceByName(name);
  EXPECT_NE(s, nullptr) << name;
  return s;
}

// One call of the streaming method `name` (an empty request) with
// `cert`'s certificate: its status. A new streaming method needs a case
// here (the generic stub's unary call cannot make one).
grpc::Status CallStreamingWith(const std::shared_ptr<grpc::Channel>& channel,
                               const std::string& name) {
  grpc::ClientContext context;
  rpc::SetTimeout(absl::Seconds(5), &context);
  if (name == "ShardAdmin.ExportRows") {
    auto stub = v1::ShardAdmin::NewStub(channel);
    v1::ExportRowsChunk chunk;
    auto reader = stub->ExportRows(&context, v1::ExportRowsRequest());
    while (reader->Read(&chunk)) {
    }
    return reader->Finish();
  }
  if (name == "Coordinator.WatchShardMap") {
    auto stub = v1::Coordinator::NewStub(channel);
    v1::ShardMap map;
    auto reader = stub->WatchShardMap(&context, v1::WatchShardMapRequest());
    while (reader->Read(&map)) {
    }
    return reader->Finish();
  }
  ADD_FAILURE() << "no call of the streaming method " << name
                << " in CallStreamingWith: add one";
  return grpc::Status(grpc::StatusCode::UNKNOWN, "not called");
}

// Every method of every service the shard and coordinator serve: a reader
// is refused each one its role does not allow (or the method has no
// handler yet). A handler that forgets the gate fails here.
TEST_F(TlsProcessTest, EveryMethodChecksTheRole) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  std::vector<std::string> coordinator_args = {
      "--state_dir=" + dir_->path() + "/every-method-state", "--num_slots=64",
      "--job=" + std::string(RECPS_SOURCE_DIR) + "/examples/small.textproto"};
  for (std::string& f : TlsFlags("coordinator"))
    coordinator_args.push_back(std::move(f));
  auto coordinator =
      LocalShard::Start(RECPS_COORDINATOR_BINARY, coordinator_args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();

  struct Target {
    const google::protobuf::ServiceDescriptor* service;
    std::string address;
  };
  const Target targets[] = {
      {Service(v1::LookupRequest::descriptor(), "EmbeddingShard"),
       shard->address()},
      {Service(v1::StatsRequest::descriptor(), "ShardAdmin"), shard->address()},
      {Service(v1::RegisterRequest::descriptor(), "Coordinator"),
       (*coordinator)->address()},
  };
  for (const rpc::Role role : {rpc::Role::kReader, rpc::Role::kShard}) {
    const std::string cert = rpc::RoleName(role);
    for (const Target& t : targets) {
      ASSERT_NE(t.service, nullptr);
      grpc::GenericStub stub(Channel(t.address, Tls(cert)));
      for (int m = 0; m < t.service->method_count(); ++m) {
        const google::protobuf::MethodDescriptor* method = t.service->method(m);
        const std::string name =
            absl::StrCat(t.service->name(), ".", method->name());
        if (rpc::AllowedRoles(name) & rpc::RoleBit(role)) continue;
        if (method->server_streaming() || method->client_streaming()) {
          const grpc::Status status =
              CallStreamingWith(Channel(t.address, Tls(cert)), name);
          EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
              << cert << " called " << name << ": " << status.error_message();
          continue;
        }
        grpc::ClientContext context;
        rpc::SetTimeout(absl::Seconds(5), &context);
        grpc::Slice empty("");
        grpc::ByteBuffer request(&empty, 1), response;  // an empty message
        grpc::Status status;
        absl::Notification done;
        stub.UnaryCall(
            &context,
            absl::StrCat("/", t.service->full_name(), "/", method->name()),
            grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
              status = std::move(s);
              done.Notify();
            });
        done.WaitForNotification();
        EXPECT_TRUE(status.error_code() ==
                        grpc::StatusCode::PERMISSION_DENIED ||
                    status.error_code() == grpc::StatusCode::UNIMPLEMENTED)
            << cert << " called " << name << ": " << status.error_code() << " "
            << status.error_message();
        if (status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
          EXPECT_TRUE(absl::StrContains(
              status.error_message(),
              absl::StrCat("role '", cert, "' may not call ", name)))
              << status.error_message();
        }
      }
    }
  }
}

// The per-client concurrency limit: a third lookup of one worker while two
// wait for their step is refused; another worker is still served.
TEST_F(TlsProcessTest, ConcurrentCallsPerClientAreBounded) {
  auto shard = StartShard({"--max_calls_per_client=2", "--step_timeout=60s"});
  ASSERT_NE(shard, nullptr);
  auto a = Channel(shard->address(), Tls("worker-a"));
  auto stub = v1::EmbeddingShard::NewStub(a);
  // Step 5 waits for step 4 to be applied: these two park.
  struct Parked {
    grpc::ClientContext context;
    v1::LookupResponse response;
    grpc::Status status;
    absl::Notification done;
  };
  std::vector<std::unique_ptr<Parked>> parked;
  const v1::LookupRequest later = LookupOf("fixed", 5);
  for (int i = 0; i < 2; ++i) {
    auto p = std::make_unique<Parked>();
    rpc::SetTimeout(absl::Seconds(30), &p->context);
    Parked* raw = p.get();
    stub->async()->Lookup(&raw->context, &later, &raw->response,
                          [raw](grpc::Status s) {
                            raw->status = std::move(s);
                            raw->done.Notify();
                          });
    parked.push_back(std::move(p));
  }
  auto reader = Channel(shard->address(), Tls("reader"));
  ASSERT_TRUE(Eventually([&] {
    v1::StatsResponse stats;
    return Stats(reader, &stats).ok() && stats.parked_lookups() == 2;
  }));
  const grpc::Status third = Lookup(a, LookupOf("fixed", 0));
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(
      absl::StrContains(third.error_message(), "--max_calls_per_client"))
      << third.error_message();
  EXPECT_TRUE(absl::StrContains(third.error_message(), "limit per client is 2"))
      << third.error_message();
  // Another client is served meanwhile.
  EXPECT_TRUE(
      Lookup(Channel(shard->address(), Tls("worker-b")), LookupOf("fixed", 0))
          .ok());
  const std::string metrics = testing::ScrapeMetrics(shard->metrics_port());
  EXPECT_EQ(
      testing::MetricValue(
          metrics, "recps_rpc_client_limited_total{reason=\"concurrency\""),
      1)
      << metrics;
  for (auto& p : parked) p->context.TryCancel();
  for (auto& p : parked) p->done.WaitForNotification();
  // Their slots are free again.
  EXPECT_TRUE(Eventually([&] { return Lookup(a, LookupOf("fixed", 0)).ok(); }));
}

// The coordinator bounds each client's calls in flight the same way: a
// waiting KvGet holds its caller's slot.
TEST_F(TlsProcessTest, CoordinatorBoundsCallsPerClient) {
  std::vector<std::string> args = {
      "--state_dir=" + dir_->path() + "/coord-limit", "--num_slots=64",
      "--max_calls_per_client=1"};
  for (std::string& f : TlsFlags("coordinator")) args.push_back(std::move(f));
  auto coordinator = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  auto a = v1::Coordinator::NewStub(Channel(address, Tls("worker-a")));
  grpc::ClientContext waiting;
  rpc::SetTimeout(absl::Seconds(30), &waiting);
  // Not failed by a first connection attempt that does not complete.
  waiting.set_wait_for_ready(true);
  v1::KvGetRequest wait;
  wait.set_key("never-set");
  wait.set_wait_ms(30000);
  v1::KvGetResponse wait_response;
  absl::Notification wait_done;
  grpc::Status wait_status;
  a->async()->KvGet(&waiting, &wait, &wait_response, [&](grpc::Status s) {
    wait_status = std::move(s);
    wait_done.Notify();
  });
  // The callback writes the locals above: no return (a failed ASSERT
  // included) before it ran.
  auto end_wait = absl::MakeCleanup([&] {
    waiting.TryCancel();
    wait_done.WaitForNotification();
  });
  auto kv_get = [&](v1::Coordinator::Stub* stub) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::KvGetRequest request;
    request.set_key("absent");
    v1::KvGetResponse response;
    return stub->KvGet(&context, request, &response);
  };
  // Once the coordinator holds the wait parked (its gauge says so), the
  // wait has worker-a's one slot and worker-a's next call is refused. A call
  // sent before that could take the slot first and get the wait refused (CI).
  ASSERT_TRUE(Eventually([&] {
    return wait_done.HasBeenNotified() ||
           testing::MetricValue(testing::ScrapeMetrics((*coordinator)->metrics_port()),
                                "recps_coordinator_kv_pending_waits") == 1;
  }));
  ASSERT_FALSE(wait_done.HasBeenNotified())
      << "the wait ended early: " << wait_status.error_code() << " "
      << wait_status.error_message();
  const grpc::Status second = kv_get(a.get());
  ASSERT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << second.error_message();
  EXPECT_TRUE(
      absl::StrContains(second.error_message(), "--max_calls_per_client"));
  // worker-b is served (NOT_FOUND: the key is absent).
  auto b = v1::Coordinator::NewStub(Channel(address, Tls("worker-b")));
  EXPECT_EQ(kv_get(b.get()).error_code(), grpc::StatusCode::NOT_FOUND);
}

// A client that keeps sending bad requests is refused for a while; others
// are not.
TEST_F(TlsProcessTest, BadRequestsGetAClientRefused) {
  auto shard = StartShard(
      {"--max_bad_requests_per_client=3", "--bad_request_penalty=60s"});
  ASSERT_NE(shard, nullptr);
  auto a = Channel(shard->address(), Tls("worker-a"));
  v1::LookupRequest bad = LookupOf("fixed", 0);
  bad.mutable_tables(0)->set_ids("123");  // not a multiple of 8 bytes
  for (int i = 0; i < 4; ++i) {
    const grpc::Status s = Lookup(a, bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << i << ": " << s.error_message();
  }
  const grpc::Status refused = Lookup(a, LookupOf("fixed", 0));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "is refused for"))
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "retry after"))
      << refused.error_message();
  EXPECT_TRUE(
      Lookup(Channel(shard->address(), Tls("worker-b")), LookupOf("fixed", 0))
          .ok());
  const std::string metrics = testing::ScrapeMetrics(shard->metrics_port());
  EXPECT_EQ(
      testing::MetricValue(
          metrics, "recps_rpc_client_limited_total{reason=\"bad_requests\""),
      1)
      << metrics;
}

// The peer's SAN URI on a client call's connection.
std::string ServerUri(const grpc::ClientContext& context) {
  for (const grpc::string_ref& v : context.auth_context()->FindPropertyValues(
           GRPC_PEER_URI_PROPERTY_NAME)) {
    return std::string(v.data(), v.size());
  }
  return "";
}

// New certificate files are picked up without a restart: new connections
// see the new certificate, a connection made before keeps working.
TEST_F(TlsProcessTest, RotatedCertificatesArePickedUp) {
  const std::string live = dir_->path() + "/live";
  fs::create_directories(live);
  fs::copy_file(Ca() + "/shard.crt", live + "/shard.crt",
                fs::copy_options::overwrite_existing);
  fs::copy_file(Ca() + "/shard.key", live + "/shard.key",
                fs::copy_options::overwrite_existing);
  auto shard = StartShard({"--tls_reload_interval=1s",
                           "--tls_cert=" + live + "/shard.crt",
                           "--tls_key=" + live + "/shard.key"});
  ASSERT_NE(shard, nullptr);
  auto stats_uri = [&](const std::shared_ptr<grpc::Channel>& channel) {
    auto stub = v1::ShardAdmin::NewStub(channel);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::StatsResponse response;
    const grpc::Status s = stub->Stats(&context, v1::StatsRequest(), &response);
    return s.ok() ? ServerUri(context) : "error: " + s.error_message();
  };
  auto old_channel = Channel(shard->address(), Tls("reader"));
  ASSERT_EQ(stats_uri(old_channel), "spiffe://recps/local/shard/shard");

  // Issue shard-v2 elsewhere, then move it over the files the server reads.
  ASSERT_TRUE(security::IssueCert(Ca(), dir_->path() + "/v2", "shard",
                                  "shard-v2", security::CertOptions())
                  .ok());
  fs::rename(dir_->path() + "/v2/shard-v2.key", live + "/shard.key");
  fs::rename(dir_->path() + "/v2/shard-v2.crt", live + "/shard.crt");

  EXPECT_TRUE(Eventually(
      [&] {
        return stats_uri(Channel(shard->address(), Tls("reader"))) ==
               "spiffe://recps/local/shard/shard-v2";
      },
      absl::Seconds(20)));
  // The connection made before still works, with its handshake.
  EXPECT_EQ(stats_uri(old_channel), "spiffe://recps/local/shard/shard");
}

// recpsctl: admin may forget members, reader may read but not write.
TEST_F(TlsProcessTest, RecpsctlWithAdminAndReaderCertificates) {
  std::vector<std::string> args = {"--state_dir=" + dir_->path() + "/ctl-state",
                                   "--num_slots=64", "--num_shards=1"};
  for (std::string& f : TlsFlags("coordinator")) args.push_back(std::move(f));
  auto coordinator = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string out = dir_->path() + "/ctl.out";
  auto ctl = [&](const std::string& role, const std::string& command) {
    const std::string c = Ca();
    return Shell(absl::StrCat("RECPS_TLS_CA=", c, "/ca.crt RECPS_TLS_CERT=", c,
                              "/", role, ".crt RECPS_TLS_KEY=", c, "/", role,
                              ".key ", RECPSCTL_BINARY,
                              " --coordinator=", (*coordinator)->address(), " ",
                              command, " >", out, " 2>&1"));
  };
  // Reading: status exits 3 (no shard map yet), not 1 (could not ask).
  EXPECT_EQ(ctl("reader", "status --interval=0"), 3) << ::recps::testing::ReadAll(out);
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(out), "no shard map")) << ::recps::testing::ReadAll(out);
  // Writing.
  EXPECT_EQ(ctl("reader", "members forget shard-9"), 1);
  EXPECT_TRUE(absl::StrContains(
      ::recps::testing::ReadAll(out),
      "role 'reader' may not call Coordinator.ForgetMember (needs admin)"))
      << ::recps::testing::ReadAll(out);
  EXPECT_EQ(ctl("admin", "members forget shard-9"), 1);
  EXPECT_FALSE(absl::StrContains(::recps::testing::ReadAll(out), "may not call")) << ::recps::testing::ReadAll(out);
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(out), "shard-9")) << ::recps::testing::ReadAll(out);
  // Plaintext against the TLS coordinator: refused, with a hint.
  EXPECT_EQ(
      Shell(absl::StrCat(RECPSCTL_BINARY, " status --insecure --coordinator=",
                         (*coordinator)->address(), " >", out, " 2>&1")),
      1);
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(out), "docs/security.md#troubleshooting"))
      << ::recps::testing::ReadAll(out);
  // Neither TLS nor --insecure: a usage error naming both.
  EXPECT_EQ(Shell(absl::StrCat(RECPSCTL_BINARY, " status --coordinator=",
                               (*coordinator)->address(), " >", out, " 2>&1")),
            2);
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(out), "--tls_ca")) << ::recps::testing::ReadAll(out);
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(out), "--insecure")) << ::recps::testing::ReadAll(out);
}

// A server started on a port another server listens on fails, instead of
// sharing it through SO_REUSEPORT (gRPC's default), where the kernel would
// hand it some of the other's connections: clients would reach a server of
// another cluster (seen as TLS handshakes that time out).
TEST_F(TlsProcessTest, AServerDoesNotShareATakenPort) {
  std::vector<std::string> args = {"--state_dir=" + dir_->path() + "/port-a",
                                   "--num_slots=64"};
  for (std::string& f : TlsFlags("coordinator")) args.push_back(std::move(f));
  auto first = LocalShard::Start(RECPS_COORDINATOR_BINARY, args);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string tables = dir_->WriteFile("tables.textproto", kTables);
  const std::pair<const char*, std::string> second[] = {
      {RECPS_COORDINATOR_BINARY, "--state_dir=" + dir_->path() + "/port-b"},
      {RECPS_SHARD_BINARY, "--standalone --tables=" + tables}};
  for (const auto& [binary, flags] : second) {
    const std::string log = dir_->path() + "/port-b.log";
    // Before the fix it started and served: `timeout` ends it (exit 124).
    const int code = Shell(absl::StrCat(
        "timeout 20 ", binary, " --insecure --listen=", (*first)->address(),
        " --metrics_listen= ", flags, " >", log, " 2>&1"));
    EXPECT_EQ(code, 1) << binary << ": " << ::recps::testing::ReadAll(log);
    EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(log),
                                  "cannot listen on " + (*first)->address()))
        << binary << ": " << ::recps::testing::ReadAll(log);
  }
}

// `recps local` trains with mutual TLS by default, with certificates it
// makes in its work directory.
TEST_F(TlsProcessTest, RecpsLocalTrainsWithTls) {
  const std::string work = dir_->path() + "/local";
  const std::string log = dir_->path() + "/local.log";
  const int code = Shell(
      absl::StrCat("cd ", RECPS_SOURCE_DIR, " && ", RECPS_LAUNCHER_BINARY,
                   " local --steps=100 --work_dir=", work, " >", log, " 2>&1"));
  ASSERT_EQ(code, 0) << ::recps::testing::ReadAll(log);
  EXPECT_TRUE(fs::exists(work + "/certs/ca.crt"));
  EXPECT_TRUE(fs::exists(work + "/certs/rank-1.crt"));
  EXPECT_EQ(fs::status(work + "/certs/ca.key").permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_TRUE(
      absl::StrContains(::recps::testing::ReadAll(work + "/coordinator.log"), "mutual TLS"));
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(work + "/shard0.log"), "mutual TLS"));
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(log), "held-out AUC")) << ::recps::testing::ReadAll(log);
  // The workers and the shard server share the host: rows skip the socket.
  EXPECT_TRUE(absl::StrContains(::recps::testing::ReadAll(log),
                                "go through shared memory (same-host rows)"))
      << ::recps::testing::ReadAll(log);
  EXPECT_FALSE(absl::StrContains(::recps::testing::ReadAll(log), "go as bytes"));
  EXPECT_FALSE(absl::StrContains(::recps::testing::ReadAll(work + "/shard0.log"), "refused"));
}

// The embedded shard server of `recps local --in_process` registers with the
// coordinator as a shard server, with the shard certificate recps local
// gave it: with the worker's (the process's own), the coordinator refused
// it and the workers waited out their resume timeout.
TEST_F(TlsProcessTest, RecpsLocalInProcessTrainsWithTls) {
  for (const char* form : {"in_process", "one_process"}) {
    const std::string work = absl::StrCat(dir_->path(), "/local-", form);
    const std::string log = work + ".log";
    const int code = Shell(absl::StrCat(
        "cd ", RECPS_SOURCE_DIR, " && timeout 120 ", RECPS_LAUNCHER_BINARY, " local --in_process",
        std::string(form) == "one_process" ? " --one_process" : "",
        " --workers=2 --steps=30 --work_dir=", work, " >", log, " 2>&1"));
    const std::string text = ::recps::testing::ReadAll(log);
    EXPECT_EQ(code, 0) << form << ": " << text;
    EXPECT_FALSE(absl::StrContains(text, "may not register")) << form;
    EXPECT_TRUE(absl::StrContains(text, "held-out AUC")) << form << ": " << text;
  }
}

}  // namespace
}  // namespace recps
