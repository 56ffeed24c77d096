// AlignedBuffer's page kinds (common/aligned_buffer.h): what the kernel is
// told about each buffer, read back from /proc/self/smaps.
#include "common/aligned_buffer.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace recps {
namespace {

// The VmFlags of the mapping that holds `address`, or "" when not found.
std::string VmFlagsOf(const void* address) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(address);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(AlignedBufferTest, HugePagesOnlyWhereAsked) {
  auto huge = AlignedBuffer::Allocate(8 << 20);
  auto small = AlignedBuffer::Allocate(8 << 20, AlignedBuffer::Pages::kSmall);
  ASSERT_TRUE(huge.ok() && small.ok());
  const std::string huge_flags = VmFlagsOf(huge->data());
  const std::string small_flags = VmFlagsOf(small->data());
  ASSERT_FALSE(huge_flags.empty());
  ASSERT_FALSE(small_flags.empty());
  // "hg": MADV_HUGEPAGE; "nh": MADV_NOHUGEPAGE (a copy-on-write index that
  // pushes touch a page at a time must not fault 2 MiB pages in).
  EXPECT_NE(huge_flags.find(" hg"), std::string::npos) << huge_flags;
  EXPECT_NE(small_flags.find(" nh"), std::string::npos) << small_flags;
  EXPECT_EQ(small_flags.find(" hg"), std::string::npos) << small_flags;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small->data()) % AlignedBuffer::kHugePage, 0u);
}

}  // namespace
}  // namespace recps
