// The one rule for the parts of a recps identity URI,
// spiffe://recps/<cluster>/<role>/<name>: what `recpsctl certs` issues
// (common/security/certs.cc) and what servers accept
// (common/rpc/identity.cc) cannot drift apart.
#ifndef RECPS_COMMON_IDENTITY_NAME_H_
#define RECPS_COMMON_IDENTITY_NAME_H_

#include "absl/strings/string_view.h"

namespace recps {

// 1..64 characters of [A-Za-z0-9._-].
inline bool ValidIdentityPart(absl::string_view part) {
  if (part.empty() || part.size() > 64) return false;
  for (char c : part) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace recps

#endif  // RECPS_COMMON_IDENTITY_NAME_H_
