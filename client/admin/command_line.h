// recpsctl's command line: the commands with their flags and help texts,
// the exit codes, and the parser (flags before or after the command, each
// command's own flags and --help). recpsctl_main.cc runs the commands.
#ifndef RECPS_CLIENT_ADMIN_COMMAND_LINE_H_
#define RECPS_CLIENT_ADMIN_COMMAND_LINE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace recps::client::admin {

// Exit codes scripts can rely on (also in --help and docs/admin-cli.md).
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,      // the cluster could not be reached or asked
  kExitUsage = 2,      // bad command line or input file
  kExitUnhealthy = 3,  // answered, but something is wrong (see the output)
};

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

// Every command, in the order --help lists them.
const std::vector<CommandSpec>& Commands();
const CommandSpec* FindCommand(const std::string& name);
std::string MainHelp();
std::string CommandHelp(const CommandSpec& c);

struct ParsedArgs {
  const CommandSpec* command = nullptr;
  std::vector<std::string> args;
  std::map<std::string, std::string> flags;  // name -> value ("true" for bools)
  std::vector<std::string> servers;          // every --server, split
  bool help = false;
};

// Flags may come before or after the command: --name=value, --name value,
// --bool. Fails with a message for the user on a usage error.
absl::StatusOr<ParsedArgs> ParseArgs(int argc, char** argv);
bool BoolFlag(const ParsedArgs& parsed, const std::string& name);
// A duration flag (at most an hour), or `default_value` when absent.
absl::StatusOr<absl::Duration> DurationFlag(const ParsedArgs& parsed, const std::string& name,
                                            absl::Duration default_value);
// HOST:PORT with a port in 1..65535 (gRPC would quietly wrap 99999).
absl::Status CheckAddressFlag(const std::string& flag, const std::string& address);
// The coordinator's address: --coordinator, else $RECPS_COORDINATOR (read
// only with `read_env`), else "". INVALID_ARGUMENT naming the flag or the
// variable for a malformed address.
absl::StatusOr<std::string> CoordinatorAddress(const ParsedArgs& parsed, bool read_env = true);
// The same, for commands only the coordinator answers: INVALID_ARGUMENT
// "where is the coordinator? ..." when none is given.
absl::StatusOr<std::string> RequiredCoordinatorAddress(const ParsedArgs& parsed);

}  // namespace recps::client::admin

#endif  // RECPS_CLIENT_ADMIN_COMMAND_LINE_H_
