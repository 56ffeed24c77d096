// Hardening of the shard server, through a real recps-shard process: bad
// requests and flags are refused naming the limit, the daemon stays up, its
// state and memory untouched; faults (a restarted server, no map yet) are
// reported, not hidden.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/channels.h"
#include "client/embedding_client.h"
#include "client/launcher/process.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/local_shard.h"
#include "tests/server/shard/shard_stats.h"
#include "tests/testing/metrics_scrape.h"


namespace recps {
namespace {

using client::EmbeddingClient;
using testing::In;
using testing::LocalShard;
using testing::StatsOf;
using testing::TempDir;

constexpr uint32_t kSlots = 256;

constexpr char kWideTables[] = R"(
tables {
  name: "wide"
  dim: 4096
  optimizer { kind: SGD learning_rate: 0.1 }
}
tables {
  name: "user"
  dim: 8
  optimizer { kind: SGD learning_rate: 0.1 }
}
)";

// One standalone server (every slot, epoch 1) serving kWideTables.
std::unique_ptr<LocalShard> StartStandalone(const TempDir& dir,
                                            std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--tables=" + dir.WriteFile("wide.textproto", kWideTables),
      "--standalone", "--max_rows_per_table=10000", "--threads=2",
      "--store_threads=1"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto shard = LocalShard::Start(RECPS_SHARD_BINARY, args);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return shard.ok() ? *std::move(shard) : nullptr;
}


std::string EncodedIds(int64_t first, int64_t n) {
  std::string bytes(n * sizeof(int64_t), '\0');
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = first + i;
    std::memcpy(bytes.data() + i * sizeof(int64_t), &id, sizeof(id));
  }
  return bytes;
}

TEST(ShardHardening, PushOfIdsWithoutGradientsIsRefusedBeforeAllocating) {
  TempDir dir;
  auto shard = StartStandalone(dir);
  ASSERT_NE(shard, nullptr);
  // 4M ids (32 MB) and no gradients on a dim-4096 table: sizing the
  // gradients from the ids would take 64 GiB.
  v1::PushGradientsRequest request;
  request.mutable_header()->set_shard_map_epoch(1);
  v1::TableGradients* t = request.add_tables();
  t->set_table("wide");
  t->set_ids(EncodedIds(0, int64_t{1} << 22));
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(shard->address(), rpc::ChannelKind::kData));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::PushGradientsResponse response;
  const grpc::Status s = stub->PushGradients(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("tables[0].grads (table wide)"),
            std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("got 0"), std::string::npos);
  // A lookup of those ids would answer 64 GiB of rows: refused before the
  // response or a row is made.
  v1::LookupRequest lookup;
  *lookup.mutable_header() = request.header();
  v1::TableIds* ids = lookup.add_tables();
  ids->set_table("wide");
  ids->set_ids(t->ids());
  grpc::ClientContext lookup_ctx;
  lookup_ctx.set_deadline(In(absl::Seconds(30)));
  v1::LookupResponse rows;
  const grpc::Status l = stub->Lookup(&lookup_ctx, lookup, &rows);
  EXPECT_EQ(l.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << l.error_message();
  // Still up, no rows, and its memory did not grow by the 64 GiB.
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->total_rows(), 0);
  EXPECT_LT(stats->resident_bytes(), int64_t{1} << 30);
}

// Runs recps-shard with `args` to its exit (at most 30 s); its output goes
// to `log`. Returns the exit code, -1 when it did not exit in time.
int RunShardToExit(const TempDir& dir, const std::vector<std::string>& args,
                   std::string* log) {
  const std::string log_path = dir.path() + "/exit.log";
  std::remove(log_path.c_str());
  std::vector<std::string> with_security = args;
  with_security.push_back("--insecure");
  absl::StatusOr<pid_t> pid =
      client::SpawnProcess(RECPS_SHARD_BINARY, with_security, log_path);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return -1;
  int status = 0;
  const bool exited = testing::Eventually(
      [&] { return waitpid(*pid, &status, WNOHANG) == *pid; }, absl::Seconds(30));
  if (!exited) {
    kill(*pid, SIGKILL);
    waitpid(*pid, nullptr, 0);
    return -1;
  }
  std::ifstream in(log_path);
  log->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(ShardHardening, NumericFlagsOutOfRangeExitTwoNamingTheFlag) {
  TempDir dir;
  const std::string tables = "--tables=" + dir.WriteFile("t.textproto", kWideTables);
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"--max_message_mb=4096", "[1, 2047]"},
      {"--max_message_mb=0", "[1, 2047]"},
      {"--world_size=0", "[1, 65536]"},
      {"--staleness=-5", "[-1, "},
      {"--step_timeout=0s", "--step_timeout=0"},
      {"--num_slots=0", "--num_slots=0"},
      {"--prefault_fixed_tables=1.5", "[-1, 1]"},
      {"--max_rows_per_table=-1", "--max_rows_per_table=-1"},
      {"--max_ids_per_request=0", "--max_ids_per_request=0"},
      {"--threads=-3", "--threads=-3"},
      {"--store_threads=100000", "--store_threads=100000"},
      {"--grace_period=-1s", "--grace_period=-1s"},
  };
  for (const auto& [flag, says] : bad) {
    std::string log;
    EXPECT_EQ(RunShardToExit(dir, {tables, "--standalone", flag}, &log), 2)
        << flag << ": " << log;
    EXPECT_NE(log.find(says), std::string::npos) << flag << ": " << log;
    EXPECT_NE(log.find("out of range"), std::string::npos) << flag << ": " << log;
  }
  // The largest message size allowed starts and serves.
  auto shard = StartStandalone(dir, {"--max_message_mb=2047"});
  ASSERT_NE(shard, nullptr);
  EXPECT_TRUE(StatsOf(shard->address()).ok());
}

// A lookup sent asynchronously; its context and response live here until
// the reply (or the cancellation) comes back.
struct PendingLookup {
  grpc::ClientContext ctx;
  v1::LookupRequest request;
  v1::LookupResponse response;
  grpc::Status status;
  absl::Notification done;
};

std::unique_ptr<PendingLookup> SendLookup(v1::EmbeddingShard::Stub& stub,
                                          int64_t step, int64_t first_id,
                                          int64_t n) {
  auto p = std::make_unique<PendingLookup>();
  p->ctx.set_deadline(In(absl::Seconds(60)));
  p->request.mutable_header()->set_shard_map_epoch(1);
  p->request.mutable_header()->set_step(step);
  v1::TableIds* t = p->request.add_tables();
  t->set_table("user");
  t->set_ids(EncodedIds(first_id, n));
  PendingLookup* raw = p.get();
  stub.async()->Lookup(&raw->ctx, &raw->request, &raw->response,
                       [raw](grpc::Status s) {
                         raw->status = std::move(s);
                         raw->done.Notify();
                       });
  return p;
}

TEST(ShardHardening, ParkedLookupsAreBoundedAndDroppedWhenCancelled) {
  TempDir dir;
  // Sync, two workers: a lookup for step 1 waits for both step-0 pushes.
  auto shard = StartStandalone(dir, {"--world_size=2", "--consistency=sync",
                                     "--step_timeout=300s",
                                     "--max_parked_lookups=3",
                                     "--max_parked_ids=2000"});
  ASSERT_NE(shard, nullptr);
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel(shard->address(), rpc::ChannelKind::kData));
  auto parked_are = [&](int64_t lookups, int64_t ids) {
    absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
    return stats.ok() && stats->parked_lookups() == lookups &&
           stats->parked_ids() == ids;
  };
  std::vector<std::unique_ptr<PendingLookup>> parked;
  parked.push_back(SendLookup(*stub, 1, 0, 1000));
  ASSERT_TRUE(testing::Eventually([&] { return parked_are(1, 1000); }));
  // Past the ids limit: refused at once, not parked.
  auto too_many_ids = SendLookup(*stub, 1, 0, 1001);
  ASSERT_TRUE(too_many_ids->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(too_many_ids->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(too_many_ids->status.error_message().find("--max_parked_ids=2000"),
            std::string::npos) << too_many_ids->status.error_message();
  parked.push_back(SendLookup(*stub, 1, 0, 10));
  parked.push_back(SendLookup(*stub, 1, 0, 10));
  ASSERT_TRUE(testing::Eventually([&] { return parked_are(3, 1020); }));
  // Past the count limit.
  auto fourth = SendLookup(*stub, 1, 0, 10);
  ASSERT_TRUE(fourth->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(fourth->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(fourth->status.error_message().find("--max_parked_lookups=3"),
            std::string::npos) << fourth->status.error_message();
  // The clients give up: the server drops them long before the 300 s step
  // timeout.
  for (auto& p : parked) p->ctx.TryCancel();
  for (auto& p : parked) {
    ASSERT_TRUE(p->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_TRUE(testing::Eventually([&] { return parked_are(0, 0); },
                                  absl::Seconds(10)));
  // Still serving: the step completes and a lookup runs.
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->total_rows(), 0);
}

TEST(ShardHardening, RestartedShardFailsTheJobNamingBothIncarnations) {
  TempDir dir;
  auto shard = StartStandalone(dir, {"--consistency=async"});
  ASSERT_NE(shard, nullptr);
  const std::string address = shard->address();
  absl::StatusOr<v1::StatsResponse> before = StatsOf(address);
  ASSERT_TRUE(before.ok());
  ASSERT_NE(before->incarnation(), 0u);
  client::EmbeddingClientOptions options;
  options.max_attempts = 50;  // rides over the restart's UNAVAILABLE
  options.max_backoff = absl::Milliseconds(100);
  auto client = EmbeddingClient::Create(
      {{"user", 8}}, client::MakeServerShardMapSource({address}), options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<int64_t> ids = {1, 2, 3};
  std::vector<float> rows(ids.size() * 8), grads(ids.size() * 8, 1.0f);
  ASSERT_TRUE((*client)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  ASSERT_TRUE((*client)->PushGradients(0, {{{0, ids, grads.data()}}}).ok());

  // A crash, and a fresh process on the same port: same map epoch, rows
  // back at their initial values.
  shard->Kill();
  auto again = StartStandalone(dir, {"--consistency=async", "--listen=" + address});
  ASSERT_NE(again, nullptr);
  absl::StatusOr<v1::StatsResponse> after = StatsOf(address);
  ASSERT_TRUE(after.ok());
  ASSERT_NE(after->incarnation(), before->incarnation());
  const absl::Status s = (*client)->Lookup(1, {{{0, ids, rows.data()}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  for (const std::string& part :
       {address, absl::StrCat(absl::Hex(before->incarnation(), absl::kZeroPad16)),
        absl::StrCat(absl::Hex(after->incarnation(), absl::kZeroPad16)),
        std::string("lost"), std::string("checkpoint")}) {
    EXPECT_NE(s.message().find(part), absl::string_view::npos) << part << ": " << s;
  }
  // Every later call fails too, pushes included.
  EXPECT_EQ((*client)->PushGradients(1, {{{0, ids, grads.data()}}}).code(),
            absl::StatusCode::kDataLoss);
  // A new client (a job restored from a checkpoint) works with it.
  auto fresh = EmbeddingClient::Create(
      {{"user", 8}}, client::MakeServerShardMapSource({address}), options);
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE((*fresh)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
}

// grpc.health.v1.Health/Check for the whole server (empty request), sent
// as raw bytes: the status (1 SERVING, 2 NOT_SERVING), or -1 on error.
int HealthOf(const std::string& address) {
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> stub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  grpc::ByteBuffer request(nullptr, 0), response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // HealthCheckResponse { ServingStatus status = 1; }: 0x08 <varint>.
  if (bytes.empty()) return 0;
  if (bytes.size() != 2 || bytes[0] != 0x08) return -1;
  return bytes[1];
}

TEST(ShardHardening, HealthIsNotServingUntilAMapIsInstalled) {
  TempDir dir;
  auto shard = LocalShard::Start(
      RECPS_SHARD_BINARY,
      {"--tables=" + dir.WriteFile("t.textproto", kWideTables),
       absl::StrCat("--num_slots=", kSlots), "--threads=2"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(HealthOf((*shard)->address()), 2);  // NOT_SERVING
  ASSERT_TRUE(testing::InstallShardMap({(*shard)->address()}, 1, kSlots).ok());
  EXPECT_EQ(HealthOf((*shard)->address()), 1);  // SERVING
  // A standalone server installs its own map before it serves.
  auto standalone = StartStandalone(dir);
  ASSERT_NE(standalone, nullptr);
  EXPECT_EQ(HealthOf(standalone->address()), 1);
}

using testing::MetricValue;
using testing::ScrapeMetrics;

TEST(ShardHardening, ResidentBytesMetricFollowsTheProcess) {
  TempDir dir;
  auto shard = StartStandalone(dir);
  ASSERT_NE(shard, nullptr);
  auto client = EmbeddingClient::Create(
      {{"wide", 4096}}, client::MakeServerShardMapSource({shard->address()}),
      client::EmbeddingClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<int64_t> ids(2000);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<float> rows(ids.size() * 4096), grads(ids.size() * 4096, 0.5f);
  ASSERT_TRUE((*client)->Lookup(0, {{{0, ids, rows.data()}}}).ok());
  ASSERT_TRUE((*client)->PushGradients(0, {{{0, ids, grads.data()}}}).ok());
  // 2000 rows of 16 KiB: the process holds more than 32 MB, and the metric
  // says so without anyone calling Stats.
  std::string body;
  EXPECT_TRUE(testing::Eventually([&] {
    body = ScrapeMetrics(shard->metrics_port());
    return MetricValue(body, "recps_shard_resident_bytes") > 32e6;
  }, absl::Seconds(10))) << body.substr(0, 3000);
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(shard->address());
  ASSERT_TRUE(stats.ok());
  const double scraped = MetricValue(ScrapeMetrics(shard->metrics_port()),
                                     "recps_shard_resident_bytes");
  EXPECT_NEAR(scraped, stats->resident_bytes(), 0.25 * stats->resident_bytes());
}

// A fixed table far larger than the machine's memory (2^24 rows of 16 KiB:
// 256 GiB) on a standalone server, whose default is to commit its fixed
// tables' memory at start: it must not try (the OOM killer would end it,
// where lazily created rows may never need it all), say why, and serve.
TEST(ShardHardening, FixedTablesLargerThanMemoryAreNotCommittedAtStart) {
  TempDir dir;
  const std::string log = dir.path() + "/shard.log";
  const std::string tables = dir.WriteFile("huge.textproto", R"(
tables { name: "huge" dim: 4096 num_rows: 16777216 optimizer { kind: SGD learning_rate: 0.1 } })");
  auto shard = LocalShard::Start(
      "/bin/sh", {"-c", "exec \"$0\" \"$@\" >>" + log + " 2>&1", RECPS_SHARD_BINARY,
                  "--tables=" + tables, "--standalone", "--threads=1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("not committing the fixed tables' memory at start"), std::string::npos)
      << text;
  EXPECT_NE(text.find("--prefault_fixed_tables"), std::string::npos) << text;
  absl::StatusOr<v1::StatsResponse> stats = StatsOf((*shard)->address());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_LT(stats->resident_bytes(), int64_t{1} << 30);
}

TEST(ShardHardening, FloodOfBadRequestsIsCountedAndBarelyLogged) {
  TempDir dir;
  const std::string log = dir.path() + "/shard.log";
  // Through a shell, to catch the server's stdout and stderr in `log`.
  auto shard = LocalShard::Start(
      "/bin/sh",
      {"-c", "exec \"$0\" \"$@\" >>" + log + " 2>&1", RECPS_SHARD_BINARY,
       "--tables=" + dir.WriteFile("t.textproto", kWideTables), "--standalone",
       "--threads=2"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer> raw(
      rpc::MakeChannel((*shard)->address(), rpc::ChannelKind::kData));
  // LookupRequest { tables { table: "\xff\xfe" } }: invalid UTF-8 in a
  // string field, which protobuf logs an error for on every parse.
  const std::string malformed("\x12\x04\x0a\x02\xff\xfe", 6);
  constexpr int kBad = 1000;
  int refused = 0;
  for (int i = 0; i < kBad; ++i) {
    grpc::Slice slice(malformed.data(), malformed.size());
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    absl::Notification done;
    grpc::Status status;
    raw.UnaryCall(&ctx, "/recps.v1.EmbeddingShard/Lookup", grpc::StubOptions(),
                  &request, &response, [&](grpc::Status s) {
                    status = std::move(s);
                    done.Notify();
                  });
    done.WaitForNotification();
    if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) ++refused;
  }
  EXPECT_EQ(refused, kBad);
  // Counted, by method and reason.
  const std::string body = ScrapeMetrics((*shard)->metrics_port());
  EXPECT_EQ(MetricValue(body,
                        "recps_shard_bad_requests_total{reason=\"malformed\","
                        "rpc=\"Lookup\"}"),
            kBad) << body.substr(0, 3000);
  // Still serving.
  EXPECT_TRUE(StatsOf((*shard)->address()).ok());
  // A few lines, not one or two per request.
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)),
                         std::istreambuf_iterator<char>());
  EXPECT_LT(text.size(), 16u * 1024) << text.substr(0, 4000);
  EXPECT_NE(text.find("bad Lookup request (malformed)"), std::string::npos)
      << text.substr(0, 4000);
}

// Found by tests/fuzz/fuzz_shard_lookup: a lookup whose second table has an
// id outside that fixed table was refused only after the first table's
// rows were created. Now refused before any row is made.
TEST(ShardHardening, LookupRefusedForALaterTableCreatesNoRows) {
  TempDir dir;
  const std::string tables = dir.WriteFile("fixed.textproto", R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
tables { name: "fixed" dim: 4 num_rows: 10 optimizer { kind: SGD learning_rate: 0.1 } }
)");
  auto shard = LocalShard::Start(
      RECPS_SHARD_BINARY, {"--tables=" + tables, "--standalone",
                           "--max_rows_per_table=1000", "--threads=2",
                           "--store_threads=1"});
  ASSERT_TRUE(shard.ok()) << shard.status();
  v1::LookupRequest lookup;
  lookup.mutable_header()->set_shard_map_epoch(1);
  v1::TableIds* user = lookup.add_tables();
  user->set_table("user");
  user->set_ids(EncodedIds(0, 3));
  v1::TableIds* fixed = lookup.add_tables();
  fixed->set_table("fixed");
  fixed->set_ids(EncodedIds(10, 1));  // one past the last row
  auto stub = v1::EmbeddingShard::NewStub(
      rpc::MakeChannel((*shard)->address(), rpc::ChannelKind::kData));
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  v1::LookupResponse rows;
  const grpc::Status s = stub->Lookup(&ctx, lookup, &rows);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("table 'fixed': id 10 (position 0) is outside [0, 10)"),
            std::string::npos) << s.error_message();
  absl::StatusOr<v1::StatsResponse> stats = StatsOf((*shard)->address());
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->total_rows(), 0);
}

}  // namespace
}  // namespace recps
