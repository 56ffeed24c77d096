// IEEE fp16 and bfloat16 <-> float conversions on raw 16-bit patterns, usable
// from host and device code. Rows and wire payloads store the bits as
// uint16_t so that no compiler-specific half type leaks into interfaces.
#ifndef RECPS_COMMON_HALF_H_
#define RECPS_COMMON_HALF_H_

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/hashing.h"
#include "common/host_device.h"

namespace recps {

RECPS_HOST_DEVICE inline uint32_t FloatBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

RECPS_HOST_DEVICE inline float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

// Exact: every fp16 value is a float.
RECPS_HOST_DEVICE inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return BitsToFloat(sign);
  // Subnormal: value = mant * 2^-24.
  const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

// Round to nearest even, overflow to infinity, NaN stays NaN.
RECPS_HOST_DEVICE inline uint16_t FloatToHalf(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  }
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504
  if (ax < 0x38800000u) {                         // fp16 subnormal or zero
    // Scale so the result's units are 2^-24, then round to nearest even.
    const float a = BitsToFloat(ax) * 16777216.0f;  // exact (power of two)
    uint32_t q = static_cast<uint32_t>(a);
    const float rem = a - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits.
  uint32_t h = ((ax >> 13) - (112u << 10));
  const uint32_t dropped = ax & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

// Exact: bfloat16 is the top half of a float.
RECPS_HOST_DEVICE inline float Bf16ToFloat(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even; NaN stays NaN.
RECPS_HOST_DEVICE inline uint16_t FloatToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);
  }
  const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

// Stochastic rounding of v to fp16 (kFp16) or bf16: to one of its two
// 16-bit neighbours with probability proportional to closeness, so
// E[result] = v and updates below half an ulp survive in expectation. The
// random bits are a hash of v's bits and the column: deterministic (replays,
// resumes, every ISA and the GPU give the same bits) without any state.
// Non-finite values, exact values and values whose other neighbour would
// overflow round to nearest even. `static`: the kernels' per-ISA
// translation units each keep their own copy (an inline function's one
// shared copy could be the one built for a wider ISA).
template <bool kFp16>
RECPS_HOST_DEVICE static inline uint16_t RoundStochastic(float v, int column) {
  const auto finite = [](float f) {
    return (FloatBits(f) & 0x7f800000u) != 0x7f800000u;
  };
  const uint16_t h = kFp16 ? FloatToHalf(v) : FloatToBf16(v);
  const float hv = kFp16 ? HalfToFloat(h) : Bf16ToFloat(h);
  if (hv == v || !finite(hv) || !finite(v)) return h;
  // The neighbour on v's other side: one step of magnitude up or down
  // (h's magnitude is not 0 when stepping down: |v| < |hv| then).
  const uint16_t other =
      fabsf(v) > fabsf(hv) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
  const float ov = kFp16 ? HalfToFloat(other) : Bf16ToFloat(other);
  if (!finite(ov)) return h;
  const float p = fabsf(v - hv) / fabsf(ov - hv);
  const uint64_t r =
      Mix64((uint64_t{FloatBits(v)} << 32) | static_cast<uint32_t>(column));
  const float u = static_cast<float>(r >> 40) * (1.0f / 16777216.0f);
  return u < p ? other : h;
}

}  // namespace recps

#endif  // RECPS_COMMON_HALF_H_
