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
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/tls_certificate_provider.h"
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

}  // namespace

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
    creds = grpc::experimental::TlsCredentials(options);
  }
  return creds;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TransportSecurity& security) {
  const TransportSecurity s = Resolve(security);
  if (s.mode != TransportSecurity::Mode::kTls)
    return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(s));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           ChannelKind kind,
                                           const TransportSecurity& security) {
  grpc::ChannelArguments args;
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

void SetTimeout(absl::Duration timeout, grpc::ClientContext* context) {
  SetDeadline(absl::Now() + timeout, context);
}

void SetDeadline(absl::Time deadline, grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(deadline));
}

}  // namespace recps::rpc
