// Minimal process logging to stderr: "2026-12-02T12:00:00.123Z I shard] msg".
// Enough for daemons whose output a launcher or Kubernetes collects.
#ifndef RECPS_COMMON_LOG_H_
#define RECPS_COMMON_LOG_H_

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"

namespace recps {

enum class LogLevel { kInfo, kWarning, kError };

// Sets the tag every line carries (the program name); call once in main.
void SetLogTag(absl::string_view tag);
// The tag of the calling thread's lines (overrides SetLogTag's): a process
// that runs several workers' ranks as threads names each rank.
void SetThreadLogTag(absl::string_view tag);
void LogLine(LogLevel level, absl::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) {
  LogLine(LogLevel::kInfo, absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  LogLine(LogLevel::kWarning, absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  LogLine(LogLevel::kError, absl::StrCat(args...));
}

}  // namespace recps

#endif  // RECPS_COMMON_LOG_H_
