#include "common/rpc/channels.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"
#include "common/rpc/call_gate.h"
#include "common/rpc/identity.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/channel_arguments.h"

namespace recps::rpc {
namespace {

// gRPC 1.51 drives a client's connection attempt that no call is polling
// (an RPC queued while the channel reconnects) only from its "backup
// poller", every 5 s by default: after one refused connect every later try
// took 5 s, so a client reached a restarted coordinator or shard server
// 5-10 s late (and a TLS handshake, a few round trips, up to 20 s). 100 ms
// costs an idle wake-up per process. Set before main, so before grpc_init
// reads it; an operator's own setting wins.
const bool backup_poll_set = [] {
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  return true;
}();

ABSL_CONST_INIT absl::Mutex process_mu(absl::kConstInit);
TransportSecurity& ProcessSecurityLocked()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(process_mu) {
  static TransportSecurity* const security =
      new TransportSecurity(TransportSecurity::Insecure());
  return *security;
}

using FilesKey = std::tuple<std::string, std::string, std::string, int64_t>;

FilesKey KeyOf(const TransportSecurity& s) {
  return {s.ca_file, s.cert_file, s.key_file,
          absl::ToInt64Seconds(s.reload_interval)};
}

unsigned RefreshSeconds(const TransportSecurity& s) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, absl::ToInt64Seconds(s.reload_interval)));
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(
    const TransportSecurity& s) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      s.key_file, s.cert_file, s.ca_file, RefreshSeconds(s));
}

// A client accepts a server only when the server's certificate names a
// server role (shard or coordinator) of this process's own cluster: a
// worker's or reader's certificate of the same CA cannot pose as a shard
// server, nor can another cluster's servers that share the CA. The chain
// is still verified against the CA, and gRPC still checks the dialled host
// against the certificate on every call (check_call_host).
class ServerRoleVerifier final
    : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit ServerRoleVerifier(std::string cluster) : cluster_(std::move(cluster)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    *sync_status = Check(request->uri_names());
    return true;  // decided synchronously
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  grpc::Status Check(const std::vector<grpc::string_ref>& uris) const {
    for (const grpc::string_ref& value : uris) {
      absl::StatusOr<PeerIdentity> peer =
          ParseRecpsUri(absl::string_view(value.data(), value.size()));
      if (!peer.ok()) continue;
      if (!IsServerRole(peer->role)) {
        return Refuse(absl::StrCat("the server's certificate ", peer->uri, " has role '",
                                   RoleName(peer->role),
                                   "'; servers are shard or coordinator"));
      }
      if (!cluster_.empty() && peer->cluster != cluster_) {
        return Refuse(absl::StrCat("the server's certificate ", peer->uri,
                                   " belongs to cluster '", peer->cluster,
                                   "', this process to '", cluster_, "'"));
      }
      return grpc::Status::OK;
    }
    return Refuse("the server's certificate has no spiffe://recps/<cluster>/<role>/<name> URI");
  }
  static grpc::Status Refuse(const std::string& why) {
    LogWarning("refusing a TLS server: ", why);
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
  }

  const std::string cluster_;
};

// The cluster of this process's own certificate; "" when it cannot be read
// (then only the role is checked).
std::string OwnCluster(const TransportSecurity& s) {
  absl::StatusOr<PeerIdentity> own = CertificateIdentity(s.cert_file);
  if (!own.ok()) {
    LogWarning("cannot read this process's identity (", own.status().message(),
               "): peers' clusters are not checked");
    return "";
  }
  return own->cluster;
}

// Runs the gate's role check when a call's headers arrive: gRPC calls it
// before the call's message is read, and a refusal ends the call there
// (the transport drops the rest of its bytes).
class RoleCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit RoleCheck(CallGate* gate) : gate_(gate) {}
  // Cheap and lock-light: runs on the transport's thread.
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata*, OutputMetadata*) override {
    auto path = metadata.find(":path");
    if (path == metadata.end() || context == nullptr) return grpc::Status::OK;
    // "/recps.v1.EmbeddingShard/PushGradients" -> "EmbeddingShard.PushGradients"
    absl::string_view method(path->second.data(), path->second.size());
    const size_t slash = method.rfind('/');
    if (slash == absl::string_view::npos) return grpc::Status::OK;
    absl::string_view service = method.substr(0, slash);
    const size_t dot = service.rfind('.');
    service = service.substr(dot == absl::string_view::npos ? 1 : dot + 1);
    const std::string name = absl::StrCat(service, ".", method.substr(slash + 1));
    const absl::Status s = gate_->CheckRole(IdentityOf(*context), name);
    if (s.ok()) return grpc::Status::OK;
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }

 private:
  CallGate* const gate_;
};

}  // namespace

std::string OwnClusterOf(const TransportSecurity& security) {
  const TransportSecurity s = Resolve(security);
  if (s.mode != TransportSecurity::Mode::kTls) return "";
  return OwnCluster(s);
}

TransportSecurity TransportSecurity::Insecure() {
  TransportSecurity s;
  s.mode = Mode::kInsecure;
  return s;
}

TransportSecurity TransportSecurity::Tls(std::string ca, std::string cert,
                                         std::string key,
                                         absl::Duration reload_interval) {
  TransportSecurity s;
  s.mode = Mode::kTls;
  s.ca_file = std::move(ca);
  s.cert_file = std::move(cert);
  s.key_file = std::move(key);
  s.reload_interval = reload_interval;
  return s;
}

void SetProcessSecurity(const TransportSecurity& security) {
  absl::MutexLock lock(&process_mu);
  ProcessSecurityLocked() =
      security.mode == TransportSecurity::Mode::kProcessDefault
          ? TransportSecurity::Insecure()
          : security;
}

TransportSecurity Resolve(const TransportSecurity& security) {
  if (security.mode != TransportSecurity::Mode::kProcessDefault)
    return security;
  absl::MutexLock lock(&process_mu);
  return ProcessSecurityLocked();
}

absl::Status CheckTlsFiles(const TransportSecurity& security) {
  const TransportSecurity s = Resolve(security);
  if (s.mode != TransportSecurity::Mode::kTls) return absl::OkStatus();
  const std::pair<const char*, const std::string*> files[] = {
      {"--tls_ca", &s.ca_file},
      {"--tls_cert", &s.cert_file},
      {"--tls_key", &s.key_file}};
  for (const auto& [flag, path] : files) {
    if (path->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag,
          " is empty: mutual TLS needs --tls_ca, --tls_cert and --tls_key "
          "(or --insecure for plaintext)"));
    }
    std::ifstream in(*path);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, "=", *path, ": cannot read the file"));
    }
    std::stringstream text;
    text << in.rdbuf();
    if (!absl::StrContains(text.str(), "-----BEGIN ")) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, "=", *path, ": not a PEM file (no -----BEGIN line)"));
    }
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TransportSecurity& security) {
  const TransportSecurity s = Resolve(security);
  if (s.mode != TransportSecurity::Mode::kTls)
    return grpc::InsecureChannelCredentials();
  static absl::Mutex mu(absl::kConstInit);
  static auto* const cache =
      new std::map<FilesKey, std::shared_ptr<grpc::ChannelCredentials>>();
  absl::MutexLock lock(&mu);
  std::shared_ptr<grpc::ChannelCredentials>& creds = (*cache)[KeyOf(s)];
  if (creds == nullptr) {
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(Provider(s));
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    // The server's certificate must chain to the CA and name the host we
    // dialled (gRPC's default hostname verifier).
    options.set_verify_server_certs(true);
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<ServerRoleVerifier>(
            OwnCluster(s)));
    creds = grpc::experimental::TlsCredentials(options);
  }
  return creds;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TransportSecurity& security, CallGate* gate) {
  const TransportSecurity s = Resolve(security);
  if (s.mode != TransportSecurity::Mode::kTls)
    return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(s));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::experimental::TlsServerCredentials(options);
  if (gate != nullptr) creds->SetAuthMetadataProcessor(std::make_shared<RoleCheck>(gate));
  return creds;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           ChannelKind kind,
                                           const TransportSecurity& security) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kKeepaliveTimeMs);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kKeepaliveTimeoutMs);
  // Keep pinging while a call stays open without data (a sync lookup
  // parked for its step, a map watch): gRPC stops after 2 by default.
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  switch (kind) {
    case ChannelKind::kControl:
      // Quick reconnects after a restart. Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS:
      // gRPC takes it as the minimum connect timeout, and 100 ms for TCP
      // connect + TLS handshake was too short on a loaded machine (every
      // attempt timed out mid-handshake, over and over).
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      break;
    case ChannelKind::kData:
      args.SetMaxReceiveMessageSize(-1);
      args.SetMaxSendMessageSize(-1);
      break;
  }
  return grpc::CreateCustomChannel(address, ChannelCredentials(security), args);
}

void ConfigureServerKeepalive(grpc::ServerBuilder* builder) {
  // Clients' pings every kKeepaliveTimeMs, with or without data, are
  // welcome: never a GOAWAY for "too many pings".
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                              kKeepaliveTimeMs / 2);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A dead client's connection (and its parked calls) go within ~15 s.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
}

void SetTimeout(absl::Duration timeout, grpc::ClientContext* context) {
  SetDeadline(absl::Now() + timeout, context);
}

void SetDeadline(absl::Time deadline, grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace recps::rpc
