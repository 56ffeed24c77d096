// The worker's pool of same-host memfds (common/wire/same_host_buffers.h).
#include "common/wire/same_host_buffers.h"

#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace recps {
namespace {

// A step holds many memfds at once (its lookup parts): the next step gets
// the same ones back, however many there were.
TEST(SameHostBuffersTest, AsManyAsWereHeldAtOnceComeBack) {
  SameHostBuffers pool;
  for (int step = 0; step < 5; ++step) {
    std::vector<std::unique_ptr<SharedMemory>> held;
    for (int i = 0; i < 40; ++i) {
      auto m = pool.Acquire(i % 2 == 0 ? 1000 : (3u << 20));
      ASSERT_TRUE(m.ok()) << m.status();
      held.push_back(*std::move(m));
    }
    for (auto& m : held) pool.Release(std::move(m));
    EXPECT_EQ(pool.created(), 40u) << "step " << step;
    EXPECT_EQ(pool.free_count(), 40u);
  }
}

TEST(SameHostBuffersTest, TheSmallestLargeEnoughComesFirst) {
  SameHostBuffers pool;
  auto big = pool.Acquire(5u << 20);
  auto small = pool.Acquire(1);
  ASSERT_TRUE(big.ok() && small.ok());
  EXPECT_EQ((*big)->size(), 8u << 20);  // powers of two
  EXPECT_EQ((*small)->size(), SameHostBuffers::kMinBytes);
  pool.Release(*std::move(big));
  pool.Release(*std::move(small));
  auto again = pool.Acquire(100);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->size(), SameHostBuffers::kMinBytes);
  EXPECT_EQ(pool.created(), 2u);
}

}  // namespace
}  // namespace recps
