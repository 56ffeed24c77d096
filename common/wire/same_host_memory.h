// Same-host rows (docs/shard-server.md, "Same-host rows"): when a worker and
// a shard server share a host, the bytes of a push and of a lookup's answer
// (the rows: nearly all of a call's bytes) go through a sealed memfd of the
// worker's process that the server maps, instead of through the socket, TLS
// and both sides' copies in and out of it. gRPC still carries the call, its
// credentials, roles and limits, and a v1::SharedBuffer naming the memory.
//
// One owner for both ends of the rule: the client makes SharedMemory, the
// server maps a peer's through SharedMemoryMapper, which accepts only what
// SharedMemory makes (a memfd named kSharedMemoryName, its size sealed, owned
// by the server's user) for a caller on a loopback address.
#ifndef RECPS_COMMON_WIRE_SAME_HOST_MEMORY_H_
#define RECPS_COMMON_WIRE_SAME_HOST_MEMORY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "recps/v1/shard.pb.h"

namespace recps {

inline constexpr char kSharedMemoryName[] = "recps-rows";
// How a server's FAILED_PRECONDITION for memory it cannot map starts: the
// caller then sends the same request as bytes.
inline constexpr char kSameHostRefusal[] = "same-host rows: ";

// A sealed memfd of this process, mapped: its size can neither shrink nor
// grow, so a server that maps it can never fault past its end.
class SharedMemory {
 public:
  // At least `bytes` (rounded up to whole pages).
  static absl::StatusOr<std::unique_ptr<SharedMemory>> Create(size_t bytes);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }
  // [offset, offset + length) of it, named for a server on this host.
  v1::SharedBuffer Describe(size_t offset, size_t length) const;

 private:
  SharedMemory(int fd, char* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  const int fd_;
  char* const data_;
  const size_t size_;
};

// Maps the SharedMemory of processes on this host, checked and cached (a
// mapping is kept while it is used, and dropped after `idle` unused or when
// more than `max_mappings` are held). Thread-safe.
class SharedMemoryMapper {
 public:
  // Bytes of a peer's memory, valid while `keep` is held.
  struct Region {
    std::shared_ptr<void> keep;
    char* data = nullptr;
    size_t length = 0;
    // This call mapped the memfd (no call before it had, or its mapping
    // had been let go): a steady caller reuses its memfds, so new
    // mappings stop once its calls have warmed up.
    bool newly_mapped = false;
  };

  explicit SharedMemoryMapper(absl::Duration idle = absl::Seconds(10),
                              size_t max_mappings = 1024)
      : idle_(idle), max_mappings_(max_mappings) {}

  // FAILED_PRECONDITION, saying why, when the buffer cannot be mapped (not
  // on this host, not such a memfd, another user's, out of its bounds).
  absl::StatusOr<Region> Map(const v1::SharedBuffer& buffer);

  size_t mappings() const;

 private:
  struct Mapping;
  struct Entry {
    std::shared_ptr<Mapping> mapping;
    absl::Time last_used;
  };
  // Drops mappings idle since before `now - idle_`, then the least recently
  // used beyond max_mappings_.
  void Evict(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration idle_;
  const size_t max_mappings_;
  mutable absl::Mutex mu_;
  // By (device, inode): a memfd reopened through another fd is the same.
  absl::flat_hash_map<std::pair<dev_t, ino_t>, Entry> mappings_ ABSL_GUARDED_BY(mu_);
};

// Whether a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000",
// "unix:/path") is on this host's loopback.
bool IsLoopbackPeer(absl::string_view grpc_peer);
// Whether a server address ("127.0.0.1:5000", "localhost:5000",
// "[::1]:5000", "unix:/path") names this host's loopback.
bool IsLoopbackAddress(absl::string_view address);

}  // namespace recps

#endif  // RECPS_COMMON_WIRE_SAME_HOST_MEMORY_H_
