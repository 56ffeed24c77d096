// The launcher's child supervision (supervise.h).
#include "client/launcher/supervise.h"

#include <signal.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/exit_codes.h"
#include "common/log.h"

namespace recps::client {

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  const size_t from = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  return absl::StrJoin(all.begin() + from, all.end(), "\n");
}

absl::StatusOr<int> WaitForPort(ChildProcess& child, const std::string& port_file,
                                const std::string& log, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (child.Poll().ok()) {
      return absl::InternalError(absl::StrCat(child.name(), " exited during start-up:\n",
                                              Tail(log, 20)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(child.name(), " did not start; see ", log));
}

void WritePidFile(const std::string& path, const std::vector<LocalServer>& servers,
                  const std::vector<ChildProcess>& workers,
                  const std::vector<std::string>& worker_names) {
  std::string text;
  for (const LocalServer& s : servers) {
    if (s.process.running()) absl::StrAppend(&text, s.description, " ", s.process.pid(), "\n");
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (workers[i].running()) absl::StrAppend(&text, worker_names[i], " ", workers[i].pid(), "\n");
  }
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
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
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  int exit_code = 0;
  int stop_signal = SIGTERM;
  // A worker that trained to the end but whose final checkpoint failed:
  // the others finish too (they got the same answer), nothing restarts.
  bool final_checkpoint_failed = false;
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
  return exit_code;
}

}  // namespace recps::client
