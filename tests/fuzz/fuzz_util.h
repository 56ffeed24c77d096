// Small helpers of the fuzz targets whose code under test reads files: a
// private directory in memory (/dev/shm when present) made once per
// process, and writing a file there.
#ifndef RECPS_TESTS_FUZZ_FUZZ_UTIL_H_
#define RECPS_TESTS_FUZZ_FUZZ_UTIL_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace recps::fuzz {

// Created on first use, removed at exit (with what it holds).
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string templ = std::string(base) + "/recps-fuzz-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr) std::abort();
    auto* d = new std::string(templ);
    std::atexit([] { std::system(("rm -rf '" + *dir + "'").c_str()); });
    return d;
  }();
  return *dir;
}

inline void WriteFile(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) std::abort();
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n <= 0) std::abort();
    p += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace recps::fuzz

#endif  // RECPS_TESTS_FUZZ_FUZZ_UTIL_H_
