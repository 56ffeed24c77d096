// CRC-32C (Castagnoli), the checksum of checkpoint files: the SSE4.2
// instruction where the CPU has it, a table otherwise (same values).
#ifndef RECPS_SERVER_CHECKPOINT_CRC32C_H_
#define RECPS_SERVER_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/thread_pool.h"

namespace recps::server::checkpoint {

// Extends `crc` (the CRC of the bytes before; 0 to start) over data[0, n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The CRC of A followed by B, from crc_a = CRC(A), crc_b = CRC(B) and B's
// length (zlib's crc32_combine for the Castagnoli polynomial): parts of a
// file checksummed in parallel give the whole file's CRC.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

struct FileCrc {
  uint64_t size_bytes = 0;
  uint32_t crc32c = 0;
};

// Size and CRC-32C of the file at `path`, read sequentially. NOT_FOUND or
// PERMISSION_DENIED / UNAVAILABLE naming the file when it cannot be read.
// drop_cache: tell the kernel the pages are not needed afterwards.
absl::StatusOr<FileCrc> ChecksumFile(const std::string& path,
                                     bool drop_cache = false);
// The same, with the file split into one range per thread of `pool`, read
// (pread) and checksummed in parallel; the plain read when pool is null or
// the file is small.
absl::StatusOr<FileCrc> ChecksumFileParallel(const std::string& path,
                                             ThreadPool* pool);

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_CRC32C_H_
