// The rule both ends of same-host rows follow (common/wire/same_host_memory.h):
// what a client makes, a server maps; anything else is refused, saying why.
#include "common/wire/same_host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"

namespace recps {
namespace {

using ::testing::HasSubstr;

v1::SharedBuffer BufferOf(int fd, size_t length) {
  v1::SharedBuffer buffer;
  buffer.set_pid(static_cast<uint32_t>(getpid()));
  buffer.set_fd(fd);
  buffer.set_length(length);
  return buffer;
}

TEST(SharedMemoryTest, MappedBySizeAndSharedBothWays) {
  absl::StatusOr<std::unique_ptr<SharedMemory>> memory = SharedMemory::Create(100);
  ASSERT_TRUE(memory.ok()) << memory.status();
  ASSERT_GE((*memory)->size(), 100u);
  std::memcpy((*memory)->data(), "rows", 4);

  SharedMemoryMapper mapper;
  absl::StatusOr<SharedMemoryMapper::Region> region =
      mapper.Map((*memory)->Describe(0, 100));
  ASSERT_TRUE(region.ok()) << region.status();
  ASSERT_EQ(region->length, 100u);
  EXPECT_EQ(std::string(region->data, 4), "rows");
  // Another mapping of the same pages: a write through it is seen here.
  std::memcpy(region->data + 4, "!", 1);
  EXPECT_EQ((*memory)->data()[4], '!');

  // Mapped once, however often it is named; an offset within it is honoured.
  absl::StatusOr<SharedMemoryMapper::Region> again =
      mapper.Map((*memory)->Describe(2, 10));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(std::string(again->data, 2), "ws");
  EXPECT_EQ(mapper.mappings(), 1u);
}

TEST(SharedMemoryTest, OutsideItsBoundsIsRefused) {
  auto memory = SharedMemory::Create(4096);
  ASSERT_TRUE(memory.ok());
  SharedMemoryMapper mapper;
  const size_t size = (*memory)->size();
  auto past_end = mapper.Map((*memory)->Describe(size - 10, 20));
  EXPECT_TRUE(absl::IsFailedPrecondition(past_end.status()));
  EXPECT_THAT(past_end.status().message(), HasSubstr("outside"));
  v1::SharedBuffer wraps = (*memory)->Describe(0, 10);
  wraps.set_offset(~uint64_t{0} - 4);
  EXPECT_TRUE(absl::IsFailedPrecondition(mapper.Map(wraps).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(mapper.Map((*memory)->Describe(0, 0)).status()));
}

// A server must never write to (or read) a file a caller names: only the
// sealed memfds SharedMemory makes.
TEST(SharedMemoryTest, OnlySealedRecpsMemfdsAreMapped) {
  SharedMemoryMapper mapper;
  ::recps::testing::TempDir dir;
  const std::string path = dir.WriteFile("key.pem", std::string(8192, 'k'));
  const int file = open(path.c_str(), O_RDWR);
  ASSERT_GE(file, 0);
  auto regular = mapper.Map(BufferOf(file, 100));
  EXPECT_TRUE(absl::IsFailedPrecondition(regular.status()));
  EXPECT_THAT(regular.status().message(), HasSubstr("not a recps shared buffer"));
  close(file);

  const int unsealed = memfd_create(kSharedMemoryName, MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 8192), 0);
  auto not_sealed = mapper.Map(BufferOf(unsealed, 100));
  EXPECT_THAT(not_sealed.status().message(), HasSubstr("not sealed"));
  close(unsealed);

  const int other = memfd_create("other-app", MFD_ALLOW_SEALING);
  ASSERT_GE(other, 0);
  ASSERT_EQ(ftruncate(other, 8192), 0);
  ASSERT_EQ(fcntl(other, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  auto other_name = mapper.Map(BufferOf(other, 100));
  EXPECT_THAT(other_name.status().message(), HasSubstr("not a recps shared buffer"));
  close(other);

  v1::SharedBuffer nobody = BufferOf(3, 100);
  nobody.set_pid(0x7ffffff0);  // no such process
  auto missing = mapper.Map(nobody);
  EXPECT_TRUE(absl::IsFailedPrecondition(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("opening /proc/"));
  EXPECT_EQ(mapper.mappings(), 0u);
}

TEST(SharedMemoryTest, MappingsAreBoundedAndAHeldRegionStaysValid) {
  SharedMemoryMapper mapper(absl::Hours(1), /*max_mappings=*/1);
  auto a = SharedMemory::Create(4096);
  auto b = SharedMemory::Create(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  std::memcpy((*a)->data(), "a", 1);
  auto region_a = mapper.Map((*a)->Describe(0, 1));
  ASSERT_TRUE(region_a.ok());
  ASSERT_TRUE(mapper.Map((*b)->Describe(0, 1)).ok());
  EXPECT_EQ(mapper.mappings(), 1u);
  // Dropped from the cache, still mapped for the call that holds it.
  EXPECT_EQ(region_a->data[0], 'a');
}

TEST(SharedMemoryTest, LoopbackPeersAndAddresses) {
  EXPECT_TRUE(IsLoopbackPeer("ipv4:127.0.0.1:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv4:127.1.2.3:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:[::1]:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:%5B::1%5D:5000"));
  EXPECT_TRUE(IsLoopbackPeer("ipv6:[::ffff:127.0.0.1]:5000"));
  EXPECT_TRUE(IsLoopbackPeer("unix:/tmp/s"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:10.0.0.7:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv6:[fe80::1]:5000"));
  EXPECT_FALSE(IsLoopbackPeer("ipv4:1127.0.0.1:5000"));

  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:5000"));
  EXPECT_TRUE(IsLoopbackAddress("localhost:5000"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:5000"));
  EXPECT_TRUE(IsLoopbackAddress("ipv4:127.0.0.1:5000"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.7:5000"));
  EXPECT_FALSE(IsLoopbackAddress("shard-0.recps.svc:5000"));
  EXPECT_FALSE(IsLoopbackAddress("localhost.example.com:5000"));
}

}  // namespace
}  // namespace recps
