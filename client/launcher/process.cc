#include "client/launcher/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace recps::client {

absl::StatusOr<pid_t> SpawnProcess(const std::string& binary,
                                   const std::vector<std::string>& args,
                                   const std::string& log_path,
                                   const std::vector<std::string>& env) {
  // Everything the child needs is built before fork: between fork and exec
  // only async-signal-safe calls are allowed (the parent has threads).
  std::vector<std::string> all = {binary};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Inherited variables that `env` does not name, then `env`.
  std::vector<std::string> env_storage;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var(*e);
    const std::string name = var.substr(0, var.find('='));
    bool replaced = false;
    for (const std::string& mine : env) {
      if (mine.substr(0, mine.find('=')) == name) replaced = true;
    }
    if (!replaced) env_storage.push_back(var);
  }
  env_storage.insert(env_storage.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  // The child reports a failed exec through a close-on-exec pipe: EOF
  // means the exec succeeded.
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(report[0]);
    close(report[1]);
    return absl::InternalError(absl::StrCat("cannot start ", binary, ": fork: ",
                                            std::strerror(err)));
  }
  if (pid == 0) {
    int err = 0;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    // The launcher blocks SIGINT/SIGTERM to take them with sigtimedwait;
    // the child must start with them unblocked and at their defaults.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    if (!log_path.empty()) {
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0) {
        err = errno;
        (void)!write(report[1], &err, sizeof(err));
        _exit(127);
      }
      close(fd);
    }
    execve(binary.c_str(), argv.data(), envp.data());
    err = errno;
    (void)!write(report[1], &err, sizeof(err));
    _exit(127);
  }
  close(report[1]);
  int child_errno = 0;
  ssize_t n;
  do {
    n = read(report[0], &child_errno, sizeof(child_errno));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    waitpid(pid, nullptr, 0);
    return absl::NotFoundError(absl::StrCat("cannot start ", binary, ": ",
                                            std::strerror(child_errno)));
  }
  return pid;
}

absl::StatusOr<ChildProcess> ChildProcess::Spawn(
    const std::string& binary, const std::vector<std::string>& args,
    const std::string& log_path, const std::vector<std::string>& env) {
  absl::StatusOr<pid_t> pid = SpawnProcess(binary, args, log_path, env);
  if (!pid.ok()) return pid.status();
  ChildProcess child;
  child.pid_ = *pid;
  child.name_ = std::filesystem::path(binary).filename().string();
  return child;
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(std::exchange(other.pid_, -1)), name_(std::move(other.name_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& other) noexcept {
  if (this != &other) {
    if (running()) (void)Stop(absl::Seconds(5));
    pid_ = std::exchange(other.pid_, -1);
    name_ = std::move(other.name_);
  }
  return *this;
}

ChildProcess::~ChildProcess() {
  if (running()) (void)Stop(absl::Seconds(5));
}

void ChildProcess::Signal(int signal) {
  if (pid_ > 0) kill(pid_, signal);
}

absl::StatusOr<int> ChildProcess::Poll() {
  if (pid_ < 0) return absl::FailedPreconditionError("not running");
  int status;
  if (waitpid(pid_, &status, WNOHANG) != pid_) {
    return absl::UnavailableError(absl::StrCat(name_, " is still running"));
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    absl::StatusOr<int> code = Poll();
    if (code.ok() || absl::IsFailedPrecondition(code.status())) return code;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name_, " did not exit in time"));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

absl::StatusOr<int> ChildProcess::Stop(absl::Duration grace) {
  if (pid_ < 0) return absl::FailedPreconditionError("not running");
  kill(pid_, SIGTERM);
  absl::StatusOr<int> code = Wait(grace);
  if (code.ok()) return code;
  kill(pid_, SIGKILL);
  return Wait(absl::Seconds(5));
}

std::string SelfDirectory() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "." : self.parent_path().string();
}

std::string FindBinary(const std::string& name, const std::string& bin_dir) {
  std::vector<std::string> dirs;
  if (!bin_dir.empty()) dirs.push_back(bin_dir);
  dirs.push_back(SelfDirectory());  // the build puts all four binaries in build/bin
  for (const std::string& d : dirs) {
    const std::string path = d + "/" + name;
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

}  // namespace recps::client
