#include "common/rpc/identity.h"

#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/identity_name.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace recps::rpc {
namespace {

constexpr absl::string_view kPrefix = "spiffe://recps/";

}  // namespace

const char* RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kShard:
      return "shard";
    case Role::kCoordinator:
      return "coordinator";
    case Role::kAdmin:
      return "admin";
    case Role::kReader:
      return "reader";
    case Role::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : kAllRoles) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown role \"", name,
      "\" (expected worker, shard, coordinator, admin or reader)"));
}

std::string RecpsUri(absl::string_view cluster, Role role,
                     absl::string_view name) {
  return absl::StrCat(kPrefix, cluster, "/", RoleName(role), "/", name);
}

absl::StatusOr<PeerIdentity> ParseRecpsUri(absl::string_view uri) {
  if (!absl::StartsWith(uri, kPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", uri, "\" does not start with ", kPrefix));
  }
  const std::vector<absl::string_view> parts =
      absl::StrSplit(uri.substr(kPrefix.size()), '/');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", uri, "\": expected spiffe://recps/<cluster>/<role>/<name>"));
  }
  for (absl::string_view p : parts) {
    if (!ValidIdentityPart(p)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", uri, "\": part \"", p, "\" must be 1..64 of [A-Za-z0-9._-]"));
    }
  }
  PeerIdentity id;
  id.cluster = std::string(parts[0]);
  absl::StatusOr<Role> role = ParseRole(parts[1]);
  if (!role.ok()) return role.status();
  id.role = *role;
  id.name = std::string(parts[2]);
  id.uri = std::string(uri);
  return id;
}

PeerIdentity IdentityOf(const grpc::ServerContextBase& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return auth == nullptr ? PeerIdentity() : IdentityOf(*auth);
}

PeerIdentity IdentityOf(const grpc::AuthContext& auth_context) {
  PeerIdentity id;
  const grpc::AuthContext* auth = &auth_context;
  if (!auth->IsPeerAuthenticated()) return id;
  id.authenticated = true;
  // peer_uri lists the URI SANs; older gRPCs only have the SAN list.
  for (const char* property :
       {GRPC_PEER_URI_PROPERTY_NAME, GRPC_X509_SAN_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(property)) {
      const absl::string_view uri(value.data(), value.size());
      if (!absl::StartsWith(uri, kPrefix)) continue;
      absl::StatusOr<PeerIdentity> parsed = ParseRecpsUri(uri);
      if (!parsed.ok()) continue;
      parsed->authenticated = true;
      return *std::move(parsed);
    }
  }
  return id;
}

absl::StatusOr<PeerIdentity> CertificateIdentity(const std::string& cert_file) {
  FILE* file = std::fopen(cert_file.c_str(), "r");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(cert_file, ": cannot read the certificate"));
  }
  X509* cert = PEM_read_X509(file, nullptr, nullptr, nullptr);
  std::fclose(file);
  if (cert == nullptr) {
    return absl::NotFoundError(absl::StrCat(cert_file, ": no PEM certificate in it"));
  }
  auto* names = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  absl::StatusOr<PeerIdentity> found = absl::InvalidArgumentError(absl::StrCat(
      cert_file, ": the certificate has no spiffe://recps/<cluster>/<role>/<name> URI"));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    if (name->type != GEN_URI) continue;
    const ASN1_IA5STRING* text = name->d.uniformResourceIdentifier;
    const absl::string_view uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)),
                                static_cast<size_t>(ASN1_STRING_length(text)));
    if (!absl::StartsWith(uri, kPrefix)) continue;
    found = ParseRecpsUri(uri);
    if (found.ok()) found->authenticated = true;
    break;
  }
  GENERAL_NAMES_free(names);
  X509_free(cert);
  return found;
}

std::optional<RankRange> BoundRanks(absl::string_view name) {
  RankRange range;
  if (absl::ConsumePrefix(&name, "rank-")) {
    if (!absl::SimpleAtoi(name, &range.first) || range.first < 0) return std::nullopt;
    range.last = range.first;
    return range;
  }
  if (!absl::ConsumePrefix(&name, "ranks-")) return std::nullopt;
  const std::vector<absl::string_view> bounds = absl::StrSplit(name, '-');
  if (bounds.size() != 2 || !absl::SimpleAtoi(bounds[0], &range.first) ||
      !absl::SimpleAtoi(bounds[1], &range.last) || range.first < 0 ||
      range.last < range.first) {
    return std::nullopt;
  }
  return range;
}

std::string RankCertificateName(int32_t first, int32_t last) {
  return first == last ? absl::StrCat("rank-", first)
                       : absl::StrCat("ranks-", first, "-", last);
}

}  // namespace recps::rpc
