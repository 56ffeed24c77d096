// Channels and credentials: every recps process makes its gRPC channels and
// listening ports here, and nowhere else, so that transport security (mutual
// TLS, identities) changes this file only. docs/security.md.
#ifndef RECPS_COMMON_RPC_CHANNELS_H_
#define RECPS_COMMON_RPC_CHANNELS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace recps::rpc {

// How a process authenticates its peers.
struct TransportSecurity {
  enum class Mode {
    // Whatever the process chose at start (SetProcessSecurity); plaintext
    // when it chose nothing (tests, libraries).
    kProcessDefault,
    // Plaintext gRPC: no authentication, every call allowed.
    kInsecure,
    // Mutual TLS: both sides present a certificate signed by `ca_file`;
    // servers take the caller's role from its certificate (identity.h).
    kTls,
  };
  Mode mode = Mode::kProcessDefault;
  // PEM files, re-read every `reload_interval` (certificates rotate without
  // a restart; connections made before keep their handshake).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  absl::Duration reload_interval = absl::Seconds(10);

  static TransportSecurity Insecure();
  static TransportSecurity Tls(
      std::string ca, std::string cert, std::string key,
      absl::Duration reload_interval = absl::Seconds(10));
};

// The security every kProcessDefault resolves to. Call once in main(),
// before any channel or server is made.
void SetProcessSecurity(const TransportSecurity& security);
// `security` with kProcessDefault resolved (never kProcessDefault).
TransportSecurity Resolve(const TransportSecurity& security);

// OK when the TLS files exist and hold PEM data (the certificate provider
// itself only logs a missing file and fails every handshake); a message
// naming the flag and the file otherwise. OK for insecure.
absl::Status CheckTlsFiles(const TransportSecurity& security);

// What kind of peer a channel reaches: sets the reconnect and message-size
// arguments that suit it.
enum class ChannelKind {
  // Control plane (coordinator, admin): small messages, reconnect within a
  // second after the peer restarts (gRPC's default backoff grows to two
  // minutes).
  kControl,
  // Data plane (shard lookups and pushes): no message size limit on our
  // side (the server enforces its own), default reconnect pacing.
  kData,
};

// The cluster named by the process's own certificate (spiffe://recps/
// <cluster>/...); "" with plaintext or an unreadable certificate. Servers
// refuse callers of another cluster, clients servers of another.
std::string OwnClusterOf(const TransportSecurity& security);

// TLS credentials are made once per set of files (each has a file watcher)
// and shared.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TransportSecurity& security);
class CallGate;
// For TLS: client certificates are required and verified. With a `gate`,
// each call's role (and cluster) is checked against gate's table when its
// headers arrive, before its message is read: a caller cannot make the
// server buffer a message of a method it may not call (the handlers still
// Admit for the per-client limits).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TransportSecurity& security, CallGate* gate = nullptr);

// A channel to `address` ("host:port"). Never fails: gRPC connects lazily,
// and a bad address surfaces as UNAVAILABLE on the first call. With TLS the
// server's certificate must name the host (DNS or IP SAN) and a server
// role (shard or coordinator) of this process's cluster.
std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, ChannelKind kind,
    const TransportSecurity& security = TransportSecurity());

// Keepalive, so that a peer behind a link that went silently dead (no FIN,
// no RST: a cut cable, a partition, a frozen host) is noticed within
// seconds instead of at a call's deadline. Clients ping every
// kKeepaliveTime while calls are open and close the connection when a ping
// is not answered within kKeepaliveTimeout (its calls then fail UNAVAILABLE
// and are retried or reported); servers accept those pings (gRPC's default
// answers a client pinging more often than every 5 minutes with GOAWAY) and
// ping idle clients themselves, less often.
inline constexpr int kKeepaliveTimeMs = 2000;
inline constexpr int kKeepaliveTimeoutMs = 2000;
// Applies the server side of the above to a server about to be built.
void ConfigureServerKeepalive(grpc::ServerBuilder* builder);

// Sets a call's deadline `timeout` from now (every client call has one).
void SetTimeout(absl::Duration timeout, grpc::ClientContext* context);
void SetDeadline(absl::Time deadline, grpc::ClientContext* context);

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_CHANNELS_H_
