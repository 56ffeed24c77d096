#include "common/file_system.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace recps {
namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Writes all of data to fd, retrying short writes and EINTR; 0 or errno.
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

class PosixFileSystem : public FileSystem {
 public:
  absl::Status WriteFile(const std::string& path, absl::string_view bytes,
                         bool sync) override {
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return ErrnoStatus(errno, "cannot create", path);
    int err = WriteAll(fd, bytes.data(), bytes.size());
    const char* what = "cannot write";
    if (err == 0 && sync && fdatasync(fd) != 0) {
      err = errno;
      what = "cannot fdatasync";
    }
    // close reports a deferred write error (NFS, quota) only here.
    if (close(fd) != 0 && err == 0) {
      err = errno;
      what = "cannot close";
    }
    if (err != 0) return ErrnoStatus(err, what, path);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadSmallFile(const std::string& path,
                                            int64_t max_bytes) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
    struct stat st;
    if (fstat(fd, &st) != 0) {
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, "cannot stat", path);
    }
    if (S_ISDIR(st.st_mode)) {
      close(fd);
      return ErrnoStatus(EISDIR, "cannot read", path);
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
      if (got == 0) break;  // shrank since the fstat
      done += static_cast<size_t>(got);
    }
    close(fd);
    out.resize(done);
    return out;
  }

  absl::Status CreateDir(const std::string& path) override {
    if (mkdir(path.c_str(), 0755) == 0) return absl::OkStatus();
    const int err = errno;
    if (err == EEXIST) {
      struct stat st;
      if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        return absl::OkStatus();
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot create directory ", path, ": it exists and is not one"));
    }
    return ErrnoStatus(err, "cannot create directory", path);
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, "cannot open directory", dir);
    const int rc = fsync(fd);
    const int err = errno;
    close(fd);
    if (rc != 0) return ErrnoStatus(err, "cannot fsync directory", dir);
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) == 0) return absl::OkStatus();
    return ErrnoStatus(errno, "cannot rename", absl::StrCat(from, " to ", to));
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (unlink(path.c_str()) == 0) return absl::OkStatus();
    return ErrnoStatus(errno, "cannot remove", path);
  }

  absl::Status RemoveTree(const std::string& path) override {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return ErrnoStatus(ec.value(), "cannot remove", path);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<DirEntry>> ListDir(const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return ErrnoStatus(errno, "cannot list directory", dir);
    std::vector<DirEntry> out;
    while (true) {
      errno = 0;
      const dirent* e = readdir(d);
      if (e == nullptr) break;
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      bool is_dir = e->d_type == DT_DIR;
      // Some file systems leave the type unknown; a link counts as its target.
      if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
        struct stat st;
        const std::string full = absl::StrCat(dir, "/", name);
        is_dir = stat(full.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
      }
      out.push_back({name, is_dir});
    }
    const int err = errno;
    closedir(d);
    if (err != 0) return ErrnoStatus(err, "cannot list directory", dir);
    std::sort(out.begin(), out.end(), [](const DirEntry& a, const DirEntry& b) {
      return a.name < b.name;
    });
    return out;
  }
};

}  // namespace

absl::Status ErrnoStatus(int err, absl::string_view what,
                         absl::string_view path) {
  const std::string msg =
      absl::StrCat(what, " ", path, ": ", std::strerror(err));
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

FileSystem* FileSystem::Default() {
  static FileSystem* const fs = new PosixFileSystem();
  return fs;
}

absl::Status FileSystem::WriteFileAtomically(const std::string& path,
                                             absl::string_view bytes) {
  const std::string tmp = path + ".tmp";
  absl::Status status = WriteFile(tmp, bytes, /*sync=*/true);
  if (status.ok()) status = Rename(tmp, path);
  if (!status.ok()) {
    RemoveFile(tmp).IgnoreError();  // may not exist; the error says why
    return status;
  }
  return SyncDir(DirOf(path));
}

absl::Status FileSystem::CreateDirs(const std::string& path) {
  // Each prefix ending before a '/', then the whole path.
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    if (path[slash - 1] == '/') continue;  // "a//b"
    absl::Status status = CreateDir(path.substr(0, slash));
    if (!status.ok()) return status;
  }
  if (!path.empty() && path.back() == '/') return absl::OkStatus();
  return CreateDir(path);
}

}  // namespace recps
