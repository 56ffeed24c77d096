#include "worker/worker_setup.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/job_config.h"
#include "common/log.h"
#include "common/rpc/retry.h"
#include "worker/worker_flags.h"

namespace recps::worker {

// Where this worker resumes: GetResumeState, retried while the coordinator
// answers UNAVAILABLE (starting, or its shard servers still restoring) until
// --resume_timeout.
absl::StatusOr<v1::GetResumeStateResponse> FetchResumeState(
    client::CoordinatorClient& coordinator, int rank) {
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_resume_timeout);
  rpc::Backoff backoff;
  for (;;) {
    absl::StatusOr<v1::GetResumeStateResponse> r = coordinator.GetResumeState(
        rank, std::max(absl::ZeroDuration(), give_up - absl::Now()));
    if (r.ok() || r.status().code() != absl::StatusCode::kUnavailable ||
        absl::Now() >= give_up) {
      return r;
    }
    absl::SleepFor(std::min(backoff.Next(), std::max(absl::ZeroDuration(),
                                                     give_up - absl::Now())));
  }
}

// This host's address on the route to `host_port`'s host (a UDP "connect"
// sends nothing; it only picks the route), so peers on other machines can
// reach the Gloo transport. 127.0.0.1 when that fails.
std::string LocalAddressToward(const std::string& host_port) {
  std::string host = host_port.substr(0, host_port.rfind(':'));
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || found == nullptr) {
    return "127.0.0.1";
  }
  std::string local = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  char text[INET_ADDRSTRLEN];
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
      inet_ntop(AF_INET, &me.sin_addr, text, sizeof(text)) != nullptr) {
    local = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return local;
}

// "8G", "512M", "1024" -> bytes (K, M, G, T: powers of 1024).
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  int shift = 0;
  if (!text.empty()) {
    switch (text.back()) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      case 'T': case 't': shift = 40; break;
      default: break;
    }
    if (shift != 0) text.remove_suffix(1);
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1 || value > (int64_t{1} << (62 - shift))) {
    return absl::InvalidArgumentError("expected a size such as 8G, 512M or 1048576");
  }
  return value << shift;
}

// Refuses a job whose estimated memory need exceeds --memory_limit, else
// MemAvailable (checked before anything large is allocated, so a too-large
// job fails with the setting to lower instead of std::bad_alloc).
absl::Status CheckMemory(const v1::JobConfig& job) {
  if (const std::string limit = absl::GetFlag(FLAGS_memory_limit); !limit.empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(limit);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--memory_limit=", limit, ": ", bytes.status().message()));
    }
    return config::CheckWorkerMemory(job, *bytes, absl::StrCat("--memory_limit=", limit));
  }
  std::ifstream in("/proc/meminfo");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<int64_t> available = config::ParseMemAvailable(text.str());
  if (!available.ok()) {
    LogWarning("cannot read MemAvailable from /proc/meminfo; the job's memory need "
               "is not checked (set --memory_limit)");
    return absl::OkStatus();
  }
  return config::CheckWorkerMemory(job, *available, "MemAvailable in /proc/meminfo");
}

}  // namespace recps::worker
