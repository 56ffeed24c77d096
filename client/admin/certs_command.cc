#include "client/admin/certs_command.h"

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/security/certs.h"

namespace recps::client::admin {
namespace {

std::string Flag(const std::map<std::string, std::string>& flags,
                 const std::string& name) {
  auto it = flags.find(name);
  return it == flags.end() ? "" : it->second;
}

absl::Status OptionsFromFlags(const std::map<std::string, std::string>& flags,
                              security::CertOptions* options) {
  if (const std::string c = Flag(flags, "cluster"); !c.empty())
    options->cluster = c;
  for (absl::string_view h :
       absl::StrSplit(Flag(flags, "hosts"), ',', absl::SkipWhitespace())) {
    options->hosts.emplace_back(h);
  }
  if (const std::string d = Flag(flags, "days"); !d.empty()) {
    if (!absl::SimpleAtoi(d, &options->days)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--days=", d, ": expected a number"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCertsCommand(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& flags) {
  security::CertOptions options;
  if (absl::Status s = OptionsFromFlags(flags, &options); !s.ok()) return s;
  const std::string action = args.empty() ? "" : args[0];
  if (action == "init") {
    if (args.size() != 2) {
      return absl::InvalidArgumentError(
          "certs init takes one directory: certs init DIR");
    }
    for (const char* f : {"role", "name", "ca", "out"}) {
      if (flags.count(f) > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", f, " is for certs issue"));
      }
    }
    if (absl::Status s = security::InitCertDir(args[1], options); !s.ok())
      return s;
    std::cout << "wrote " << args[1]
              << "/ca.crt and ca.key (keep ca.key secret) and, for "
              << "each role, <role>.crt and <role>.key:";
    for (const char* r : security::kRoles) std::cout << " " << r;
    std::cout << "\n";
    return absl::OkStatus();
  }
  if (action == "issue") {
    if (args.size() != 1) {
      return absl::InvalidArgumentError(
          "certs issue takes no directory argument: use --out");
    }
    for (const char* f : {"role", "name", "ca", "out"}) {
      if (Flag(flags, f).empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("certs issue needs --", f));
      }
    }
    const std::string out = Flag(flags, "out");
    const std::string name = Flag(flags, "name");
    if (absl::Status s = security::IssueCert(
            Flag(flags, "ca"), out, Flag(flags, "role"), name, options);
        !s.ok()) {
      return s;
    }
    std::cout << "wrote " << out << "/" << name << ".crt and " << out << "/"
              << name << ".key (spiffe://recps/" << options.cluster << "/"
              << Flag(flags, "role") << "/" << name << ")\n";
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown certs action \"", action, "\" (expected init or issue)"));
}

}  // namespace recps::client::admin
