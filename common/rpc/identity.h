// Who is calling: the role and name a recps certificate carries in its SAN
// URI, spiffe://recps/<cluster>/<role>/<name>. docs/security.md.
#ifndef RECPS_COMMON_RPC_IDENTITY_H_
#define RECPS_COMMON_RPC_IDENTITY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

namespace recps::rpc {

enum class Role : uint8_t {
  kNone = 0,
  kWorker,
  kShard,
  kCoordinator,
  kAdmin,
  kReader
};
inline constexpr Role kAllRoles[] = {Role::kWorker, Role::kShard,
                                     Role::kCoordinator, Role::kAdmin,
                                     Role::kReader};

// "worker", ...; "none" for kNone.
const char* RoleName(Role role);
// INVALID_ARGUMENT naming the roles for anything else.
absl::StatusOr<Role> ParseRole(absl::string_view name);
// Bit of `role` in a set of roles.
constexpr uint32_t RoleBit(Role role) {
  return uint32_t{1} << static_cast<int>(role);
}

struct PeerIdentity {
  // The peer presented a certificate our CA signed (mutual TLS).
  bool authenticated = false;
  // kNone: no spiffe://recps/ URI in the certificate.
  Role role = Role::kNone;
  std::string cluster;
  std::string name;
  // The SAN URI the role came from ("" without one).
  std::string uri;
};

// Parses spiffe://recps/<cluster>/<role>/<name>; INVALID_ARGUMENT saying
// what is wrong. Each part is [A-Za-z0-9._-]{1,64}.
absl::StatusOr<PeerIdentity> ParseRecpsUri(absl::string_view uri);
// The URI a certificate for `role` and `name` carries.
std::string RecpsUri(absl::string_view cluster, Role role,
                     absl::string_view name);

// The caller of a server call, from its TLS auth context. Unauthenticated
// (plaintext) callers have authenticated=false and no role.
PeerIdentity IdentityOf(const grpc::ServerContextBase& context);
// The same from a connection's auth context.
PeerIdentity IdentityOf(const grpc::AuthContext& auth);

// The recps identity in the SAN URI of the PEM certificate at `cert_file`
// (the process's own, to learn its cluster). NOT_FOUND when the file
// cannot be read or holds no certificate, INVALID_ARGUMENT when it carries
// no valid spiffe://recps/ URI.
absl::StatusOr<PeerIdentity> CertificateIdentity(const std::string& cert_file);

// Roles that serve gRPC: what a client accepts at the other end of a
// channel (a worker or reader certificate cannot pose as a server).
constexpr bool IsServerRole(Role role) {
  return role == Role::kShard || role == Role::kCoordinator;
}

// The worker ranks a worker certificate may act for, bound by its name:
// "rank-<N>" acts for rank N only, "ranks-<A>-<B>" for A..B (a node's
// processes sharing one certificate). Any other name is unbound (nullopt):
// shard servers then accept any rank from it, and the coordinator binds
// ranks to it at registration. docs/security.md.
struct RankRange {
  int32_t first = 0;
  int32_t last = 0;
  bool Contains(int32_t rank) const { return rank >= first && rank <= last; }
};
std::optional<RankRange> BoundRanks(absl::string_view certificate_name);
// The certificate name that binds `first`..`last` ("rank-3", "ranks-0-3").
std::string RankCertificateName(int32_t first, int32_t last);

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_IDENTITY_H_
