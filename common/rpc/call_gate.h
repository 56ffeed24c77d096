// The one check at the top of every server handler: may this caller (its
// role, from identity.h) call this RPC, and is it within its per-client
// limits? docs/security.md has the roles table; docs/limits.md the limits.
//
//   absl::StatusOr<rpc::Admission> admission = gate->Admit(*context,
//   "ShardAdmin.Stats"); if (!admission.ok()) return
//   Finish(admission.status());
//   ... keep `admission` alive until the call finishes ...
//
// With plaintext (--insecure) there are no identities: every call is
// allowed and no per-client limit applies.
#ifndef RECPS_COMMON_RPC_CALL_GATE_H_
#define RECPS_COMMON_RPC_CALL_GATE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/identity.h"
#include "grpcpp/server_context.h"

namespace prometheus {
class Registry;
template <typename T>
class Family;
class Counter;
}  // namespace prometheus

namespace recps::rpc {

// The roles that may call `method` ("Service.Method", e.g.
// "ShardAdmin.SetShardMap"): a set of RoleBit()s. Methods the table does not
// know are admin-only. admin may call everything.
uint32_t AllowedRoles(absl::string_view method);
// Every method the table names, for tests and docs.
std::vector<std::pair<std::string, uint32_t>> RolesTable();
// "admin or coordinator".
std::string DescribeRoles(uint32_t roles);

struct CallGateOptions {
  // Most calls one client identity may have in flight at once; more are
  // RESOURCE_EXHAUSTED. 0: no limit.
  int max_calls_per_client = 1024;
  // A client that makes more than this many bad requests (INVALID_ARGUMENT,
  // malformed) within `bad_request_window` is refused (UNAVAILABLE) for
  // `bad_request_penalty`. 0: never refused.
  int max_bad_requests = 100;
  absl::Duration bad_request_window = absl::Seconds(10);
  absl::Duration bad_request_penalty = absl::Seconds(30);
};

class CallGate;

// An admitted call: holds its slot of the caller's concurrency limit until
// destroyed. Movable.
class Admission {
 public:
  Admission() = default;
  Admission(Admission&& other) noexcept { *this = std::move(other); }
  Admission& operator=(Admission&& other) noexcept;
  ~Admission();

  const PeerIdentity& peer() const { return peer_; }
  // Counts the call as a bad request of its client (see CallGateOptions).
  void NoteBadRequest();
  // Role check for an action inside an allowed RPC (e.g. a lookup that
  // creates rows): PERMISSION_DENIED "<what> needs <roles>" unless the
  // caller has one of `roles` (always OK with plaintext). Counted like a
  // refused RPC.
  absl::Status Require(uint32_t roles, absl::string_view what) const;
  // A worker certificate bound to ranks by its name (identity.h
  // BoundRanks) may act only for those: PERMISSION_DENIED "<uri> may act
  // for rank 1 only, not rank 0 (<what>)" otherwise, counted like a refused
  // RPC. OK for unbound and non-worker certificates, and with plaintext.
  absl::Status CheckRank(int64_t rank, absl::string_view what) const;
  // Whether the call runs under mutual TLS with roles enforced.
  bool enforced() const;
  // "<uri> at <peer host>": the client its per-client limits count ("" with
  // plaintext).
  const std::string& client_key() const { return client_key_; }

 private:
  friend class CallGate;
  struct Client {
    int in_flight = 0;
    int64_t bad_in_window = 0;
    absl::Time window_start = absl::InfinitePast();
    absl::Time refused_until = absl::InfinitePast();
  };
  CallGate* gate_ = nullptr;
  Client* client_ = nullptr;  // null: not counted (plaintext or no limit)
  PeerIdentity peer_;
  std::string method_;
  // "<uri> at <peer address>": the client its limits count.
  std::string client_key_;
};

class CallGate {
 public:
  // `enforce`: the server runs mutual TLS (else every call is allowed).
  // `registry` may be null (no metrics).
  // `cluster`: callers of another cluster are refused ("": any).
  CallGate(bool enforce, CallGateOptions options,
           prometheus::Registry* registry, std::string cluster = "");
  // For the process's security (rpc::Resolve of the default).
  CallGate(CallGateOptions options, prometheus::Registry* registry);
  ~CallGate();
  CallGate(const CallGate&) = delete;
  CallGate& operator=(const CallGate&) = delete;

  // PERMISSION_DENIED "role 'reader' may not call ShardAdmin.SetShardMap
  // (needs admin or coordinator)"; UNAUTHENTICATED for a certificate with no
  // recps role or of another cluster than this server's own certificate; RESOURCE_EXHAUSTED naming --max_calls_per_client;
  // UNAVAILABLE while the client is refused for bad requests (says for how
  // much longer).
  absl::StatusOr<Admission> Admit(const grpc::ServerContextBase& context,
                                  absl::string_view method);

  // The role and cluster checks of Admit alone, for a call's headers:
  // what ServerCredentials(security, gate) runs when a call arrives, before
  // its message is read, so that a caller may not make the server buffer a
  // message of a method its role may not call. `method` as for Admit.
  absl::Status CheckRole(const PeerIdentity& peer, absl::string_view method);

  bool enforcing() const { return enforce_; }
  const CallGateOptions& options() const { return options_; }

 private:
  friend class Admission;
  void Release(Admission::Client* client);
  void NoteBad(Admission::Client* client, const std::string& key);
  void CountDenied(absl::string_view method, Role role, absl::string_view why);
  void CountLimited(absl::string_view method, const char* reason);

  const bool enforce_;
  const CallGateOptions options_;
  // This server's cluster (its own certificate's); "": not checked.
  const std::string cluster_;
  prometheus::Family<prometheus::Counter>* denied_ = nullptr;
  prometheus::Family<prometheus::Counter>* limited_ = nullptr;
  absl::Mutex mu_;
  // Node map: Admissions point at their Client.
  absl::node_hash_map<std::string, Admission::Client> clients_
      ABSL_GUARDED_BY(mu_);
  absl::Time last_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t logs_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace recps::rpc

#endif  // RECPS_COMMON_RPC_CALL_GATE_H_
