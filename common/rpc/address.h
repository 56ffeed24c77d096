// Network addresses as recps takes them from flags and from other processes
// ("host:port"), checked once here: gRPC would quietly wrap a port such as
// 99999, and a member address is echoed in logs and status tables.
#ifndef RECPS_COMMON_RPC_ADDRESS_H_
#define RECPS_COMMON_RPC_ADDRESS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace recps::rpc {

// OK for host:port where host is a DNS name, an IPv4 literal or [IPv6] and
// port is 1..65535; INVALID_ARGUMENT "address '<address>' <why>; expected
// host:port (...)" otherwise (a long address is cut in the message).
absl::Status CheckHostPort(absl::string_view address);

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_ADDRESS_H_
