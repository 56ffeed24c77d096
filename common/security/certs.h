// Certificates for a recps cluster, made with the `openssl` command: a CA
// and one certificate per role, each naming its holder in a SAN URI
// spiffe://recps/<cluster>/<role>/<name> (common/rpc/identity.h) and valid
// for the hosts it serves on. Used by `recpsctl certs` and `recps local`.
// docs/security.md.
#ifndef RECPS_COMMON_SECURITY_CERTS_H_
#define RECPS_COMMON_SECURITY_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace recps::security {

// The roles a certificate may carry.
inline constexpr const char* kRoles[] = {"coordinator", "shard", "worker",
                                         "admin", "reader"};

struct CertOptions {
  // [A-Za-z0-9._-]{1,64}.
  std::string cluster = "local";
  // DNS names or IP addresses the certificate is valid for, besides
  // localhost and 127.0.0.1 (which every certificate names unless
  // `no_local_hosts`).
  std::vector<std::string> hosts;
  bool no_local_hosts = false;
  // Validity of leaf certificates, in days (0: expires at once, for tests).
  int days = 365;
};

// Creates DIR (mode 0700) with ca.crt, ca.key, and <role>.crt and
// <role>.key for every role (named after the role). Keys are 0600.
// FAILED_PRECONDITION when DIR already holds a ca.key (never overwritten)
// or openssl is missing; the openssl error otherwise.
absl::Status InitCertDir(const std::string& dir, const CertOptions& options);

// Issues <out_dir>/<name>.crt and .key for `role` and `name`, signed by
// <ca_dir>/ca.crt and ca.key. Writes the files atomically (rename), so a
// process watching them never reads half a file. ca.crt is copied to
// out_dir when out_dir has none.
absl::Status IssueCert(const std::string& ca_dir, const std::string& out_dir,
                       const std::string& role, const std::string& name,
                       const CertOptions& options);

// OK when `openssl version` runs; FAILED_PRECONDITION saying how to install
// it otherwise.
absl::Status CheckOpenssl();

}  // namespace recps::security

#endif  // RECPS_COMMON_SECURITY_CERTS_H_
