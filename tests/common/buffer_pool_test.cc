#include "common/buffer_pool.h"

#include <utility>

#include "common/aligned_buffer.h"
#include "gtest/gtest.h"

namespace recps {
namespace {

TEST(BufferPoolTest, ReusesTheSmallestBufferThatFits) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  const char* small_data = nullptr;
  const char* large_data = nullptr;
  {
    auto small = pool->Take(1000);
    auto large = pool->Take(size_t{8} << 20);
    ASSERT_TRUE(small.ok() && large.ok());
    EXPECT_GE(small->size(), 1000u);
    small_data = small->data();
    large_data = large->data();
    small->data()[999] = 'x';  // writable
  }
  // Kept in whole huge pages (what they map).
  EXPECT_EQ(pool->free_bytes(), AlignedBuffer::kHugePage + (size_t{8} << 20));
  auto a = pool->Take(500);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->data(), small_data);
  auto b = pool->Take(size_t{1} << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), large_data);
  EXPECT_EQ(pool->free_bytes(), 0u);
}

TEST(BufferPoolTest, KeepsAtMostItsLimitDroppingSmallBuffersFirst) {
  auto pool = BufferPool::Create(size_t{6} << 20);
  {
    auto huge = pool->Take(size_t{8} << 20);  // over the limit: never kept
    ASSERT_TRUE(huge.ok());
  }
  EXPECT_EQ(pool->free_bytes(), 0u);
  {
    auto a = pool->Take(size_t{2} << 20);
    auto b = pool->Take(size_t{4} << 20);
    auto c = pool->Take(size_t{2} << 20);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    *a = PooledBuffer();  // returned first
    *b = PooledBuffer();
  }  // c comes back over the limit: a 2 MiB buffer goes
  EXPECT_EQ(pool->free_bytes(), size_t{6} << 20);
  auto big = pool->Take(size_t{4} << 20);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(pool->free_bytes(), size_t{2} << 20);
}

// A lookup's response differs by a few bytes from one step to the next
// (ids per table, names); each step mapped and faulted in a fresh buffer
// (5.8% of an in-process S-p20 worker's CPU) because the free ones were a few
// bytes too small.
TEST(BufferPoolTest, NearlyEqualSizesReuseOneBuffer) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  const char* first = nullptr;
  {
    auto a = pool->Take(4045897);
    ASSERT_TRUE(a.ok());
    EXPECT_GE(a->size(), 4045897u);
    first = a->data();
  }
  auto b = pool->Take(4046409);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
  EXPECT_GE(b->size(), 4046409u);
}

TEST(BufferPoolTest, BuffersOutliveThePoolHandle) {
  auto pool = BufferPool::Create(size_t{1} << 20);
  auto buffer = pool->Take(100);
  ASSERT_TRUE(buffer.ok());
  pool.reset();
  buffer->data()[0] = 'x';
  PooledBuffer moved = *std::move(buffer);  // returned to the pool at the end
  EXPECT_EQ(moved.data()[0], 'x');
}

}  // namespace
}  // namespace recps
