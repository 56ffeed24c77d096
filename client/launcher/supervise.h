// How the launcher (`recps local`, `recps launch`) watches its children:
// waiting for a child's port file, the pid file of a run, and Supervise,
// which waits for the workers while restarting servers that may restart.
#ifndef RECPS_CLIENT_LAUNCHER_SUPERVISE_H_
#define RECPS_CLIENT_LAUNCHER_SUPERVISE_H_

#include <signal.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/launcher/process.h"
#include "common/file_system.h"

namespace recps::client {

// A server process of `recps local`, and how to start it again.
struct LocalServer {
  ChildProcess process;
  // For people: "shard server 1 (127.0.0.1:40123)".
  std::string description;
  // Short, for the restart line: "shard-1", "coordinator".
  std::string short_name;
  // Starts a replacement (same address and state); null: not restarted.
  std::function<absl::StatusOr<ChildProcess>()> restart;
  int restarts_left = 0;
  // Its rows have copies on other shard servers (replication): its loss
  // costs a failover (the coordinator promotes its backups), not the run.
  bool replicated = false;
};

// The file reads and writes below go through `fs` (not owned).

// The last `lines` lines of the file at `path` ("" when unreadable).
std::string Tail(const std::string& path, int lines,
                 FileSystem* fs = FileSystem::Default());

// Waits up to `timeout` for a child's port file (its first number, > 0);
// fails, with the end of `log`, if the child exits first.
absl::StatusOr<int> WaitForPort(ChildProcess& child, const std::string& port_file,
                                const std::string& log, absl::Duration timeout,
                                FileSystem* fs = FileSystem::Default());

// Writes "<name> <pid>" per running child to `path` (atomically), so that
// tests and people find the processes of a `recps local` run. A failure
// (a full disk) is logged and leaves the previous pid file, if any.
void WritePidFile(const std::string& path, const std::vector<LocalServer>& servers,
                  const std::vector<ChildProcess>& workers,
                  const std::vector<std::string>& worker_names,
                  FileSystem* fs = FileSystem::Default());

// Waits until every worker exited, one failed, a server exited for good,
// or a SIGINT/SIGTERM arrived (blocked in main, taken here). A server with
// restarts left is started again in place (the log says so), a replicated
// one is let go (the log says so); any other server exit stops the run,
// naming the server. On a failure the other
// workers get SIGTERM; a signal is forwarded to the workers as it is.
// Workers still running after a grace period are killed. Returns 0, 1 (a
// worker or server failed: the log names which), 128 + the signal, or
// kExitFinalCheckpointFailed (common/exit_codes.h) when every worker
// finished and one or more exited with it (not a failure that stops the
// others or restarts the job), else kExitStoppedForPeer when one or more
// stopped at another rank's pre-emption checkpoint.
// `on_change` runs after a server was restarted (to rewrite the pid file).
// `failure` (when not null) gets what failed first, e.g. "shard-1 died
// (signal 9)" or "worker 0 failed (exit code 1)". After a failure the
// workers get `failure_signal` (SIGKILL when the job restarts from a
// checkpoint: their state is lost either way); after a SIGINT/SIGTERM they
// get that signal and `stop_grace` to exit (a final checkpoint).
int Supervise(std::vector<ChildProcess>& workers, const std::vector<std::string>& names,
              std::vector<LocalServer>* servers, const std::string& what,
              const std::function<void()>& on_change = nullptr,
              std::string* failure = nullptr, int failure_signal = SIGTERM,
              absl::Duration stop_grace = absl::Seconds(10));

}  // namespace recps::client

#endif  // RECPS_CLIENT_LAUNCHER_SUPERVISE_H_
