// Who is calling: the role and name a recps certificate carries in its SAN
// URI, spiffe://recps/<cluster>/<role>/<name>. docs/security.md.
#ifndef RECPS_COMMON_RPC_IDENTITY_H_
#define RECPS_COMMON_RPC_IDENTITY_H_

#include <cstdint>
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

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_IDENTITY_H_
