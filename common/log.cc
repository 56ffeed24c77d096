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
}  // namespace

void SetLogTag(absl::string_view tag) { Tag() = std::string(tag); }

void LogLine(LogLevel level, absl::string_view message) {
  const char letter = level == LogLevel::kInfo      ? 'I'
                      : level == LogLevel::kWarning ? 'W'
                                                    : 'E';
  const std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
      " ", std::string(1, letter), " ", Tag(), "] ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace recps
