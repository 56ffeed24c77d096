// The process's resident memory, for tests that check what a store commits
// or gives back.
#ifndef RECPS_TESTS_TESTING_RESIDENT_MEMORY_H_
#define RECPS_TESTS_TESTING_RESIDENT_MEMORY_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>

namespace recps::testing {

// Resident bytes from /proc/self/statm, or -1 when it cannot be read.
inline int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_RESIDENT_MEMORY_H_
