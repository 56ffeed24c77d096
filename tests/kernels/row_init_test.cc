// kernels::InitRow, the per-ISA build of common/row_init.h's formula: the
// same bits as recps::InitRow on every ISA this CPU runs, and the values
// rows have always had (checkpoints and bit-identical runs depend on them).
#include "kernels/row_init.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace recps::kernels {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

TEST(RowInitTest, EveryIsaGivesTheReferenceBits) {
  std::mt19937_64 rng(3);
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (!CpuIsaSupported(isa)) continue;
    for (int dim : {1, 3, 8, 15, 16, 17, 64, 100, 256}) {
      for (int offset : {0, 5}) {
        RowInit init;
        init.a = -0.25f;
        init.b = 0.75f;
        init.column_offset = offset;
        for (int k = 0; k < 50; ++k) {
          const int64_t id = static_cast<int64_t>(rng());
          const uint64_t seed = rng(), key = rng();
          std::vector<float> want(dim), got(dim, -1.f);
          recps::InitRow(init, seed, key, id, dim, want.data());
          kernels::InitRow(init, seed, key, id, dim, got.data(), isa);
          ASSERT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * dim), 0)
              << "isa " << static_cast<int>(isa) << " dim " << dim << " offset " << offset;
        }
      }
    }
  }
}

// Values from before the formula was shared with the per-ISA build
// (2026-12-07): a change here would change every table's initial rows.
TEST(RowInitTest, TheValuesRowsHaveAlwaysHad) {
  struct Golden {
    int64_t id;
    uint32_t first, last;
  };
  const Golden golden[] = {{0, 0xbcacbe1b, 0x3cbae012},
                           {7, 0x3d36f7bd, 0xbc695064},
                           {123456789, 0x3c8b4682, 0x3d2a7c59},
                           {-5, 0xbbce6970, 0xbcb2edeb}};
  RowInit init;  // uniform [-0.05, 0.05)
  for (const Golden& g : golden) {
    float row[64];
    kernels::InitRow(init, 42, 0xabcdef, g.id, 64, row);
    EXPECT_EQ(Bits(row[0]), g.first) << g.id;
    EXPECT_EQ(Bits(row[63]), g.last) << g.id;
  }
  init.column_offset = 5;
  float column5;
  kernels::InitRow(init, 42, 0xabcdef, 7, 1, &column5);
  EXPECT_EQ(Bits(column5), 0xbd20ee6au);
}

TEST(RowInitTest, NormalRowsAreTheReferences) {
  RowInit init;
  init.distribution = RowInit::Distribution::kNormal;
  init.a = 0.f;
  init.b = 0.01f;
  std::vector<float> want(33), got(33);
  recps::InitRow(init, 1, 2, 3, 33, want.data());
  kernels::InitRow(init, 1, 2, 3, 33, got.data());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), sizeof(float) * 33), 0);
}

}  // namespace
}  // namespace recps::kernels
