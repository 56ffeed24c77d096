#include "common/rpc/tls_flags.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/log.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA(s) that sign every recps certificate; with "
          "--tls_cert and --tls_key turns on mutual TLS (docs/security.md)");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this process's certificate (its SAN URI "
          "spiffe://recps/<cluster>/<role>/<name> gives its role)");
ABSL_FLAG(std::string, tls_key, "",
          "PEM file of the private key of --tls_cert");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(10),
          "how often the TLS files are re-read (rotation without a restart; "
          "1s..1h)");
ABSL_FLAG(bool, insecure, false,
          "plaintext gRPC: no authentication, every caller may call every "
          "RPC. Needed explicitly when no TLS files are given");

namespace recps::rpc {

TlsFlagValues GetTlsFlags() {
  TlsFlagValues v;
  v.ca = absl::GetFlag(FLAGS_tls_ca);
  v.cert = absl::GetFlag(FLAGS_tls_cert);
  v.key = absl::GetFlag(FLAGS_tls_key);
  v.reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  v.insecure = absl::GetFlag(FLAGS_insecure);
  return v;
}

absl::StatusOr<TransportSecurity> SecurityFromFlags() {
  const std::string ca = absl::GetFlag(FLAGS_tls_ca);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const bool insecure = absl::GetFlag(FLAGS_insecure);
  const bool any_tls = !ca.empty() || !cert.empty() || !key.empty();
  if (insecure && any_tls) {
    return absl::InvalidArgumentError(
        "--insecure and --tls_ca/--tls_cert/--tls_key contradict each other: "
        "give one");
  }
  if (insecure) return TransportSecurity::Insecure();
  if (!any_tls) {
    return absl::InvalidArgumentError(
        "no transport security given: pass --tls_ca, --tls_cert and --tls_key "
        "(mutual TLS; `recpsctl certs init DIR` makes them) or --insecure "
        "(plaintext, anyone who reaches the port may call anything)");
  }
  const absl::Duration reload = absl::GetFlag(FLAGS_tls_reload_interval);
  if (reload < absl::Seconds(1) || reload > absl::Hours(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_interval=", absl::FormatDuration(reload),
                     ": must be 1s..1h"));
  }
  TransportSecurity s = TransportSecurity::Tls(ca, cert, key, reload);
  if (absl::Status files = CheckTlsFiles(s); !files.ok()) return files;
  return s;
}

TransportSecurity InitProcessSecurityFromFlags() {
  absl::StatusOr<TransportSecurity> s = SecurityFromFlags();
  if (!s.ok()) {
    LogError(s.status().message());
    std::fflush(nullptr);
    std::exit(2);
  }
  SetProcessSecurity(*s);
  if (s->mode == TransportSecurity::Mode::kInsecure) {
    LogWarning(
        "INSECURE: --insecure given: gRPC is plaintext and every caller "
        "may call every RPC (no roles, no per-client limits)");
  } else {
    LogInfo("mutual TLS: CA ", s->ca_file, ", certificate ", s->cert_file,
            " (re-read every ", absl::FormatDuration(s->reload_interval), ")");
  }
  return *s;
}

}  // namespace recps::rpc
