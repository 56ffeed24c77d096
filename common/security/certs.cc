#include "common/security/certs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/identity_name.h"
#include "common/status_macros.h"

namespace recps::security {
namespace {

namespace fs = std::filesystem;

// Runs openssl with `args` (no shell); its stderr becomes the error.
absl::Status RunOpenssl(const std::vector<std::string>& args) {
  char err_path[] = "/tmp/recps-openssl-XXXXXX";
  const int err_fd = mkstemp(err_path);
  if (err_fd < 0)
    return absl::InternalError("cannot create a temporary file in /tmp");
  unlink(err_path);
  const pid_t pid = fork();
  if (pid < 0) {
    close(err_fd);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    dup2(err_fd, 2);
    const int null_fd = open("/dev/null", O_RDWR);
    if (null_fd >= 0) {
      dup2(null_fd, 0);
      dup2(null_fd, 1);
    }
    std::vector<char*> argv;
    std::string name = "openssl";
    argv.push_back(name.data());
    std::vector<std::string> copy = args;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp("openssl", argv.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::string err;
  lseek(err_fd, 0, SEEK_SET);
  char buf[4096];
  for (ssize_t n; (n = read(err_fd, buf, sizeof(buf))) > 0;) err.append(buf, n);
  close(err_fd);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    return absl::FailedPreconditionError(
        "the openssl command is not installed (Debian: apt-get install "
        "openssl; "
        "scripts/install-deps.sh installs it)");
  }
  if (err.size() > 2000) err = err.substr(0, 2000) + "...";
  return absl::InternalError(
      absl::StrCat("openssl ", args.empty() ? "" : args[0], " failed: ", err));
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::string RandomSerial() {
  std::random_device rd;
  // 63 bits: positive, as RFC 5280 wants.
  const uint64_t v = ((uint64_t{rd()} << 32) | rd()) & 0x7fffffffffffffffULL;
  return absl::StrFormat("0x%016x", v | 1);
}

bool LooksLikeIp(const std::string& host) {
  if (host.find(':') != std::string::npos) return true;  // IPv6
  for (char c : host) {
    if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
  }
  return !host.empty();
}

absl::Status CheckOptions(const CertOptions& o) {
  if (!ValidIdentityPart(o.cluster)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--cluster=", o.cluster, ": must be 1..64 of [A-Za-z0-9._-]"));
  }
  for (const std::string& h : o.hosts) {
    if (h.empty() || h.size() > 253 ||
        h.find_first_of(",\n\r=/ ") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--hosts: \"", h, "\" is not a host name or address"));
    }
  }
  if (o.days < 0 || o.days > 36500) {
    return absl::InvalidArgumentError(
        absl::StrCat("--days=", o.days, ": must be 0..36500"));
  }
  return absl::OkStatus();
}

// The role and name a certificate is issued for, and the CA it is signed
// with (ca.crt and ca.key in `ca_dir`).
absl::Status CheckIssue(const std::string& ca_dir, const std::string& role,
                        const std::string& name) {
  bool known = false;
  for (const char* r : kRoles) known = known || role == r;
  if (!known) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--role=", role, ": expected ", absl::StrJoin(kRoles, ", ")));
  }
  if (!ValidIdentityPart(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--name=", name, ": must be 1..64 of [A-Za-z0-9._-]"));
  }
  for (const std::string& f : {ca_dir + "/ca.crt", ca_dir + "/ca.key"}) {
    if (!fs::exists(f)) {
      return absl::NotFoundError(
          absl::StrCat(f,
                       " does not exist: --ca must be a directory made by "
                       "`recpsctl certs init`"));
    }
  }
  return absl::OkStatus();
}

// The certificate's subject alternative names: its SPIFFE identity, then
// the hosts (localhost first unless options.no_local_hosts).
std::vector<std::string> SubjectAltNames(const std::string& role,
                                         const std::string& name,
                                         const CertOptions& options) {
  std::vector<std::string> sans = {absl::StrCat(
      "URI:spiffe://recps/", options.cluster, "/", role, "/", name)};
  std::vector<std::string> hosts = options.hosts;
  if (!options.no_local_hosts) {
    hosts.insert(hosts.begin(), {"localhost", "127.0.0.1"});
  }
  for (const std::string& h : hosts)
    sans.push_back((LooksLikeIp(h) ? "IP:" : "DNS:") + h);
  return sans;
}

// A new key (key.pem) and its certificate signed by the CA in `ca_dir`
// (cert.pem), written into the directory `tmp`.
absl::Status SignLeaf(const std::string& ca_dir, const std::string& tmp,
                      const std::string& role, const std::string& name,
                      const CertOptions& options) {
  const std::string ext = tmp + "/ext.cnf";
  const std::string key = tmp + "/key.pem";
  const std::string csr = tmp + "/req.csr";
  RETURN_IF_ERROR(WriteFile(
      ext,
      absl::StrCat("[v3_leaf]\n"
                   "basicConstraints = critical, CA:FALSE\n"
                   "keyUsage = critical, digitalSignature, keyEncipherment\n"
                   "extendedKeyUsage = serverAuth, clientAuth\n"
                   "subjectAltName = ",
                   absl::StrJoin(SubjectAltNames(role, name, options), ", "),
                   "\n")));
  RETURN_IF_ERROR(RunOpenssl(
      {"req", "-new", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", csr,
       "-subj",
       absl::StrCat("/O=recps ", options.cluster, "/CN=", role, " ", name)}));
  RETURN_IF_ERROR(RunOpenssl(
      {"x509", "-req", "-in", csr, "-CA", ca_dir + "/ca.crt", "-CAkey",
       ca_dir + "/ca.key", "-set_serial", RandomSerial(), "-days",
       absl::StrCat(options.days), "-extfile", ext, "-extensions", "v3_leaf",
       "-out", tmp + "/cert.pem"}));
  if (chmod(key.c_str(), 0600) != 0) {
    return absl::InternalError(absl::StrCat("cannot chmod 0600 ", key));
  }
  return absl::OkStatus();
}

// Moves the key and certificate SignLeaf wrote into `tmp` to
// `out_dir`/name.key and name.crt, and copies ca.crt there if missing.
absl::Status InstallLeaf(const std::string& ca_dir, const std::string& tmp,
                         const std::string& out_dir, const std::string& name) {
  std::error_code ec;
  // Key first: a watcher that sees the new certificate finds its key.
  fs::rename(tmp + "/key.pem", absl::StrCat(out_dir, "/", name, ".key"), ec);
  if (!ec) {
    fs::rename(tmp + "/cert.pem", absl::StrCat(out_dir, "/", name, ".crt"), ec);
  }
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot write into ", out_dir, ": ", ec.message()));
  }
  if (!fs::exists(out_dir + "/ca.crt")) {
    fs::copy_file(ca_dir + "/ca.crt", out_dir + "/ca.crt", ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot copy ca.crt: ", ec.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckOpenssl() { return RunOpenssl({"version"}); }

absl::Status IssueCert(const std::string& ca_dir, const std::string& out_dir,
                       const std::string& role, const std::string& name,
                       const CertOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  RETURN_IF_ERROR(CheckIssue(ca_dir, role, name));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  // Work in a temporary directory next to the outputs; rename at the end.
  const std::string tmp =
      absl::StrCat(out_dir, "/.issue-", name, "-", getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create ", tmp, ": ", ec.message()));
  chmod(tmp.c_str(), 0700);
  absl::Status s = SignLeaf(ca_dir, tmp, role, name, options);
  if (s.ok()) s = InstallLeaf(ca_dir, tmp, out_dir, name);
  fs::remove_all(tmp, ec);
  return s;
}

absl::Status InitCertDir(const std::string& dir, const CertOptions& options) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  if (absl::Status s = CheckOpenssl(); !s.ok()) return s;
  if (fs::exists(dir + "/ca.key")) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir,
        "/ca.key exists: certs init never overwrites a CA (use `recpsctl certs "
        "issue --ca=",
        dir, "` for more certificates, or another directory)"));
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", ec.message()));
  chmod(dir.c_str(), 0700);
  // Our own config, so the system's openssl.cnf cannot change the CA.
  const std::string cnf = dir + "/.ca.cnf";
  absl::Status s = WriteFile(
      cnf, absl::StrCat(
               "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nO = recps ",
               options.cluster, "\nCN = recps ", options.cluster,
               " CA\n[v3_ca]\n"
               "basicConstraints = critical, CA:TRUE\n"
               "keyUsage = critical, keyCertSign, cRLSign\n"
               "subjectKeyIdentifier = hash\n"));
  const std::string ca_key = dir + "/ca.key";
  if (s.ok()) {
    s = RunOpenssl({"req",
                    "-x509",
                    "-new",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-keyout",
                    ca_key,
                    "-out",
                    dir + "/ca.crt",
                    "-config",
                    cnf,
                    "-extensions",
                    "v3_ca",
                    "-days",
                    absl::StrCat(std::max(options.days, 3650)),
                    "-set_serial",
                    RandomSerial()});
  }
  fs::remove(cnf, ec);
  if (s.ok() && chmod(ca_key.c_str(), 0600) != 0) {
    s = absl::InternalError(absl::StrCat("cannot chmod 0600 ", ca_key));
  }
  for (const char* role : kRoles) {
    if (!s.ok()) break;
    s = IssueCert(dir, dir, role, role, options);
  }
  return s;
}

}  // namespace recps::security
