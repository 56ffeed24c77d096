// recpsctl: the admin CLI. Asks a running cluster (through its coordinator,
// or shard servers directly) what it holds and how it is doing, and runs
// the sharding planner offline. Tables for people, --json for scripts. See
// docs/admin-cli.md.
//
// Flags are parsed here rather than with absl flags: every subcommand has
// its own flags and --help, and the exit codes below must hold for usage
// errors too (absl's parser exits with 1).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/admin/checkpoint_commands.h"
#include "client/admin/command_line.h"
#include "client/admin/checkpoint_file_commands.h"
#include "client/admin/rebalance_commands.h"
#include "client/admin/cluster_reader.h"
#include "client/admin/certs_command.h"
#include "client/admin/cluster_report.h"
#include "client/admin/report_text.h"
#include "common/rpc/address.h"
#include "common/rpc/channels.h"
#include "common/status_macros.h"
#include "common/config/text_proto.h"
#include "recps/v1/job.pb.h"
#include "recps/v1/plan.pb.h"
#include "server/planner/planner.h"

namespace recps::client::admin {
namespace {

// Bounds of the count and size flags: the planner's work and memory grow
// with the servers, and a typo must not make recpsctl run for minutes.
constexpr int64_t kMaxPlanServers = 4096;
constexpr int64_t kMaxPlanWorkers = 65536;
constexpr int64_t kMaxPlanBatchSize = int64_t{1} << 24;
int UsageError(const ParsedArgs* parsed, const absl::Status& status) {
  std::cerr << "recpsctl: " << status.message() << "\n";
  if (parsed != nullptr && parsed->command != nullptr) {
    std::cerr << "Run 'recpsctl " << parsed->command->name
              << " --help' for usage.\n";
  } else {
    std::cerr << "Run 'recpsctl --help' for usage.\n";
  }
  return kExitUsage;
}

int Error(const absl::Status& status) {
  std::cerr << "recpsctl: " << status.message() << "\n";
  // A plaintext client closed by a TLS server, or a failed handshake.
  const absl::string_view m = status.message();
  if (absl::StrContains(m, "Socket closed") || absl::StrContains(m, "andshake") ||
      absl::StrContains(m, "SSL")) {
    std::cerr << "recpsctl: (does the cluster run mutual TLS and recpsctl not, or the "
                 "reverse, or is the certificate of another CA, expired, or not for "
                 "that host? docs/security.md#troubleshooting)\n";
  }
  return kExitError;
}

// Prints `message` as JSON or `text`; returns `code` (or an error).
int Print(const ParsedArgs& parsed, const google::protobuf::Message& message,
          const std::string& text, int code) {
  if (BoolFlag(parsed, "json")) {
    absl::StatusOr<std::string> json = ToJson(message);
    if (!json.ok()) return Error(json.status());
    std::cout << *json;
    if (json->empty() || json->back() != '\n') std::cout << "\n";
  } else {
    std::cout << text;
  }
  std::cout.flush();
  return code;
}

// --tls_* (else $RECPS_TLS_*) or --insecure; a usage error naming them
// when there is neither.
absl::StatusOr<rpc::TransportSecurity> SecurityFromFlags(const ParsedArgs& parsed) {
  std::string files[3];
  const char* names[3] = {"tls_ca", "tls_cert", "tls_key"};
  const char* envs[3] = {"RECPS_TLS_CA", "RECPS_TLS_CERT", "RECPS_TLS_KEY"};
  bool any_flag = false;
  for (int i = 0; i < 3; ++i) {
    if (auto it = parsed.flags.find(names[i]); it != parsed.flags.end()) {
      files[i] = it->second;
      any_flag = true;
    }
  }
  const bool insecure = BoolFlag(parsed, "insecure");
  if (insecure && any_flag) {
    return absl::InvalidArgumentError("give --insecure or --tls_*, not both");
  }
  if (insecure) return rpc::TransportSecurity::Insecure();
  if (!any_flag) {
    for (int i = 0; i < 3; ++i) {
      if (const char* env = std::getenv(envs[i]); env != nullptr) files[i] = env;
    }
  }
  if (files[0].empty() && files[1].empty() && files[2].empty()) {
    return absl::InvalidArgumentError(
        "no transport security given: pass --tls_ca, --tls_cert and --tls_key (or set "
        "RECPS_TLS_CA, RECPS_TLS_CERT and RECPS_TLS_KEY) for a mutual-TLS cluster, or "
        "--insecure for one started with --insecure");
  }
  rpc::TransportSecurity security = rpc::TransportSecurity::Tls(files[0], files[1], files[2]);
  RETURN_IF_ERROR(rpc::CheckTlsFiles(security));
  return security;
}

// The process's security from the connection flags, for the commands
// that talk to the coordinator through CoordinatorClient (its channels
// take the process's security).
absl::Status UseSecurityFromFlags(const ParsedArgs& parsed) {
  ASSIGN_OR_RETURN(const rpc::TransportSecurity security, SecurityFromFlags(parsed));
  rpc::SetProcessSecurity(security);
  return absl::OkStatus();
}

// The reader for the connection flags; a usage error's message otherwise.
absl::StatusOr<std::unique_ptr<ClusterReader>> ReaderFromFlags(
    const ParsedArgs& parsed) {
  ClusterReaderOptions options;
  options.servers = parsed.servers;
  // $RECPS_COORDINATOR is not read when --server names the servers.
  ASSIGN_OR_RETURN(options.coordinator, CoordinatorAddress(parsed, options.servers.empty()));
  if (!options.coordinator.empty() && !options.servers.empty()) {
    return absl::InvalidArgumentError("give --coordinator or --server, not both");
  }
  if (options.servers.size() > static_cast<size_t>(kMaxPlanServers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--server lists ", options.servers.size(), " servers, the limit is ",
        kMaxPlanServers));
  }
  for (const std::string& server : options.servers) {
    RETURN_IF_ERROR(CheckAddressFlag("--server", server));
  }
  if (options.coordinator.empty() && options.servers.empty()) {
    return absl::InvalidArgumentError(
        "where is the cluster? Give --coordinator=HOST:PORT "
        "(or set RECPS_COORDINATOR) or --server=HOST:PORT");
  }
  ASSIGN_OR_RETURN(const absl::Duration timeout,
                   DurationFlag(parsed, "timeout", absl::Seconds(5)));
  if (timeout == absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--timeout must be positive");
  }
  options.rpc_timeout = timeout;
  ASSIGN_OR_RETURN(options.security, SecurityFromFlags(parsed));
  return ClusterReader::Create(std::move(options));
}

int RunMembers(const ParsedArgs& parsed) {
  if (parsed.args[0] != "forget") {
    return UsageError(&parsed, absl::InvalidArgumentError(absl::StrCat(
                                   "unknown members action \"", parsed.args[0],
                                   "\" (expected forget)")));
  }
  if (!parsed.servers.empty()) {
    return UsageError(&parsed, absl::InvalidArgumentError(
                                   "members forget asks the coordinator: give "
                                   "--coordinator, not --server"));
  }
  absl::StatusOr<std::unique_ptr<ClusterReader>> reader = ReaderFromFlags(parsed);
  if (!reader.ok()) return UsageError(&parsed, reader.status());
  absl::StatusOr<v1::Member> member = (*reader)->ForgetMember(parsed.args[1]);
  if (!member.ok()) return Error(member.status());
  const std::string text = absl::StrCat(
      "forgot ", member->member_id(), " (",
      member->role() == v1::WORKER ? absl::StrCat("worker rank ", member->rank())
                                   : absl::StrCat("shard server at ", member->address()),
      ", ", member->state() == v1::EXPIRED ? "expired" : "left", ")\n");
  return Print(parsed, *member, text, kExitOk);
}

int RunCheckpointCommand(const ParsedArgs& parsed) {
  if (parsed.command->name == "checkpoint" && parsed.args[0] != "now") {
    return UsageError(&parsed, absl::InvalidArgumentError(absl::StrCat(
                                   "unknown checkpoint action \"", parsed.args[0],
                                   "\" (expected now or compact)")));
  }
  if (!parsed.servers.empty()) {
    return UsageError(&parsed, absl::InvalidArgumentError(
                                   "checkpoints are the coordinator's: give "
                                   "--coordinator, not --server"));
  }
  CheckpointCommandOptions options;
  absl::StatusOr<std::string> coordinator = RequiredCoordinatorAddress(parsed);
  if (!coordinator.ok()) return UsageError(&parsed, coordinator.status());
  options.coordinator = *std::move(coordinator);
  options.json = BoolFlag(parsed, "json");
  options.wait = BoolFlag(parsed, "wait");
  if (auto it = parsed.flags.find("reason"); it != parsed.flags.end()) {
    options.reason = it->second;
  }
  absl::StatusOr<absl::Duration> timeout = DurationFlag(
      parsed, "timeout", options.wait ? absl::Minutes(10) : absl::Seconds(5));
  if (!timeout.ok()) return UsageError(&parsed, timeout.status());
  if (options.wait) {
    options.wait_timeout = *timeout;
    options.rpc_timeout = std::min(*timeout, absl::Seconds(5));
  } else {
    options.rpc_timeout = *timeout;
  }
  if (absl::Status s = UseSecurityFromFlags(parsed); !s.ok()) return UsageError(&parsed, s);
  if (parsed.command->name == "checkpoint") {
    return RunCheckpointNow(options, std::cout, std::cerr);
  }
  return RunCheckpointList(options, std::cout, std::cerr);
}

absl::StatusOr<int64_t> ParseBytes(const std::string& text);

int RunRebalanceCommand(const ParsedArgs& parsed) {
  if (!parsed.servers.empty()) {
    return UsageError(&parsed, absl::InvalidArgumentError(
                                   "rebalancing is the coordinator's: give "
                                   "--coordinator, not --server"));
  }
  RebalanceCommandOptions options;
  absl::StatusOr<std::string> coordinator = RequiredCoordinatorAddress(parsed);
  if (!coordinator.ok()) return UsageError(&parsed, coordinator.status());
  options.coordinator = *std::move(coordinator);
  options.json = BoolFlag(parsed, "json");
  options.apply = BoolFlag(parsed, "apply");
  auto bytes_flag = [&](const char* name, int64_t* out) -> absl::Status {
    auto it = parsed.flags.find(name);
    if (it == parsed.flags.end()) return absl::OkStatus();
    absl::StatusOr<int64_t> v = ParseBytes(it->second);
    if (!v.ok() || *v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, "=", it->second, ": expected bytes >= 0 (64GiB, 512MiB, 1e9, 4096)"));
    }
    *out = *v;
    return absl::OkStatus();
  };
  if (absl::Status s = bytes_flag("max_bytes", &options.max_bytes); !s.ok()) {
    return UsageError(&parsed, s);
  }
  if (absl::Status s = bytes_flag("max_bytes_per_second", &options.max_bytes_per_second);
      !s.ok()) {
    return UsageError(&parsed, s);
  }
  if (auto it = parsed.flags.find("max_moves"); it != parsed.flags.end()) {
    if (!absl::SimpleAtoi(it->second, &options.max_moves) || options.max_moves < 0) {
      return UsageError(&parsed, absl::InvalidArgumentError(absl::StrCat(
                                     "--max_moves=", it->second,
                                     ": expected a count >= 0 (0: no bound)")));
    }
  }
  absl::StatusOr<absl::Duration> timeout =
      DurationFlag(parsed, "timeout", options.apply ? absl::Hours(1) : absl::Seconds(30));
  if (!timeout.ok()) return UsageError(&parsed, timeout.status());
  if (options.apply) {
    options.wait_timeout = *timeout;
    options.rpc_timeout = std::min(*timeout, absl::Seconds(30));
  } else {
    options.rpc_timeout = *timeout;
  }
  if (absl::Status s = UseSecurityFromFlags(parsed); !s.ok()) return UsageError(&parsed, s);
  if (parsed.command->name == "drain") options.drain.push_back(parsed.args[0]);
  if (parsed.command->name == "moves") return RunMoves(options, std::cout, std::cerr);
  return RunRebalance(options, std::cout, std::cerr);
}

int RunClusterCommand(const ParsedArgs& parsed) {
  absl::StatusOr<std::unique_ptr<ClusterReader>> reader = ReaderFromFlags(parsed);
  if (!reader.ok()) return UsageError(&parsed, reader.status());
  absl::StatusOr<absl::Duration> interval =
      DurationFlag(parsed, "interval", absl::Seconds(1));
  if (!interval.ok()) return UsageError(&parsed, interval.status());

  const std::string& command = parsed.command->name;
  const bool per_slot = BoolFlag(parsed, "slots");
  absl::StatusOr<ClusterSnapshot> snapshot = (*reader)->Read(per_slot);
  if (!snapshot.ok()) return Error(snapshot.status());

  if (command == "status") {
    std::optional<ClusterSnapshot> first;
    if (*interval > absl::ZeroDuration()) {
      first = *std::move(snapshot);
      absl::SleepFor(*interval);
      snapshot = (*reader)->Read(false);
      if (!snapshot.ok()) return Error(snapshot.status());
    }
    const v1::ClusterStatus status =
        BuildClusterStatus(first ? &*first : nullptr, *snapshot);
    return Print(parsed, status, FormatClusterStatus(status),
                 status.healthy() ? kExitOk : kExitUnhealthy);
  }
  if (command == "tables") {
    const v1::TablesReport report = BuildTablesReport(*snapshot);
    return Print(parsed, report, FormatTablesReport(report),
                 report.unreachable().empty() ? kExitOk : kExitUnhealthy);
  }
  // shards
  const v1::ShardsReport report = BuildShardsReport(*snapshot);
  bool all_answered = true;
  for (const v1::ServerShards& s : report.servers())
    all_answered &= s.error().empty();
  return Print(parsed, report, FormatShardsReport(report, per_slot),
               all_answered ? kExitOk : kExitUnhealthy);
}

// "64GiB", "512MiB", "10G", "1.5e9", "4096": bytes.
absl::StatusOr<int64_t> ParseBytes(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"KiB", 1024.0},
      {"MiB", 1024.0 * 1024},
      {"GiB", 1024.0 * 1024 * 1024},
      {"TiB", 1024.0 * 1024 * 1024 * 1024},
      {"K", 1e3},
      {"M", 1e6},
      {"G", 1e9},
      {"T", 1e12},
      {"KB", 1e3},
      {"MB", 1e6},
      {"GB", 1e9},
      {"TB", 1e12},
      {"B", 1}};
  std::string number = text;
  double scale = 1;
  for (const auto& [unit, factor] : kUnits) {
    if (absl::EndsWith(text, unit) && text.size() > strlen(unit)) {
      const std::string head = text.substr(0, text.size() - strlen(unit));
      double unused;
      if (absl::SimpleAtod(head, &unused)) {
        number = head;
        scale = factor;
        break;
      }
    }
  }
  double value;
  if (!absl::SimpleAtod(number, &value) || value <= 0 || value * scale > 9e18) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\": expected a size such as 64GiB, 512MiB or 1e9"));
  }
  return static_cast<int64_t>(value * scale);
}

// 0 when the flag is absent.
absl::StatusOr<int64_t> PositiveIntFlag(const ParsedArgs& parsed,
                                        const std::string& name, int64_t limit) {
  auto it = parsed.flags.find(name);
  if (it == parsed.flags.end()) return 0;
  int64_t v;
  if (!absl::SimpleAtoi(it->second, &v) || v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "=", it->second, ": expected a positive integer"));
  }
  if (v > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", it->second, ": the limit is ", limit));
  }
  return v;
}

// The spec with the flags applied: --servers expands the spec's entry
// without an address (or an empty one) into N named servers; --memory,
// --device, --workers and --batch_size override every server's or the
// topology's value.
absl::StatusOr<v1::PlanSpec> PlanSpecFromFlags(const ParsedArgs& parsed,
                                               const v1::JobConfig& job) {
  v1::PlanSpec spec;
  if (auto it = parsed.flags.find("spec"); it != parsed.flags.end()) {
    RETURN_IF_ERROR(ReadTextProto(it->second, &spec));
  }
  v1::Topology* topo = spec.mutable_topology();
  ASSIGN_OR_RETURN(const int64_t servers,
                   PositiveIntFlag(parsed, "servers", kMaxPlanServers));
  if (servers > 0) {
    v1::ServerSpec like;
    for (const v1::ServerSpec& s : topo->servers()) {
      if (s.address().empty()) like = s;
    }
    topo->clear_servers();
    for (int64_t i = 0; i < servers; ++i) {
      v1::ServerSpec* s = topo->add_servers();
      *s = like;
      s->set_address(absl::StrCat("server-", i));
    }
  }
  if (topo->servers_size() == 0) {
    return absl::InvalidArgumentError(
        "how many shard servers? Give --servers=N (or servers in --spec)");
  }
  if (topo->servers_size() > kMaxPlanServers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the spec lists ", topo->servers_size(), " servers, the limit is ",
        kMaxPlanServers));
  }
  for (const v1::ServerSpec& s : topo->servers()) {
    if (s.address().empty()) {
      return absl::InvalidArgumentError(
          "the spec's servers entry without an address is a template: give "
          "--servers=N to say how many servers it stands for");
    }
  }
  if (auto it = parsed.flags.find("memory"); it != parsed.flags.end()) {
    ASSIGN_OR_RETURN(const int64_t bytes, ParseBytes(it->second));
    for (v1::ServerSpec& s : *topo->mutable_servers())
      s.set_memory_bytes(bytes);
  }
  if (auto it = parsed.flags.find("device"); it != parsed.flags.end()) {
    if (it->second != "cpu" && it->second != "gpu") {
      return absl::InvalidArgumentError(
          absl::StrCat("--device=", it->second, ": expected cpu or gpu"));
    }
    for (v1::ServerSpec& s : *topo->mutable_servers()) {
      s.set_device(it->second == "gpu" ? v1::GPU : v1::CPU);
    }
  }
  for (const v1::ServerSpec& s : topo->servers()) {
    if (s.memory_bytes() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("how much memory does ", s.address(),
                       " have? Give --memory=BYTES "
                       "(or memory_bytes in --spec)"));
    }
  }
  ASSIGN_OR_RETURN(const int64_t workers,
                   PositiveIntFlag(parsed, "workers", kMaxPlanWorkers));
  if (workers > 0) topo->set_num_workers(static_cast<int32_t>(workers));
  if (topo->num_workers() == 0) topo->set_num_workers(1);
  ASSIGN_OR_RETURN(const int64_t batch,
                   PositiveIntFlag(parsed, "batch_size", kMaxPlanBatchSize));
  if (batch > 0) topo->set_batch_size(batch);
  if (topo->batch_size() == 0)
    topo->set_batch_size(job.training().batch_size());
  return spec;
}

int RunPlan(const ParsedArgs& parsed) {
  v1::JobConfig job;
  if (absl::Status s = ReadTextProto(parsed.args[0], &job); !s.ok()) {
    return UsageError(&parsed, s);
  }
  absl::StatusOr<v1::PlanSpec> spec = PlanSpecFromFlags(parsed, job);
  if (!spec.ok()) return UsageError(&parsed, spec.status());
  absl::StatusOr<v1::ShardingPlan> plan =
      planner::PlanSharding(planner::PlannerInputFromJob(job, *spec));
  if (absl::IsInvalidArgument(plan.status()))
    return UsageError(&parsed, plan.status());
  if (!plan.ok()) return Error(plan.status());
  std::string text = planner::FormatPlan(*plan);
  // Whether the data plane can serve it as a shard map.
  if (absl::Status s = planner::PlanToShardMap(*plan, 1).status(); !s.ok()) {
    text += absl::StrCat(
        "\nnote: planned only, the shard servers cannot serve "
        "this plan yet: ",
        s.message(), "\n");
  }
  return Print(parsed, *plan, text, kExitOk);
}

// `checkpoint compact` and `export` (client/admin/checkpoint_file_commands.h).
int RunOfflineCheckpointCommand(const ParsedArgs& parsed) {
  auto flag = [&](const std::string& name) -> std::string {
    auto it = parsed.flags.find(name);
    return it == parsed.flags.end() ? "" : it->second;
  };
  absl::StatusOr<OfflineResult> result;
  if (parsed.command->name == "checkpoint") {
    if (parsed.args[0] != "compact") {
      return UsageError(&parsed, absl::InvalidArgumentError(absl::StrCat(
                                     "unknown checkpoint command \"",
                                     parsed.args[0], "\"")));
    }
    if (flag("dir").empty()) {
      return UsageError(&parsed, absl::InvalidArgumentError("--dir is required"));
    }
    std::optional<uint64_t> step;
    if (!flag("step").empty()) {
      uint64_t v = 0;
      if (!absl::SimpleAtoi(flag("step"), &v)) {
        return UsageError(&parsed, absl::InvalidArgumentError(absl::StrCat(
                                       "--step=", flag("step"),
                                       ": expected a step number")));
      }
      step = v;
    }
    result = CompactCheckpoint(flag("dir"), step);
  } else {
    if (flag("dir").empty() || flag("table").empty()) {
      return UsageError(&parsed, absl::InvalidArgumentError(
                                     "--dir and --table are required"));
    }
    result = ExportCheckpointTable(flag("dir"), flag("table"), parsed.args[0]);
  }
  if (absl::IsInvalidArgument(result.status())) {
    return UsageError(&parsed, result.status());
  }
  if (!result.ok()) return Error(result.status());
  std::cout << (BoolFlag(parsed, "json") ? result->json : result->text);
  std::cout.flush();
  return kExitOk;
}

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) {
    // Point at the command's help when the command itself was recognised.
    ParsedArgs hint;
    for (int i = 1; i < argc && hint.command == nullptr; ++i) {
      hint.command = FindCommand(argv[i]);
    }
    return UsageError(&hint, parsed.status());
  }
  if (parsed->help) {
    std::cout << (parsed->command != nullptr ? CommandHelp(*parsed->command)
                                             : MainHelp());
    return kExitOk;
  }
  if (parsed->command->name == "export" ||
      (parsed->command->name == "checkpoint" && parsed->args[0] == "compact")) {
    return RunOfflineCheckpointCommand(*parsed);
  }
  if (parsed->command->name == "certs") {
    absl::Status s = RunCertsCommand(parsed->args, parsed->flags);
    if (absl::IsInvalidArgument(s)) return UsageError(&*parsed, s);
    return s.ok() ? kExitOk : Error(s);
  }
  if (!parsed->command->uses_cluster) return RunPlan(*parsed);
  if (parsed->command->name == "members") return RunMembers(*parsed);
  const std::string& name = parsed->command->name;
  if (name == "rebalance" || name == "drain" || name == "moves") {
    return RunRebalanceCommand(*parsed);
  }
  if (name == "checkpoint" || name == "checkpoints") return RunCheckpointCommand(*parsed);
  return RunClusterCommand(*parsed);
}

}  // namespace
}  // namespace recps::client::admin

int main(int argc, char** argv) {
  const int code = recps::client::admin::Main(argc, argv);
  // Leave without atexit handlers and static destructors. gRPC's threads
  // outlive our channels and may still be at work: with TLS and a
  // coordinator that never answered, the channel's re-resolution (gRPC
  // waits 30 s between resolutions) created a subchannel, and with it a
  // TLS handshaker that reads the key through OpenSSL, just as exit() ran
  // OpenSSL's cleanup: SIGSEGV (exit 139) after the error was printed, in
  // most runs with the default 30 s timeout (issue 33; found under ASan).
  // Everything this process writes is done by now, save stdio's buffers.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
}
