// Child processes for the launchers: spawn with arguments and an optional
// log file, stop with SIGTERM (then SIGKILL), wait with a timeout.
#ifndef RECPS_CLIENT_LAUNCHER_PROCESS_H_
#define RECPS_CLIENT_LAUNCHER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace recps::client {

// Starts `binary` with `args` (argv[0] is added); stdout and stderr go to
// `log_path` (appended) when it is not empty, else they are inherited; the
// environment is this process's with `env` ("NAME=value") added or
// replacing. The child starts with SIGINT/SIGTERM/SIGPIPE unblocked and at
// their defaults, and is killed if the thread that spawned it dies
// (PR_SET_PDEATHSIG): a crashed launcher or test leaves no servers behind
// (and no pipe held open). So spawn from a thread that outlives the child.
// NOT_FOUND naming the binary when it cannot be executed.
absl::StatusOr<pid_t> SpawnProcess(const std::string& binary,
                                   const std::vector<std::string>& args,
                                   const std::string& log_path = "",
                                   const std::vector<std::string>& env = {});

class ChildProcess {
 public:
  // Starts `binary` with `args`; stdout and stderr go to `log_path` (appended)
  // when it is not empty, else they are inherited. The child's environment
  // is this process's with `env` ("NAME=value" each) added or replacing.
  static absl::StatusOr<ChildProcess> Spawn(const std::string& binary,
                                            const std::vector<std::string>& args,
                                            const std::string& log_path = "",
                                            const std::vector<std::string>& env = {});
  // Sends `signal` to a running child (no-op otherwise).
  void Signal(int signal);
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&& other) noexcept;
  // Stops a still-running child (SIGTERM, then SIGKILL after 5 s).
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  bool running() const { return pid_ > 0; }

  // The exit code once the child has exited (128 + signal if killed), or
  // nullopt-like DEADLINE_EXCEEDED while it still runs after `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // Non-blocking: the exit code if the child has exited, else UNAVAILABLE.
  absl::StatusOr<int> Poll();
  // SIGTERM, then SIGKILL if it has not exited after `grace`.
  absl::StatusOr<int> Stop(absl::Duration grace);

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  std::string name_;
};

// The directory of the running executable (to find sibling binaries).
std::string SelfDirectory();

// The executable `name` in `bin_dir` (when not empty), else beside the
// running one; "" when neither has it.
std::string FindBinary(const std::string& name, const std::string& bin_dir);

}  // namespace recps::client

#endif  // RECPS_CLIENT_LAUNCHER_PROCESS_H_
