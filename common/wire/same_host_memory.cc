#include "common/wire/same_host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace recps {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

absl::Status Errno(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Closes a descriptor on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemory>> SharedMemory::Create(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = std::max(page, (bytes + page - 1) / page * page);
  Fd fd{memfd_create(kSharedMemoryName, MFD_CLOEXEC | MFD_ALLOW_SEALING)};
  if (fd.fd < 0) return Errno("memfd_create");
  if (ftruncate(fd.fd, static_cast<off_t>(size)) != 0) {
    return Errno(absl::StrCat("sizing a ", size, "-byte memfd"));
  }
  if (fcntl(fd.fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    return Errno("sealing a memfd");
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
  if (data == MAP_FAILED) return Errno(absl::StrCat("mapping a ", size, "-byte memfd"));
  std::unique_ptr<SharedMemory> memory(
      new SharedMemory(fd.fd, static_cast<char*>(data), size));
  fd.fd = -1;  // owned by `memory` now
  return memory;
}

SharedMemory::~SharedMemory() {
  munmap(data_, size_);
  close(fd_);
}

v1::SharedBuffer SharedMemory::Describe(size_t offset, size_t length) const {
  v1::SharedBuffer buffer;
  buffer.set_pid(static_cast<uint32_t>(getpid()));
  buffer.set_fd(fd_);
  buffer.set_offset(offset);
  buffer.set_length(length);
  return buffer;
}

// A peer's whole memfd, mapped.
struct SharedMemoryMapper::Mapping {
  char* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data != nullptr) munmap(data, size);
  }
};

absl::StatusOr<SharedMemoryMapper::Region> SharedMemoryMapper::Map(
    const v1::SharedBuffer& buffer) {
  if (buffer.pid() == 0 || buffer.fd() < 0 || buffer.length() == 0 ||
      buffer.offset() + buffer.length() < buffer.offset()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared buffer with pid ", buffer.pid(), ", fd ", buffer.fd(), ", offset ",
        buffer.offset(), ", length ", buffer.length(), " names no memory"));
  }
  // Opened first, then checked through our own descriptor: what the
  // caller's fd names cannot change between the checks and the mapping.
  const std::string path = absl::StrCat("/proc/", buffer.pid(), "/fd/", buffer.fd());
  Fd fd{open(path.c_str(), O_RDWR | O_CLOEXEC)};
  if (fd.fd < 0) {
    return Errno(absl::StrCat("opening ", path,
                              " (a caller on another host, in another pid namespace, "
                              "or of another user)"));
  }
  char target[128] = {};
  const std::string self = absl::StrCat("/proc/self/fd/", fd.fd);
  const ssize_t n = readlink(self.c_str(), target, sizeof(target) - 1);
  const std::string expected = absl::StrCat("/memfd:", kSharedMemoryName, " ");
  if (n < 0 || !absl::StartsWith(absl::string_view(target, static_cast<size_t>(n)),
                                 expected)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a recps shared buffer (", kSharedMemoryName, " memfd)"));
  }
  const int seals = fcntl(fd.fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": the memfd's size is not sealed"));
  }
  struct stat st {};
  if (fstat(fd.fd, &st) != 0) return Errno(absl::StrCat("fstat of ", path));
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " belongs to user ", st.st_uid, ", not this server's"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (buffer.offset() + buffer.length() > size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shared buffer [", buffer.offset(), ", ", buffer.offset() + buffer.length(),
        ") lies outside its ", size, "-byte memfd"));
  }
  const absl::Time now = absl::Now();
  const std::pair<dev_t, ino_t> key(st.st_dev, st.st_ino);
  std::shared_ptr<Mapping> mapping;
  bool newly_mapped = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = mappings_.find(key);
    if (it != mappings_.end()) {
      it->second.last_used = now;
      mapping = it->second.mapping;
    }
  }
  if (mapping == nullptr) {
    void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.fd, 0);
    if (data == MAP_FAILED) return Errno(absl::StrCat("mapping ", path));
    mapping = std::make_shared<Mapping>();
    mapping->data = static_cast<char*>(data);
    mapping->size = size;
    absl::MutexLock lock(&mu_);
    Entry& entry = mappings_[key];
    // Another call may have mapped it meanwhile: keep one.
    if (entry.mapping == nullptr) {
      entry.mapping = mapping;
      newly_mapped = true;
    }
    mapping = entry.mapping;
    entry.last_used = now;
    Evict(now);
  }
  Region region;
  region.newly_mapped = newly_mapped;
  region.data = mapping->data + buffer.offset();
  region.length = buffer.length();
  region.keep = std::move(mapping);
  return region;
}

void SharedMemoryMapper::Evict(absl::Time now) {
  std::vector<std::pair<absl::Time, std::pair<dev_t, ino_t>>> by_age;
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    if (now - it->second.last_used > idle_) {
      mappings_.erase(it++);  // unmapped once its last user lets go
    } else {
      by_age.emplace_back(it->second.last_used, it->first);
      ++it;
    }
  }
  if (by_age.size() <= max_mappings_) return;
  std::sort(by_age.begin(), by_age.end());
  for (size_t i = 0; i + max_mappings_ < by_age.size(); ++i) {
    mappings_.erase(by_age[i].second);
  }
}

size_t SharedMemoryMapper::mappings() const {
  absl::MutexLock lock(&mu_);
  return mappings_.size();
}

bool IsLoopbackPeer(absl::string_view peer) {
  if (absl::StartsWith(peer, "unix:")) return true;
  if (absl::ConsumePrefix(&peer, "ipv4:")) return absl::StartsWith(peer, "127.");
  if (absl::ConsumePrefix(&peer, "ipv6:")) {
    return absl::StartsWith(peer, "[::1]") || absl::StartsWith(peer, "%5B::1%5D") ||
           absl::StartsWith(peer, "[::ffff:127.") ||
           absl::StartsWith(peer, "%5B::ffff:127.");
  }
  return false;
}

bool IsLoopbackAddress(absl::string_view address) {
  absl::ConsumePrefix(&address, "ipv4:");
  absl::ConsumePrefix(&address, "dns:");
  absl::ConsumePrefix(&address, "///");
  return absl::StartsWith(address, "unix:") || absl::StartsWith(address, "127.") ||
         absl::StartsWith(address, "localhost:") || absl::StartsWith(address, "[::1]") ||
         address == "localhost";
}

}  // namespace recps
