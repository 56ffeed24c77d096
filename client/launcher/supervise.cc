// The launcher's child supervision (supervise.h).
#include "client/launcher/supervise.h"

#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/stop_signals.h"

namespace recps::client {

std::string Tail(const std::string& path, int lines, FileSystem* fs) {
  // A log is read whole, as ever: no limit.
  absl::StatusOr<std::string> text =
      fs->ReadSmallFile(path, std::numeric_limits<int64_t>::max());
  if (!text.ok() || text->empty()) return "";
  absl::string_view body = *text;
  if (body.back() == '\n') body.remove_suffix(1);  // no empty last line
  const std::vector<absl::string_view> all = absl::StrSplit(body, '\n');
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

absl::StatusOr<int> WaitForPort(ChildProcess& child, const std::string& port_file,
                                const std::string& log, absl::Duration timeout,
                                FileSystem* fs) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    // Missing or unreadable: not written yet (the child writes it whole, by
    // rename, once it serves).
    absl::StatusOr<std::string> text = fs->ReadSmallFile(port_file, 64 << 10);
    if (text.ok()) {
      const std::vector<absl::string_view> words =
          absl::StrSplit(*text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
      int port = 0;
      if (!words.empty() && absl::SimpleAtoi(words[0], &port) && port > 0) return port;
    }
    if (child.Poll().ok()) {
      return absl::InternalError(absl::StrCat(child.name(), " exited during start-up:\n",
                                              Tail(log, 20, fs)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(child.name(), " did not start; see ", log));
}

void WritePidFile(const std::string& path, const std::vector<LocalServer>& servers,
                  const std::vector<ChildProcess>& workers,
                  const std::vector<std::string>& worker_names, FileSystem* fs) {
  std::string text;
  for (const LocalServer& s : servers) {
    if (s.process.running()) absl::StrAppend(&text, s.description, " ", s.process.pid(), "\n");
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].running()) absl::StrAppend(&text, worker_names[i], " ", workers[i].pid(), "\n");
  }
  const std::string tmp = path + ".tmp";
  absl::Status s = fs->WriteFile(tmp, text, /*sync=*/false);
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    fs->RemoveFile(tmp).IgnoreError();
    LogWarning("the pid file is out of date: ", s.message());
  }
}

int Supervise(std::vector<ChildProcess>& workers, const std::vector<std::string>& names,
              std::vector<LocalServer>* servers, const std::string& what,
              const std::function<void()>& on_change, std::string* failure,
              int failure_signal, absl::Duration stop_grace) {
  auto note = [failure](std::string text) {
    if (failure != nullptr && failure->empty()) *failure = std::move(text);
  };
  auto how_code = [](int code) {
    return code > 128 ? absl::StrCat("signal ", code - 128) : absl::StrCat("exit code ", code);
  };
  const sigset_t stop = StopSignals();
  int exit_code = 0;
  int stop_signal = SIGTERM;
  // A worker that trained to the end but whose final checkpoint failed:
  // the others finish too (they got the same answer), nothing restarts.
  bool final_checkpoint_failed = false;
  // A worker that stopped at another rank's pre-emption checkpoint: saved,
  // not done; the others stop at the same checkpoint.
  bool stopped_for_peer = false;
  size_t remaining = workers.size();
  while (remaining > 0 && exit_code == 0) {
    timespec tick{0, 100 * 1000 * 1000};
    if (const int sig = sigtimedwait(&stop, nullptr, &tick); sig > 0) {
      LogWarning("interrupted (", strsignal(sig), "): stopping ", what);
      stop_signal = sig;
      exit_code = 128 + sig;
      break;
    }
    for (size_t i = 0; i < workers.size(); ++i) {
      if (!workers[i].running()) continue;
      absl::StatusOr<int> code = workers[i].Poll();
      if (!code.ok()) continue;
      --remaining;
      if (*code == kExitFinalCheckpointFailed) {
        final_checkpoint_failed = true;
      } else if (*code == kExitStoppedForPeer) {
        stopped_for_peer = true;
      } else if (*code != 0 && exit_code == 0) {
        LogError(names[i], " failed with exit code ", *code, "; stopping ", what);
        note(absl::StrCat(names[i], *code > 128 ? " died (" : " failed (", how_code(*code), ")"));
        exit_code = 1;
      }
    }
    if (servers == nullptr) continue;
    for (LocalServer& s : *servers) {
      if (!s.process.running() || exit_code != 0) continue;
      const pid_t pid = s.process.pid();
      absl::StatusOr<int> code = s.process.Poll();
      if (!code.ok()) continue;
      const std::string how = *code > 128 ? absl::StrCat("was killed by signal ", *code - 128)
                                          : absl::StrCat("exited with code ", *code);
      if (s.replicated && (s.restart == nullptr || s.restarts_left <= 0)) {
        LogWarning(s.description, " (pid ", pid, ") ", how, "; its backups take over its "
                   "rows once its coordinator lease runs out (replication): ", what,
                   " goes on");
        if (on_change) on_change();
        continue;
      }
      if (s.restart == nullptr || s.restarts_left <= 0) {
        LogError(s.description, " (pid ", pid, ") ", how,
                 s.restart != nullptr ? " and has no restarts left" : "", "; stopping ", what);
        note(absl::StrCat(s.short_name.empty() ? s.description : s.short_name,
                          *code > 128 ? " died (" : " exited (", how_code(*code), ")"));
        exit_code = 1;
        continue;
      }
      --s.restarts_left;
      LogWarning(s.description, " (pid ", pid, ") ", how, "; restarting it on the same "
                 "address with the same state (", s.restarts_left, " restart(s) left)");
      absl::StatusOr<ChildProcess> again = s.restart();
      if (!again.ok()) {
        LogError("restarting the ", s.description, " failed: ", again.status().message(),
                 "; stopping ", what);
        note(absl::StrCat("restarting ", s.short_name, " failed"));
        exit_code = 1;
        continue;
      }
      s.process = *std::move(again);
      LogInfo(s.description, " restarted (pid ", s.process.pid(), ")");
      if (on_change) on_change();
    }
  }
  const bool signalled = exit_code > 128;
  for (ChildProcess& w : workers) w.Signal(signalled ? stop_signal : failure_signal);
  const absl::Time deadline =
      absl::Now() + (signalled ? stop_grace : absl::Seconds(10));
  for (ChildProcess& w : workers) {
    if (w.running()) (void)w.Wait(std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (w.running()) (void)w.Stop(absl::Seconds(1));
  }
  if (exit_code == 0 && final_checkpoint_failed) return kExitFinalCheckpointFailed;
  if (exit_code == 0 && stopped_for_peer) return kExitStoppedForPeer;
  return exit_code;
}

}  // namespace recps::client
