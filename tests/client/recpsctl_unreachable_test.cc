// recpsctl against a coordinator that does not answer, through real
// processes: `moves` and `rebalance` over mutual TLS end with a clean error
// (exit 1 naming the coordinator), never a crash; `rebalance --apply`
// reports a coordinator that died while the rebalance ran instead of
// sitting at 0% until --timeout. docs/admin-cli.md.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "client/embedding_client.h"
#include "client/launcher/process.h"
#include "common/security/certs.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using testing::LocalShard;
using testing::TempDir;

// A TCP port on 127.0.0.1 that accepts connections (the kernel completes
// them) but never reads or answers: a hung or firewalled coordinator. A
// TLS handshake with it never ends.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 && listen(fd_, 128) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~SilentListener() { close(fd_); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A port nothing listens on (connections refused).
std::string ClosedAddress() {
  SilentListener taken;  // picks a free port, closed when it goes
  return taken.address();
}

// Certificates for every role, made once (the openssl command).
class RecpsctlUnreachableTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    ASSERT_TRUE(security::InitCertDir(Certs(), security::CertOptions()).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string Certs() { return dir_->path() + "/certs"; }
  static std::vector<std::string> AdminTls() {
    return {"--tls_ca=" + Certs() + "/ca.crt", "--tls_cert=" + Certs() + "/admin.crt",
            "--tls_key=" + Certs() + "/admin.key"};
  }

  struct Run {
    std::string log;
    absl::StatusOr<client::ChildProcess> process;
  };
  // Starts recpsctl with `args`; stdout and stderr go to a log file.
  static Run Start(std::vector<std::string> args) {
    static int next = 0;
    Run run;
    run.log = absl::StrCat(dir_->path(), "/recpsctl-", next++, ".log");
    run.process = client::ChildProcess::Spawn(RECPSCTL_BINARY, args, run.log);
    EXPECT_TRUE(run.process.ok()) << run.process.status();
    return run;
  }

  static inline TempDir* dir_ = nullptr;
};

// Waits for `run` and checks it failed cleanly: exit 1 (not 128 + a
// signal) with recpsctl's error naming the coordinator.
void ExpectCleanError(RecpsctlUnreachableTest::Run& run, const std::string& coordinator,
                      absl::Duration timeout) {
  ASSERT_TRUE(run.process.ok());
  absl::StatusOr<int> code = run.process->Wait(timeout);
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << ::recps::testing::ReadAll(run.log);
  const std::string log = ::recps::testing::ReadAll(run.log);
  EXPECT_EQ(*code, 1) << (*code > 128 ? "killed by a signal\n" : "") << log;
  EXPECT_TRUE(absl::StrContains(log, "recpsctl: coordinator " + coordinator)) << log;
}

TEST_F(RecpsctlUnreachableTest, MovesAndRebalanceOverTlsFailCleanlyAndQuickly) {
  SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  const std::string closed = ClosedAddress();
  std::vector<std::pair<Run, std::string>> runs;
  const absl::Time start = absl::Now();
  for (const std::string& coordinator : {silent.address(), closed}) {
    for (const char* command : {"moves", "rebalance"}) {
      std::vector<std::string> args = {command, "--coordinator=" + coordinator,
                                       "--timeout=2s"};
      for (std::string& f : AdminTls()) args.push_back(std::move(f));
      runs.emplace_back(Start(args), coordinator);
    }
  }
  for (auto& [run, coordinator] : runs) {
    ExpectCleanError(run, coordinator, absl::Seconds(30));
  }
  // --timeout bounds each: the four ran side by side.
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

// The crash needed the default 30 s: gRPC re-resolves a failing target at
// most every 30 s, and the re-resolution created a TLS subchannel (reading
// the key through OpenSSL) just as exit() ran OpenSSL's cleanup: SIGSEGV in
// most runs. Several side by side, as it did not crash every time.
TEST_F(RecpsctlUnreachableTest, HungCoordinatorOverTlsWithTheDefaultTimeoutDoesNotCrash) {
  SilentListener silent;
  ASSERT_GT(silent.port(), 0);
  std::vector<Run> runs;
  for (int i = 0; i < 6; ++i) {
    std::vector<std::string> args = {i % 2 == 0 ? "moves" : "rebalance",
                                     "--coordinator=" + silent.address(), "--timeout=30s"};
    for (std::string& f : AdminTls()) args.push_back(std::move(f));
    runs.push_back(Start(args));
  }
  for (Run& run : runs) ExpectCleanError(run, silent.address(), absl::Seconds(90));
}

constexpr char kTables[] = R"(
tables { name: "user" dim: 8 optimizer { kind: SGD learning_rate: 0.1 } }
)";

TEST_F(RecpsctlUnreachableTest, RebalanceApplyReportsACoordinatorThatDied) {
  const std::string state = dir_->path() + "/state";
  auto coordinator = LocalShard::Start(
      RECPS_COORDINATOR_BINARY, {"--state_dir=" + state, "--num_shards=2", "--num_slots=60",
                                 "--lease=3s", "--tick=20ms"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  const std::string tables = dir_->WriteFile("tables.textproto", kTables);
  std::vector<std::unique_ptr<LocalShard>> shards;
  std::vector<std::string> servers;
  client::CoordinatorClient admin(address);
  for (int i = 0; i < 3; ++i) {
    auto shard = LocalShard::Start(
        RECPS_SHARD_BINARY, {"--tables=" + tables, "--num_slots=60", "--threads=1",
                             "--consistency=async", "--coordinator=" + address});
    ASSERT_TRUE(shard.ok()) << shard.status();
    servers.push_back((*shard)->address());
    shards.push_back(*std::move(shard));
    if (i == 1) {
      // The map is built over the first two; the third joins late and the
      // plan gives it a share.
      ASSERT_TRUE(testing::Eventually([&] { return admin.GetShardMap().ok(); },
                                      absl::Seconds(30)));
    }
  }
  ASSERT_TRUE(testing::Eventually(
      [&] {
        absl::StatusOr<v1::ListMembersResponse> m = admin.ListMembers();
        return m.ok() && m->members_size() == 3;
      },
      absl::Seconds(30)));
  // Rows to copy: 30000 ids, about a third of them move (some 400 KB).
  {
    auto rows = client::EmbeddingClient::Create(
        {{"user", 8}}, client::MakeServerShardMapSource({servers[0], servers[1]}), {});
    ASSERT_TRUE(rows.ok()) << rows.status();
    std::vector<int64_t> ids(30000);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
    std::vector<float> out(ids.size() * 8);
    ASSERT_TRUE((*rows)->Lookup(0, {{{0, ids, out.data()}}}).ok());
  }

  // 10 kB/s: the copy would take half a minute. --timeout=8s makes each
  // call's retries, and so the report, 8 s.
  Run run = Start({"rebalance", "--coordinator=" + address, "--apply", "--insecure",
                   "--max_bytes_per_second=10000", "--timeout=8s"});
  ASSERT_TRUE(run.process.ok());
  ASSERT_TRUE(testing::Eventually(
      [&] { return absl::StrContains(::recps::testing::ReadAll(run.log), "applying rebalance"); },
      absl::Seconds(20)))
      << ::recps::testing::ReadAll(run.log);
  (*coordinator)->Kill();
  const absl::Time killed = absl::Now();
  absl::StatusOr<int> code = run.process->Wait(absl::Seconds(60));
  ASSERT_TRUE(code.ok()) << code.status() << "\n" << ::recps::testing::ReadAll(run.log);
  const std::string log = ::recps::testing::ReadAll(run.log);
  EXPECT_EQ(*code, 1) << log;
  EXPECT_TRUE(absl::StrContains(log, "lost the coordinator while rebalance")) << log;
  EXPECT_TRUE(absl::StrContains(log, address)) << log;
  EXPECT_TRUE(absl::StrContains(log, "recpsctl moves")) << log;
  // The bound: the call's own retries (8 s) and a little slack.
  EXPECT_LT(absl::Now() - killed, absl::Seconds(16)) << log;
}

}  // namespace
}  // namespace recps
