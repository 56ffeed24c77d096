// The fixture of the mutual-TLS process tests (tls_process_test.cc,
// insider_process_test.cc): a CA with a certificate per role, worker
// certificates "worker-a" and "worker-b", and ones that must be refused
// (another CA's, an expired one, one for another host); helpers to start a
// recps-shard with TLS and to call it. docs/security.md.
#ifndef RECPS_TESTS_SECURITY_TLS_FIXTURE_H_
#define RECPS_TESTS_SECURITY_TLS_FIXTURE_H_

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/channels.h"
#include "common/security/certs.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {

namespace fs = std::filesystem;
using testing::Eventually;
using testing::LocalShard;
using testing::TempDir;

// One fixed table (lookups create no rows that matter) and one dynamic.
inline constexpr char kTables[] = R"(
tables { name: "fixed" dim: 4 num_rows: 1000 optimizer { kind: SGD learning_rate: 0.1 } }
tables { name: "dyn" dim: 4 optimizer { kind: SGD learning_rate: 0.1 } }
)";

// Runs a shell command; its exit code.
inline int Shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class TlsProcessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string ca = Ca();
    ASSERT_TRUE(security::InitCertDir(ca, security::CertOptions()).ok());
    for (const char* name : {"worker-a", "worker-b"}) {
      ASSERT_TRUE(
          security::IssueCert(ca, ca, "worker", name, security::CertOptions())
              .ok());
    }
    // Another CA's admin certificate.
    ASSERT_TRUE(
        security::InitCertDir(dir_->path() + "/other", security::CertOptions())
            .ok());
    // A server certificate for another host only.
    security::CertOptions wrong_host;
    wrong_host.hosts = {"wrong.example"};
    wrong_host.no_local_hosts = true;
    ASSERT_TRUE(
        security::IssueCert(ca, ca, "shard", "wronghost", wrong_host).ok());
    // An admin certificate of our CA that expired in 2020 (openssl ca sets
    // the dates; x509 -days cannot go back).
    const std::string e = dir_->path() + "/expired";
    fs::create_directories(e);
    std::ofstream(e + "/ca.cnf")
        << "[ca]\ndefault_ca = d\n[d]\ndatabase = " << e
        << "/index.txt\nnew_certs_dir = " << e << "\nserial = " << e
        << "/serial\ndefault_md = sha256\npolicy = p\n"
        << "copy_extensions = copy\nunique_subject = no\n[p]\ncommonName = "
           "supplied\n"
        << "[ext]\nsubjectAltName = URI:spiffe://recps/local/admin/expired\n"
        << "extendedKeyUsage = clientAuth, serverAuth\n";
    std::ofstream(e + "/index.txt");
    std::ofstream(e + "/serial") << "1000\n";
    ASSERT_EQ(
        Shell(absl::StrCat(
            "cd ", e,
            " && openssl req -new -newkey ec -pkeyopt "
            "ec_paramgen_curve:prime256v1 -nodes -keyout admin.key -out "
            "admin.csr "
            "-subj /CN=expired 2>/dev/null && openssl ca -batch -config ca.cnf "
            "-extensions ext -cert ",
            ca, "/ca.crt -keyfile ", ca, "/ca.key ",
            "-startdate 20200101000000Z -enddate 20200102000000Z -in admin.csr "
            "-out admin.crt >/dev/null 2>&1")),
        0);
    fs::copy_file(ca + "/ca.crt", e + "/ca.crt");
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string Ca() { return dir_->path() + "/ca"; }
  // TLS with `name`.crt/.key from `dir` (default: our CA's directory),
  // trusting our CA.
  static rpc::TransportSecurity Tls(const std::string& name,
                                    std::string dir = "") {
    if (dir.empty()) dir = Ca();
    return rpc::TransportSecurity::Tls(
        Ca() + "/ca.crt", dir + "/" + name + ".crt", dir + "/" + name + ".key");
  }
  static std::vector<std::string> TlsFlags(const std::string& name,
                                           std::string dir = "") {
    if (dir.empty()) dir = Ca();
    return {"--tls_ca=" + Ca() + "/ca.crt",
            "--tls_cert=" + dir + "/" + name + ".crt",
            "--tls_key=" + dir + "/" + name + ".key"};
  }
  // A channel with its own connection (no subchannel shared with others).
  static std::shared_ptr<grpc::Channel> Channel(
      const std::string& address, const rpc::TransportSecurity& security) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    return grpc::CreateCustomChannel(address, rpc::ChannelCredentials(security),
                                     args);
  }

  std::unique_ptr<LocalShard> StartShard(std::vector<std::string> extra,
                                         const std::string& cert = "shard") {
    std::vector<std::string> args = {
        "--tables=" + dir_->WriteFile("tables.textproto", kTables),
        "--standalone", "--world_size=1", "--threads=2", "--store_threads=1"};
    for (std::string& f : TlsFlags(cert)) args.push_back(std::move(f));
    args.insert(args.end(), extra.begin(), extra.end());
    auto shard = LocalShard::Start(RECPS_SHARD_BINARY, args);
    EXPECT_TRUE(shard.ok()) << shard.status();
    return shard.ok() ? *std::move(shard) : nullptr;
  }

  static grpc::Status Stats(const std::shared_ptr<grpc::Channel>& channel,
                            v1::StatsResponse* response = nullptr) {
    auto stub = v1::ShardAdmin::NewStub(channel);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::StatsResponse ignored;
    return stub->Stats(&context, v1::StatsRequest(),
                       response ? response : &ignored);
  }

  static v1::LookupRequest LookupOf(const std::string& table, int64_t step) {
    v1::LookupRequest request;
    request.mutable_header()->set_shard_map_epoch(1);
    request.mutable_header()->set_step(step);
    v1::TableIds* t = request.add_tables();
    t->set_table(table);
    const int64_t ids[2] = {3, 7};
    t->set_ids(std::string(reinterpret_cast<const char*>(ids), sizeof(ids)));
    return request;
  }

  static grpc::Status Lookup(const std::shared_ptr<grpc::Channel>& channel,
                             const v1::LookupRequest& request) {
    auto stub = v1::EmbeddingShard::NewStub(channel);
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::LookupResponse response;
    return stub->Lookup(&context, request, &response);
  }

  static inline TempDir* dir_ = nullptr;
};

}  // namespace recps

#endif  // RECPS_TESTS_SECURITY_TLS_FIXTURE_H_
