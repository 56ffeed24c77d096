#include "common/rpc/address.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace recps::rpc {
namespace {

bool IsDnsName(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (absl::string_view label : absl::StrSplit(host, '.')) {
    if (label.empty() || label.size() > 63 || label.front() == '-' ||
        label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
  }
  return true;
}

bool IsIpv6Literal(absl::string_view host) {
  if (host.size() < 2 || host.size() > 47) return false;
  int colons = 0;
  for (char c : host) {
    if (c == ':') {
      ++colons;
    } else if (!absl::ascii_isxdigit(static_cast<unsigned char>(c)) && c != '.') {
      return false;
    }
  }
  return colons >= 2;
}

}  // namespace

absl::Status CheckHostPort(absl::string_view address) {
  auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "address '", address.substr(0, 64), address.size() > 64 ? "..." : "",
        "' ", why, "; expected host:port (a DNS name, an IPv4 literal or [IPv6]; "
        "port 1..65535)"));
  };
  if (address.size() > 261) return invalid("is longer than 261 bytes");
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return invalid("has no port");
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  uint32_t port_number = 0;
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(),
                   [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); }) ||
      !absl::SimpleAtoi(port, &port_number) || port_number < 1 || port_number > 65535) {
    return invalid(absl::StrCat("has port '", port.substr(0, 16), "', not 1..65535"));
  }
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    if (!IsIpv6Literal(host.substr(1, host.size() - 2))) {
      return invalid("has a malformed IPv6 literal");
    }
    return absl::OkStatus();
  }
  // A DNS name also covers IPv4 literals (digits and dots).
  if (!IsDnsName(host)) {
    return invalid("has a host that is neither a DNS name nor an IP literal");
  }
  return absl::OkStatus();
}

}  // namespace recps::rpc
