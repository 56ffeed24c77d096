// The transport-security flags every recps daemon shares (--tls_ca,
// --tls_cert, --tls_key, --tls_reload_interval, --insecure), defined once
// here. docs/security.md.
#ifndef RECPS_COMMON_RPC_TLS_FLAGS_H_
#define RECPS_COMMON_RPC_TLS_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/channels.h"

namespace recps::rpc {

// The flags as given, for launchers that pass them on to their children.
struct TlsFlagValues {
  std::string ca;
  std::string cert;
  std::string key;
  absl::Duration reload_interval;
  bool insecure = false;
};
TlsFlagValues GetTlsFlags();

// The security the flags ask for. INVALID_ARGUMENT naming the flags when
// neither TLS nor --insecure is given, when both are, when only some of
// the three files are, or when a file is unreadable or not PEM.
absl::StatusOr<TransportSecurity> SecurityFromFlags();

// SecurityFromFlags, then SetProcessSecurity, and one log line saying what
// the process runs with (a WARNING for plaintext). On error: logs it and
// exits with code 2, as the daemons do for bad flags.
TransportSecurity InitProcessSecurityFromFlags();

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_TLS_FLAGS_H_
