// recpsctl: the admin CLI. Asks a running cluster (through its coordinator,
// or shard servers directly) what it holds and how it is doing, and plans
// sharding offline. Tables for people, --json for scripts. See
// docs/admin-cli.md.
//
// Flags are parsed here rather than with absl flags: every subcommand has
// its own flags and --help, and the exit codes below must hold for usage
// errors too (absl's parser exits with 1).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/admin/cluster_reader.h"
#include "client/admin/cluster_report.h"
#include "client/admin/report_text.h"
#include "grpcpp/security/credentials.h"

namespace recps::client::admin {
namespace {

// Exit codes scripts can rely on (also in --help and docs/admin-cli.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,      // the cluster could not be reached or asked
  kExitUsage = 2,      // bad command line or input file
  kExitUnhealthy = 3,  // answered, but something is wrong (see the output)
};

constexpr char kExitCodesHelp[] = R"(Exit codes:
  0  success (status: the cluster is healthy)
  1  the cluster could not be reached or asked (the message says which
     address and why)
  2  usage error: unknown command or flag, bad value, unreadable input file
  3  unhealthy: an expired member, a shard server that does not answer or
     routes by an old shard map, or no shard map yet
)";

constexpr char kConnectionHelp[] = R"(Where the cluster is (every cluster command):
  --coordinator=HOST:PORT  the coordinator (default: $RECPS_COORDINATOR)
  --server=HOST:PORT       ask this shard server directly instead (repeat or
                           comma-separate for several)
  --timeout=DURATION       deadline of every RPC (default 5s)
  --json                   print JSON (proto3 mapping of recps.v1 admin
                           messages, see proto/recps/v1/admin.proto)
)";

struct FlagSpec {
  std::string name;
  bool takes_value;
};

struct CommandSpec {
  std::string name;
  std::string synopsis;
  std::string summary;
  std::string details;
  std::vector<FlagSpec> flags;  // besides the connection flags and --help
  int min_args = 0;
  int max_args = 0;
  bool uses_cluster = true;
};

const std::vector<CommandSpec>& Commands() {
  static const auto* commands = new std::vector<CommandSpec>{
      {"status", "recpsctl status [--interval=1s] [--json]",
       "members, health, shard map epoch, per-server rows, memory, request "
       "rate and latency, imbalance",
       R"(Asks the coordinator for its members and shard map, then every shard
server for its statistics, twice --interval apart: request rates and
latency percentiles (p50, p99; estimated from each server's latency
histogram) cover that interval. --interval=0 takes one sample and reports
averages since each server started. Imbalance is max/mean over the servers
that own slots, of rows and of lookup ids per second.
Exits 3 when the cluster is unhealthy (the problems are listed).
)",
       {{"interval", true}}},
      {"tables", "recpsctl tables [--json]",
       "embedding tables: rows, bytes, traffic, and each server's share",
       R"(Sums every shard server's table statistics: rows, bytes of rows
(weights and optimizer state), ids looked up and gradient rows applied since
the servers started, and the rows each server holds. Exits 3 when a server
does not answer (its rows are missing from the sums).
)",
       {}},
      {"shards", "recpsctl shards [--slots] [--json]",
       "the shard map: which server owns which slots, with rows",
       R"(Per server: its index in the shard map, the slots it owns (count and
ranges) and its rows. --slots adds the rows of every slot. Exits 3 when a
server does not answer.
)",
       {{"slots", false}}},
  };
  return *commands;
}

const CommandSpec* FindCommand(const std::string& name) {
  for (const CommandSpec& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string MainHelp() {
  std::string out =
      "recpsctl: inspect a recps cluster.\n\n"
      "Usage: recpsctl COMMAND [flags]   (recpsctl COMMAND --help for details)\n\n"
      "Commands:\n";
  for (const CommandSpec& c : Commands()) {
    out += absl::StrCat("  ", c.name, std::string(8 - c.name.size(), ' '), c.summary, "\n");
  }
  out += "  help    help on a command\n\n";
  out += kConnectionHelp;
  out += "\n";
  out += kExitCodesHelp;
  return out;
}

std::string CommandHelp(const CommandSpec& c) {
  std::string out = absl::StrCat("Usage: ", c.synopsis, "\n\n", c.summary, ".\n\n",
                                 c.details, "\n");
  if (c.uses_cluster) out += absl::StrCat(kConnectionHelp, "\n");
  out += kExitCodesHelp;
  return out;
}

struct ParsedArgs {
  const CommandSpec* command = nullptr;
  std::vector<std::string> args;
  std::map<std::string, std::string> flags;  // name -> value ("true" for bools)
  std::vector<std::string> servers;           // every --server, split
  bool help = false;
};

const FlagSpec* FindFlag(const CommandSpec* command, const std::string& name) {
  static const auto* kCommon = new std::vector<FlagSpec>{
      {"coordinator", true}, {"server", true}, {"timeout", true}, {"json", false}};
  for (const FlagSpec& f : *kCommon) {
    if (f.name == name) return &f;
  }
  if (command != nullptr) {
    for (const FlagSpec& f : command->flags) {
      if (f.name == name) return &f;
    }
  }
  return nullptr;
}

// Flags may come before or after the command: --name=value, --name value,
// --bool. Fails with a message for the user on a usage error.
absl::StatusOr<ParsedArgs> ParseArgs(int argc, char** argv) {
  ParsedArgs parsed;
  std::vector<std::string> positional;
  // Flags seen before the command could be the command's own: checked once
  // it is known.
  std::vector<std::pair<std::string, std::optional<std::string>>> flags;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      positional.push_back(arg);
      if (parsed.command == nullptr && positional.size() == 1) {
        parsed.command = FindCommand(arg);
      }
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help") {
      parsed.help = true;
      continue;
    }
    const std::string body = arg.substr(absl::StartsWith(arg, "--") ? 2 : 1);
    const size_t eq = body.find('=');
    if (eq != std::string::npos) {
      flags.emplace_back(body.substr(0, eq), body.substr(eq + 1));
      continue;
    }
    const FlagSpec* spec = FindFlag(parsed.command, body);
    if (spec != nullptr && spec->takes_value) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("--", body, " needs a value"));
      }
      flags.emplace_back(body, std::string(argv[++i]));
    } else {
      flags.emplace_back(body, std::nullopt);
    }
  }
  if (positional.empty()) {
    if (parsed.help) return parsed;
    return absl::InvalidArgumentError("no command given");
  }
  if (positional[0] == "help") {
    parsed.help = true;
    if (positional.size() > 2) {
      return absl::InvalidArgumentError("help takes at most one command");
    }
    if (positional.size() == 2) {
      parsed.command = FindCommand(positional[1]);
      if (parsed.command == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown command \"", positional[1], "\""));
      }
    }
    return parsed;
  }
  if (parsed.command == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command \"", positional[0], "\""));
  }
  if (parsed.help) return parsed;
  parsed.args.assign(positional.begin() + 1, positional.end());
  const CommandSpec& c = *parsed.command;
  if (static_cast<int>(parsed.args.size()) < c.min_args ||
      static_cast<int>(parsed.args.size()) > c.max_args) {
    return absl::InvalidArgumentError(
        parsed.args.size() > static_cast<size_t>(c.max_args)
            ? absl::StrCat("unexpected argument \"", parsed.args[c.max_args], "\"")
            : std::string("missing argument"));
  }
  for (auto& [name, value] : flags) {
    const FlagSpec* spec = FindFlag(&c, name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for ", c.name));
    }
    if (spec->takes_value && !value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
    }
    std::string v = value.value_or("true");
    if (!spec->takes_value && v != "true" && v != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", v, ": expected true or false"));
    }
    if (name == "server") {
      for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
        parsed.servers.emplace_back(s);
      }
      if (parsed.servers.empty()) {
        return absl::InvalidArgumentError("--server needs HOST:PORT");
      }
    }
    parsed.flags[name] = std::move(v);
  }
  return parsed;
}

bool BoolFlag(const ParsedArgs& parsed, const std::string& name) {
  auto it = parsed.flags.find(name);
  return it != parsed.flags.end() && it->second == "true";
}

absl::StatusOr<absl::Duration> DurationFlag(const ParsedArgs& parsed,
                                            const std::string& name,
                                            absl::Duration default_value) {
  auto it = parsed.flags.find(name);
  if (it == parsed.flags.end()) return default_value;
  absl::Duration d;
  if (!absl::ParseDuration(it->second, &d) || d < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "=", it->second, ": expected a duration such as 500ms or 2s"));
  }
  return d;
}

// The one place that makes channel credentials for recpsctl: insecure today;
// TLS / mTLS flags go here.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() {
  return grpc::InsecureChannelCredentials();
}

int UsageError(const ParsedArgs* parsed, const absl::Status& status) {
  std::cerr << "recpsctl: " << status.message() << "\n";
  if (parsed != nullptr && parsed->command != nullptr) {
    std::cerr << "Run 'recpsctl " << parsed->command->name << " --help' for usage.\n";
  } else {
    std::cerr << "Run 'recpsctl --help' for usage.\n";
  }
  return kExitUsage;
}

int Error(const absl::Status& status) {
  std::cerr << "recpsctl: " << status.message() << "\n";
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

int RunClusterCommand(const ParsedArgs& parsed) {
  ClusterReaderOptions options;
  options.servers = parsed.servers;
  if (auto it = parsed.flags.find("coordinator"); it != parsed.flags.end()) {
    options.coordinator = it->second;
  } else if (options.servers.empty()) {
    if (const char* env = std::getenv("RECPS_COORDINATOR"); env != nullptr) {
      options.coordinator = env;
    }
  }
  if (!options.coordinator.empty() && !options.servers.empty()) {
    return UsageError(&parsed, absl::InvalidArgumentError(
                                   "give --coordinator or --server, not both"));
  }
  if (options.coordinator.empty() && options.servers.empty()) {
    return UsageError(&parsed, absl::InvalidArgumentError(
                                   "where is the cluster? Give --coordinator=HOST:PORT "
                                   "(or set RECPS_COORDINATOR) or --server=HOST:PORT"));
  }
  absl::StatusOr<absl::Duration> timeout =
      DurationFlag(parsed, "timeout", absl::Seconds(5));
  if (!timeout.ok()) return UsageError(&parsed, timeout.status());
  if (*timeout == absl::ZeroDuration()) {
    return UsageError(&parsed, absl::InvalidArgumentError("--timeout must be positive"));
  }
  options.rpc_timeout = *timeout;
  options.credentials = ChannelCredentials();
  absl::StatusOr<absl::Duration> interval =
      DurationFlag(parsed, "interval", absl::Seconds(1));
  if (!interval.ok()) return UsageError(&parsed, interval.status());

  absl::StatusOr<std::unique_ptr<ClusterReader>> reader =
      ClusterReader::Create(std::move(options));
  if (!reader.ok()) return UsageError(&parsed, reader.status());
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
  for (const v1::ServerShards& s : report.servers()) all_answered &= s.error().empty();
  return Print(parsed, report, FormatShardsReport(report, per_slot),
               all_answered ? kExitOk : kExitUnhealthy);
}

int Main(int argc, char** argv) {
  absl::StatusOr<ParsedArgs> parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) return UsageError(nullptr, parsed.status());
  if (parsed->help) {
    std::cout << (parsed->command != nullptr ? CommandHelp(*parsed->command) : MainHelp());
    return kExitOk;
  }
  return RunClusterCommand(*parsed);
}

}  // namespace
}  // namespace recps::client::admin

int main(int argc, char** argv) { return recps::client::admin::Main(argc, argv); }
