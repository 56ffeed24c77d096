#include "client/admin/command_line.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/admin/certs_command.h"
#include "common/status_macros.h"
#include "common/rpc/address.h"

namespace recps::client::admin {
namespace {

constexpr char kExitCodesHelp[] = R"(Exit codes:
  0  success (status: the cluster is healthy)
  1  the cluster could not be reached or asked (the message says which
     address and why); plan: no plan fits (the message says what would)
  2  usage error: unknown command or flag, bad value, unreadable or invalid
     input file
  3  unhealthy: an expired member, a shard server that does not answer or
     routes by an old shard map, or no shard map yet
)";

constexpr char kConnectionHelp[] =
    R"(Where the cluster is (every cluster command):
  --coordinator=HOST:PORT  the coordinator (default: $RECPS_COORDINATOR)
  --server=HOST:PORT       ask this shard server directly instead (repeat or
                           comma-separate for several)
  --timeout=DURATION       deadline of every RPC (default 5s)
  --json                   print JSON (proto3 mapping of recps.v1 admin
                           messages, see proto/recps/v1/admin.proto)
  --tls_ca=FILE --tls_cert=FILE --tls_key=FILE
                           mutual TLS with this CA, certificate and key
                           (default: $RECPS_TLS_CA, $RECPS_TLS_CERT,
                           $RECPS_TLS_KEY); an admin certificate may do
                           everything, a reader certificate only read
  --insecure               plaintext, for clusters started with --insecure
)";

constexpr absl::Duration kMaxDurationFlag = absl::Hours(1);

}  // namespace

absl::Status CheckAddressFlag(const std::string& flag, const std::string& address) {
  absl::Status s = rpc::CheckHostPort(address);
  if (s.ok()) return s;
  return absl::InvalidArgumentError(absl::StrCat(flag, "=", address, ": ", s.message()));
}

absl::StatusOr<std::string> CoordinatorAddress(const ParsedArgs& parsed, bool read_env) {
  if (auto it = parsed.flags.find("coordinator"); it != parsed.flags.end()) {
    RETURN_IF_ERROR(CheckAddressFlag("--coordinator", it->second));
    return it->second;
  }
  const char* env = read_env ? std::getenv("RECPS_COORDINATOR") : nullptr;
  if (env == nullptr || *env == '\0') return std::string();
  RETURN_IF_ERROR(CheckAddressFlag("RECPS_COORDINATOR", env));
  return std::string(env);
}

absl::StatusOr<std::string> RequiredCoordinatorAddress(const ParsedArgs& parsed) {
  ASSIGN_OR_RETURN(std::string address, CoordinatorAddress(parsed));
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "where is the coordinator? Give --coordinator=HOST:PORT (or set RECPS_COORDINATOR)");
  }
  return address;
}

namespace {

// What the cluster holds and who is in it.
std::vector<CommandSpec> ClusterCommands() {
  return {
    {"status",
     "recpsctl status [--interval=1s] [--json]",
     "members, health, shard map epoch, per-server rows, memory, request "
     "rate and latency, imbalance",
     R"(Asks the coordinator for its members and shard map, then every shard
server for its statistics, twice --interval apart: request rates and
latency percentiles (p50, p99; estimated from each server's latency
histogram) cover that interval. --interval=0 takes one sample and reports
averages since each server started. Imbalance is max/mean over the servers
in the shard map, of rows and of lookup ids per second.
Exits 3 when the cluster is unhealthy (the problems are listed).
)",
     {{"interval", true}}},
    {"tables",
     "recpsctl tables [--json]",
     "embedding tables: rows, bytes, traffic, and each server's share",
     R"(Sums every shard server's table statistics: rows, bytes of rows
(weights and optimizer state), ids looked up and gradient rows applied since
the servers started, and the rows each server holds. Exits 3 when a server
does not answer (its rows are missing from the sums).
)",
     {}},
    {"shards",
     "recpsctl shards [--slots] [--json]",
     "the shard map: which server owns which slots, with rows",
     R"(Per server: its index in the shard map, the slots it owns (count and
ranges) and its rows. --slots adds the rows of every slot. Exits 3 when a
server does not answer.
)",
     {{"slots", false}}},
    {"members",
     "recpsctl members forget MEMBER_ID [--json]",
     "remove an expired or left member from the coordinator",
     R"(`members forget MEMBER_ID` removes a member the coordinator lists as
expired or left (see `recpsctl status`) from its member table and its state:
it no longer makes status unhealthy nor counts against the coordinator's
--max_members. A live member is refused (exit 1): stop the process first and
wait for its lease to run out. A process that registers again later gets a
new member id. Needs --coordinator.
)",
     {},
     2,
     2},
  };
}

// Checkpoints: take one, list them, compact a chain.
std::vector<CommandSpec> CheckpointCommands() {
  return {
    {"checkpoint",
     "recpsctl checkpoint now [--wait] [--timeout=DURATION] [--reason=TEXT] [--json]\n"
     "       recpsctl checkpoint compact --dir=ROOT [--step=N] [--json]",
     "take a checkpoint now, or fold a chain into a full one (compact, offline)",
     R"(`checkpoint now` asks the coordinator for a checkpoint; the workers take
it at their next step boundary. With --wait it returns once a checkpoint
newer than the newest one before is complete and prints its step and
directory; --timeout then bounds the wait (default 10m) and each RPC takes
at most 5s. Exits 1 when checkpoints are off, the coordinator cannot be
reached, or (--wait) the checkpoint failed or did not complete in time.
Needs --coordinator.
--reason=TEXT     recorded in the manifest (default "requested")

`checkpoint compact` folds the chain of the checkpoint at --step under
--dir (the newest complete one by default: a full checkpoint and its
increments) into a full checkpoint at the same step, in the same directory:
new row files, then the MANIFEST swapped atomically, then the superseded
files removed. An interruption leaves the old chain valid. Older
checkpoints stay until pruned. Progress goes to stderr. Reads and writes
files only: run it where the checkpoint directory is mounted; needs no
cluster.
)",
     {{"wait", false}, {"reason", true}, {"dir", true}, {"step", true}},
     1,
     1},
    {"checkpoints",
     "recpsctl checkpoints [--json]",
     "list the complete checkpoints and the one being written",
     R"(Step, kind (full or incremental), base step, size (row files, dense
state and manifest), rows, age and reason of every complete checkpoint in the
job's training.checkpoint.dir, oldest first; then the checkpoint being
written, the step this run was restored from, and the last error. Needs
--coordinator.
)",
     {},
     0,
     0},
  };
}

// Moving slots between shard servers.
std::vector<CommandSpec> SlotMoveCommands() {
  return {
    {"rebalance",
     "recpsctl rebalance [--max_bytes=BYTES] [--max_moves=N] [--apply] "
     "[--max_bytes_per_second=BYTES] [--json]",
     "plan (and with --apply carry out) slot moves that even out rows and load",
     R"(Asks the coordinator for a rebalance plan from the shard servers' live
load (per-slot rows, bytes, lookup and update rates): which slots and whole
tables (table-wise tables, column groups) move where, the bytes to move, the
max/mean imbalance of rows, bytes and load before and after, and the
estimated time. Shard servers that registered after the map was built own
nothing yet: the plan gives them their share. Nothing moves without --apply;
with it the coordinator carries the plan out while training goes on (copy,
then a short hand-over at a step boundary, one new shard map epoch per move)
and recpsctl waits, with a progress bar on stderr, then lists the moves.
--max_bytes=BYTES   move at most this many bytes of rows (64GiB, 1e9, ...)
--max_moves=N       move at most N slots and whole tables
--max_bytes_per_second=BYTES  bandwidth of the copies together
                    (default: the coordinator's --move_max_bytes_per_second)
--timeout=DURATION  with --apply: how long to wait (default 1h; the
                    rebalance goes on after recpsctl gives up)
Exits 1 when the coordinator refuses (a rebalance already runs, the map
changed since the plan) or cannot plan (a server does not answer), or when a
move was rolled back. Needs --coordinator.
)",
     {{"max_bytes", true}, {"max_moves", true}, {"apply", false},
      {"max_bytes_per_second", true}},
     0,
     0},
    {"drain",
     "recpsctl drain SERVER [--max_bytes=BYTES] [--max_moves=N] [--apply] [--json]",
     "plan (and with --apply carry out) moving every slot off SERVER",
     R"(A rebalance plan that moves every slot and whole table off SERVER (its
address as in the shard map) to the other servers, evenly by bytes and load,
so SERVER can be stopped once the moves are done (it stays in the map's
server list, owning nothing). Refused: a server not in the map, the last
server. Flags as for rebalance. Needs --coordinator.
)",
     {{"max_bytes", true}, {"max_moves", true}, {"apply", false},
      {"max_bytes_per_second", true}},
     1,
     1},
    {"moves",
     "recpsctl moves [--json]",
     "slot moves in flight and done",
     R"(Every slot move the coordinator keeps (the last --max_kept_moves):
its id, state (pending, copying, copied, handing over, done, aborted,
failed), source, target, slots and tables, bytes, the shard map epoch that
gave them to the target, and how it ended (copy time, rows sent at the
hand-over, how long the slots were held; or the error, or how a move left
in flight by a coordinator restart was resolved). Then the rebalance
running, the last one's outcome and the measured move rate. Needs
--coordinator.
)",
     {},
     0,
     0},
  };
}

// Commands that need no cluster: files and plans only.
std::vector<CommandSpec> OfflineCommands() {
  return {
    {"plan",
     "recpsctl plan JOB [--spec=PLAN_SPEC] [--servers=N] [--memory=BYTES] "
     "[--workers=W] [--batch_size=B] [--device=cpu|gpu] [--json]",
     "the sharding plan the planner would make, with its cost estimates "
     "(offline)",
     R"(Runs the sharding planner on the tables of JOB (a text-format
recps.v1.JobConfig) without touching a cluster, and prints per table its
sharding type, placement, rows and bytes, and per server its bytes, traffic
and predicted step time (cost model: docs/planner.md).

The cluster comes from --spec (a text-format recps.v1.PlanSpec: topology and
per-table hints, as recps-coordinator --plan_spec reads it) and the flags:
--servers=N       plan for N servers ("server-0" ...), each like the spec's
                  entry without an address (or the defaults)
--memory=BYTES    memory for rows on each server: 64GiB, 512MiB, 1e9, ...
--workers=W       dense workers (default: the spec's, else 1)
--batch_size=B    samples per worker per step (default: the spec's, else
                  the job's training.batch_size)
--device=cpu|gpu  where the servers keep rows (sets the default row cost)
--json            print the recps.v1.ShardingPlan as JSON
A plan that the shard servers cannot serve yet (column-wise, fp16) is
printed with a note saying so.
)",
     {{"spec", true},
      {"servers", true},
      {"memory", true},
      {"workers", true},
      {"batch_size", true},
      {"device", true}},
     1,
     1,
     false},
    {"export",
     "recpsctl export OUT_DIR --table=T --dir=ROOT[@STEP] [--json]",
     "write a table's weights from a checkpoint (offline)",
     R"(Writes the weights of table T (no optimizer state) at the checkpoint
ROOT@STEP (the newest complete one when @STEP is left out; its whole chain is
read) to OUT_DIR as T.ids (int64 little-endian, ascending), T.weights
(float32 little-endian, rows x dim) and T.meta.json (name, dim, rows, dtype,
step, digest, CRC-32C of both files). docs/operations.md has the format.
)",
     {{"dir", true}, {"table", true}},
     1,
     1,
     false},
    {"certs",
     kCertsSynopsis,
     "create a CA and certificates for a cluster's roles (offline)",
     kCertsDetails,
     {{"cluster", true},
      {"hosts", true},
      {"days", true},
      {"role", true},
      {"name", true},
      {"ca", true},
      {"out", true}},
     1,
     2,
     false},
  };
}

}  // namespace

const std::vector<CommandSpec>& Commands() {
  static const auto* commands = [] {
    auto* all = new std::vector<CommandSpec>;
    for (std::vector<CommandSpec> (*group)() :
         {ClusterCommands, CheckpointCommands, SlotMoveCommands, OfflineCommands}) {
      std::vector<CommandSpec> specs = group();
      all->insert(all->end(), std::make_move_iterator(specs.begin()),
                  std::make_move_iterator(specs.end()));
    }
    return all;
  }();
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
      "Usage: recpsctl COMMAND [flags]   (recpsctl COMMAND --help for "
      "details)\n\n"
      "Commands:\n";
  size_t width = 4;  // "help"
  for (const CommandSpec& c : Commands()) width = std::max(width, c.name.size());
  for (const CommandSpec& c : Commands()) {
    out += absl::StrCat("  ", c.name, std::string(width + 2 - c.name.size(), ' '),
                        c.summary, "\n");
  }
  out += absl::StrCat("  help", std::string(width - 2, ' '), "help on a command\n\n");
  out += kConnectionHelp;
  out += "\n";
  out += kExitCodesHelp;
  return out;
}

std::string CommandHelp(const CommandSpec& c) {
  std::string out = absl::StrCat("Usage: ", c.synopsis, "\n\n", c.summary,
                                 ".\n\n", c.details, "\n");
  if (c.uses_cluster) out += absl::StrCat(kConnectionHelp, "\n");
  out += kExitCodesHelp;
  return out;
}

namespace {

const FlagSpec* FindFlag(const CommandSpec* command, const std::string& name) {
  static const auto* kCommon = new std::vector<FlagSpec>{
      {"coordinator", true}, {"server", true},  {"timeout", true}, {"json", false},
      {"tls_ca", true},      {"tls_cert", true}, {"tls_key", true}, {"insecure", false}};
  for (const FlagSpec& f : *kCommon) {
    // Offline commands take --json but no connection flags.
    if (f.name == name &&
        (command == nullptr || command->uses_cluster || name == "json")) {
      return &f;
    }
  }
  if (command != nullptr) {
    for (const FlagSpec& f : command->flags) {
      if (f.name == name) return &f;
    }
  }
  return nullptr;
}

}  // namespace

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
        return absl::InvalidArgumentError(
            absl::StrCat("--", body, " needs a value"));
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
            ? absl::StrCat("unexpected argument \"", parsed.args[c.max_args],
                           "\"")
            : std::string("missing argument"));
  }
  for (auto& [name, value] : flags) {
    const FlagSpec* spec = FindFlag(&c, name);
    if (spec == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " for ", c.name));
    }
    if (spec->takes_value && !value.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value"));
    }
    std::string v = value.value_or("true");
    if (!spec->takes_value && v != "true" && v != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", v, ": expected true or false"));
    }
    if (name == "server") {
      for (absl::string_view s :
           absl::StrSplit(v, ',', absl::SkipWhitespace())) {
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
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, "=", it->second,
                     ": expected a duration such as 500ms or 2s"));
  }
  if (d > kMaxDurationFlag) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, "=", it->second, ": the limit is ",
        absl::FormatDuration(kMaxDurationFlag)));
  }
  return d;
}

}  // namespace recps::client::admin
