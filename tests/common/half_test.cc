#include "common/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/wire/wire_format.h"
#include "gtest/gtest.h"

namespace recps {
namespace {

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h << " -> " << f;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);   // overflow to +inf
  EXPECT_EQ(FloatToHalf(-1e6f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e-9f), 0x0000);  // underflow to +0
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties go to even (1).
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 0x3c01 and 0x3c02: even is 0x3c02.
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above the halfway point rounds up.
  EXPECT_EQ(FloatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  // Subnormal halfway: 1.5 * 2^-24 rounds to 2 * 2^-24 (even).
  EXPECT_EQ(FloatToHalf(1.5f * std::ldexp(1.0f, -24)), 0x0002);
  EXPECT_EQ(FloatToHalf(0.5f * std::ldexp(1.0f, -24)), 0x0000);
}

TEST(Bf16, RoundTripAndRounding) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBf16(f), b);
  }
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even.
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

}  // namespace
}  // namespace recps

// The bulk wire codec (F16C where the CPU has it) against the scalar
// conversions, bit for bit: every half, and floats over the whole range
// (fp16 subnormals, the overflow boundary, NaN payloads, infinities),
// with lengths that leave a scalar tail.
namespace recps {
namespace {

TEST(WireHalf, BulkWideningMatchesHalfToFloatForEveryHalf) {
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);
  for (size_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> out(all.size());
  WidenRows(reinterpret_cast<const char*>(all.data()), all.size(), v1::ROW_ENCODING_FLOAT16,
            out.data());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(FloatBits(out[i]), FloatBits(HalfToFloat(all[i]))) << "half 0x" << std::hex
                                                                 << all[i];
  }
}

TEST(WireHalf, BulkNarrowingMatchesFloatToHalf) {
  std::vector<float> in;
  for (uint32_t bits = 0; bits < 0xff800000u; bits += 0x1357u) {
    in.push_back(BitsToFloat(bits));
    in.push_back(-BitsToFloat(bits));
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 1e9f, 6.1e-5f, 5.96e-8f, 2.98e-8f, 2.99e-8f,
                  0.0f, -0.0f}) {
    in.push_back(f);
    in.push_back(-f);
  }
  for (uint32_t bits : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu,
                        0x7fa00000u}) {
    in.push_back(BitsToFloat(bits));
  }
  in.push_back(1.0f);  // a tail
  std::string out;
  EncodeRows(in.data(), in.size(), v1::ROW_ENCODING_FLOAT16, &out);
  ASSERT_EQ(out.size(), 2 * in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, out.data() + 2 * i, 2);
    ASSERT_EQ(h, FloatToHalf(in[i])) << "float bits 0x" << std::hex << FloatBits(in[i]);
  }
  std::vector<float> back(in.size());
  ASSERT_TRUE(DecodeRows(out, v1::ROW_ENCODING_FLOAT16, in.size(), "t", back.data()).ok());
}

}  // namespace
}  // namespace recps
