// The process's resident memory, for tests that check what a store commits
// or gives back.
#ifndef RECPS_TESTS_TESTING_RESIDENT_MEMORY_H_
#define RECPS_TESTS_TESTING_RESIDENT_MEMORY_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace recps::testing {

// Resident bytes of this process (or of process `pid`) from
// /proc/<pid>/statm, or -1 when it cannot be read.
inline int64_t ResidentBytes(pid_t pid = 0) {
  long pages = 0, resident = 0;
  char path[64];
  if (pid == 0) {
    std::snprintf(path, sizeof(path), "/proc/self/statm");
  } else {
    std::snprintf(path, sizeof(path), "/proc/%d/statm", static_cast<int>(pid));
  }
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_RESIDENT_MEMORY_H_
