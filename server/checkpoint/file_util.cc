#include "server/checkpoint/file_util.h"

#include <errno.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/status.h"

namespace recps::server::checkpoint {

absl::Status FromRocksStatus(const rocksdb::Status& s, absl::string_view what,
                             absl::string_view path) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, " ", path, ": ", s.ToString());
  if (s.IsNoSpace() || absl::StrContains(s.ToString(), "No space left")) {
    return absl::ResourceExhaustedError(msg);
  }
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsPathNotFound() || s.IsNotFound() ||
      absl::StrContains(s.ToString(), "No such file")) {
    return absl::NotFoundError(msg);
  }
  const std::string text = s.ToString();
  if (absl::StrContains(text, "Permission denied") ||
      absl::StrContains(text, "Read-only file system")) {
    return absl::PermissionDeniedError(msg);
  }
  if (absl::StrContains(text, "Not a directory")) {
    return absl::FailedPreconditionError(msg);
  }
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  return absl::UnavailableError(msg);
}

void BackgroundThisThread(int nice) {
  const pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  sched_param param{};
  param.sched_priority = 0;
  sched_setscheduler(tid, SCHED_BATCH, &param);
  if (nice <= 0) return;
  errno = 0;
  const int now = getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  setpriority(PRIO_PROCESS, tid, std::min(now + nice, 19));
}

}  // namespace recps::server::checkpoint
