// CRC-32C (Castagnoli), the checksum of checkpoint files: the SSE4.2
// instruction where the CPU has it, a table otherwise (same values).
#ifndef RECPS_SERVER_CHECKPOINT_CRC32C_H_
#define RECPS_SERVER_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace recps::server::checkpoint {

// Extends `crc` (the CRC of the bytes before; 0 to start) over data[0, n).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

struct FileCrc {
  uint64_t size_bytes = 0;
  uint32_t crc32c = 0;
};

// Size and CRC-32C of the file at `path`, read sequentially. NOT_FOUND or
// PERMISSION_DENIED / UNAVAILABLE naming the file when it cannot be read.
// drop_cache: tell the kernel the pages are not needed afterwards.
absl::StatusOr<FileCrc> ChecksumFile(const std::string& path,
                                     bool drop_cache = false);

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_CRC32C_H_
