#include "common/log.h"

#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace recps {
namespace {
std::string& Tag() {
  static auto* tag = new std::string("recps");
  return *tag;
}
// Set by SetThreadLogTag: several ranks in one process log as themselves.
thread_local std::string* thread_tag = nullptr;
}  // namespace

void SetLogTag(absl::string_view tag) { Tag() = std::string(tag); }

void SetThreadLogTag(absl::string_view tag) {
  if (thread_tag == nullptr) thread_tag = new std::string;
  *thread_tag = std::string(tag);
}

void LogLine(LogLevel level, absl::string_view message) {
  const char letter = level == LogLevel::kInfo      ? 'I'
                      : level == LogLevel::kWarning ? 'W'
                                                    : 'E';
  const std::string& tag = thread_tag != nullptr ? *thread_tag : Tag();
  const std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " ", std::string(1, letter), " ", tag, "] ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace recps
