#include "client/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace recps::client {

absl::StatusOr<ChildProcess> ChildProcess::Spawn(
    const std::string& binary, const std::vector<std::string>& args,
    const std::string& log_path, const std::vector<std::string>& env) {
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
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  // The launcher blocks SIGINT/SIGTERM to take them with sigtimedwait; the
  // child must start with them unblocked and at their defaults.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  ChildProcess child;
  child.name_ = std::filesystem::path(binary).filename().string();
  const int err = posix_spawn(&child.pid_, binary.c_str(), &actions, &attr,
                              argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    child.pid_ = -1;
    return absl::NotFoundError(absl::StrCat("cannot start ", binary, ": ",
                                            std::strerror(err)));
  }
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

}  // namespace recps::client
