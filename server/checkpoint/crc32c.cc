#include "server/checkpoint/crc32c.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/checkpoint/file_util.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace recps::server::checkpoint {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[i] = c;
  }
  return t;
}

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc,
                                                       const uint8_t* p,
                                                       size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}

bool HaveSse42() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  return (c & bit_SSE4_2) != 0;
}
#endif

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  static const bool sse42 = HaveSse42();
  crc = sse42 ? ExtendSse42(crc, p, n) : ExtendPortable(crc, p, n);
#else
  crc = ExtendPortable(crc, p, n);
#endif
  return ~crc;
}

namespace {

uint32_t Gf2MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void Gf2MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2MatrixTimes(mat, mat[n]);
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  if (len_b == 0) return crc_a;
  uint32_t even[32];  // operator for 2^k zero bits, k even
  uint32_t odd[32];   // k odd
  odd[0] = kPoly;     // one zero bit
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n) {
    odd[n] = row;
    row <<= 1;
  }
  Gf2MatrixSquare(even, odd);  // two zero bits
  Gf2MatrixSquare(odd, even);  // four
  // Apply len_b zero bytes to crc_a, one bit of len_b per squaring.
  do {
    Gf2MatrixSquare(even, odd);
    if (len_b & 1) crc_a = Gf2MatrixTimes(even, crc_a);
    len_b >>= 1;
    if (len_b == 0) break;
    Gf2MatrixSquare(odd, even);
    if (len_b & 1) crc_a = Gf2MatrixTimes(odd, crc_a);
    len_b >>= 1;
  } while (len_b != 0);
  return crc_a ^ crc_b;
}

absl::StatusOr<FileCrc> ChecksumFileParallel(const std::string& path,
                                             ThreadPool* pool) {
  constexpr uint64_t kMinPart = uint64_t{16} << 20;
  struct stat st;
  if (pool == nullptr || pool->num_threads() < 2 ||
      stat(path.c_str(), &st) != 0 ||
      static_cast<uint64_t>(st.st_size) < 2 * kMinPart) {
    return ChecksumFile(path);
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "cannot stat", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const int64_t parts = std::min<int64_t>(
      pool->num_threads(), static_cast<int64_t>(size / kMinPart));
  const uint64_t per = (size + parts - 1) / parts;
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<uint32_t> crcs(parts, 0);
  std::vector<uint64_t> lens(parts, 0);
  std::vector<int> errs(parts, 0);
  pool->ParallelFor(parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<char> buf(size_t{4} << 20);
    for (int64_t p = begin; p < end; ++p) {
      uint64_t at = per * p;
      const uint64_t stop = std::min(size, at + per);
      while (at < stop) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), stop - at));
        const ssize_t got = pread(fd, buf.data(), want, static_cast<off_t>(at));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
          // 0: the file shrank under us; the size check names it.
          errs[p] = got < 0 ? errno : 0;
          break;
        }
        crcs[p] = Crc32cExtend(crcs[p], buf.data(), static_cast<size_t>(got));
        lens[p] += static_cast<uint64_t>(got);
        at += static_cast<uint64_t>(got);
      }
    }
  });
  close(fd);
  FileCrc out;
  for (int64_t p = 0; p < parts; ++p) {
    if (errs[p] != 0) return ErrnoStatus(errs[p], "cannot read", path);
    out.crc32c = Crc32cCombine(out.crc32c, crcs[p], lens[p]);
    out.size_bytes += lens[p];
  }
  return out;
}

absl::StatusOr<FileCrc> ChecksumFile(const std::string& path, bool drop_cache) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open", path);
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(size_t{4} << 20);
  FileCrc out;
  while (true) {
    const ssize_t got = read(fd, buf.data(), buf.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, "cannot read", path);
    }
    if (got == 0) break;
    out.crc32c = Crc32cExtend(out.crc32c, buf.data(), static_cast<size_t>(got));
    out.size_bytes += static_cast<uint64_t>(got);
  }
  if (drop_cache) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
  return out;
}

}  // namespace recps::server::checkpoint
