#include "server/checkpoint/file_util.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rocksdb/status.h"

namespace recps::server::checkpoint {
namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of data to fd, retrying short writes and EINTR.
int WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t put = write(fd, data, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += put;
    n -= static_cast<size_t>(put);
  }
  return 0;
}

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path) {
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(msg);
    case ENOTDIR:
    case EEXIST:
    case EISDIR:
      return absl::FailedPreconditionError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

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

absl::Status SyncDir(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open directory", dir);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return ErrnoStatus(err, "cannot fsync directory", dir);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  const std::string tmp = path + ".tmp";
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, "cannot create", tmp);
  int err = WriteAll(fd, bytes.data(), bytes.size());
  const char* what = "cannot write";
  if (err == 0 && fdatasync(fd) != 0) {
    err = errno;
    what = "cannot fdatasync";
  }
  if (close(fd) != 0 && err == 0) {
    err = errno;
    what = "cannot close";
  }
  if (err == 0 && rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    what = "cannot rename into place";
  }
  if (err != 0) {
    unlink(tmp.c_str());
    return ErrnoStatus(err, what, tmp);
  }
  return SyncDir(DirOf(path));
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                          int64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  if (st.st_size > max_bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is ", st.st_size, " bytes, over the limit of ",
                     max_bytes, " for this kind of file"));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t got = read(fd, out.data() + done, out.size() - done);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, "cannot read", path);
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  close(fd);
  out.resize(done);
  return out;
}

}  // namespace recps::server::checkpoint
