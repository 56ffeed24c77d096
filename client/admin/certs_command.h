// `recpsctl certs init|issue`: certificates for a cluster
// (common/security/certs.h). docs/security.md.
#ifndef RECPS_CLIENT_ADMIN_CERTS_COMMAND_H_
#define RECPS_CLIENT_ADMIN_CERTS_COMMAND_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace recps::client::admin {

inline constexpr char kCertsSynopsis[] =
    "recpsctl certs init DIR [--cluster=NAME] [--hosts=H1,H2] [--days=N]\n"
    "       recpsctl certs issue --role=ROLE --name=NAME --ca=DIR --out=DIR "
    "[--cluster=NAME] [--hosts=H1,H2] [--days=N]";

inline constexpr char kCertsDetails[] =
    R"(`certs init DIR` creates a CA (DIR/ca.crt, DIR/ca.key) and one certificate
per role, DIR/<role>.crt and DIR/<role>.key for coordinator, shard, worker,
admin and reader. `certs issue` signs one more with the CA in --ca, as
--out/<name>.crt and .key (written by rename, so a daemon watching the files
picks up a whole pair: rotation). Each certificate carries the SAN URI
spiffe://recps/<cluster>/<role>/<name>, which gives its holder its role, and
is valid for localhost, 127.0.0.1 and every --hosts entry (the names and
addresses its holder serves on). Keys are mode 0600. Needs the openssl
command.
  --cluster=NAME  cluster name in the URIs (default local)
  --hosts=H1,H2   more DNS names or IP addresses the certificates name
  --days=N        validity of the certificates (default 365; the CA: 10 years)
  --role=ROLE     issue: worker, shard, coordinator, admin or reader
  --name=NAME     issue: the holder's name ([A-Za-z0-9._-], e.g. worker-3)
  --ca=DIR        issue: the directory `certs init` made
  --out=DIR       issue: where the certificate and key go
)";

// Runs `certs ACTION [DIR]` with the parsed flags; prints what it wrote.
// INVALID_ARGUMENT for usage errors.
absl::Status RunCertsCommand(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& flags);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_CERTS_COMMAND_H_
