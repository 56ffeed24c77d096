// Vector row primitives for the per-ISA kernel builds. Included only from
// *_simd.cc files, which cmake compiles once per ISA (RECPS_ISA_NS set); the
// body picks intrinsics from the -m flags of that build. Every variant
// rounds exactly like the scalar loop (no FMA), so results are bit-identical
// across ISAs.
#ifndef RECPS_ISA_NS
#error "row_math_simd.h belongs to a *_simd.cc built by recps_add_isa_variants"
#endif

#include <cstdint>

#include "common/half.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace recps::kernels::RECPS_ISA_NS {
namespace {

// out[j] += w * row[j] for j < dim; with kAssign, out[j] = w * row[j]
// (the first term of a sum: saves zeroing the output first).
template <bool kAssign = false>
inline void AxpyRow(float* __restrict out, const float* __restrict row,
                    float w, int dim) {
  int j = 0;
#if defined(__AVX512F__)
  const __m512 wv = _mm512_set1_ps(w);
  for (; j + 16 <= dim; j += 16) {
    const __m512 p = _mm512_mul_ps(wv, _mm512_loadu_ps(row + j));
    _mm512_storeu_ps(out + j,
                     kAssign ? p : _mm512_add_ps(_mm512_loadu_ps(out + j), p));
  }
  if (j < dim) {
    const __mmask16 m = static_cast<__mmask16>((1u << (dim - j)) - 1);
    const __m512 p = _mm512_mul_ps(wv, _mm512_maskz_loadu_ps(m, row + j));
    _mm512_mask_storeu_ps(
        out + j, m,
        kAssign ? p : _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + j), p));
    return;
  }
#elif defined(__AVX2__)
  const __m256 wv = _mm256_set1_ps(w);
  for (; j + 8 <= dim; j += 8) {
    const __m256 p = _mm256_mul_ps(wv, _mm256_loadu_ps(row + j));
    _mm256_storeu_ps(out + j,
                     kAssign ? p : _mm256_add_ps(_mm256_loadu_ps(out + j), p));
  }
#endif
  for (; j < dim; ++j) out[j] = kAssign ? w * row[j] : out[j] + w * row[j];
}

// AxpyRow for fp16 rows: out[j] (+)= w * half_to_float(row[j]).
template <bool kAssign = false>
inline void AxpyRowHalf(float* __restrict out, const uint16_t* __restrict row,
                        float w, int dim) {
  int j = 0;
#if defined(__AVX512F__)
  const __m512 wv = _mm512_set1_ps(w);
  // maskz form: GCC 12 warns (falsely) about the plain _mm512_cvtph_ps.
  for (; j + 16 <= dim; j += 16) {
    const __m512 r = _mm512_maskz_cvtph_ps(0xffff,
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + j)));
    const __m512 p = _mm512_mul_ps(wv, r);
    _mm512_storeu_ps(out + j,
                     kAssign ? p : _mm512_add_ps(_mm512_loadu_ps(out + j), p));
  }
  if (j < dim) {
    const __mmask16 m = static_cast<__mmask16>((1u << (dim - j)) - 1);
    const __m512 r =
        _mm512_maskz_cvtph_ps(m, _mm256_maskz_loadu_epi16(m, row + j));
    const __m512 p = _mm512_mul_ps(wv, r);
    _mm512_mask_storeu_ps(
        out + j, m,
        kAssign ? p : _mm512_add_ps(_mm512_maskz_loadu_ps(m, out + j), p));
    return;
  }
#elif defined(__AVX2__)
  const __m256 wv = _mm256_set1_ps(w);
  for (; j + 8 <= dim; j += 8) {
    const __m256 r = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + j)));
    const __m256 p = _mm256_mul_ps(wv, r);
    _mm256_storeu_ps(out + j,
                     kAssign ? p : _mm256_add_ps(_mm256_loadu_ps(out + j), p));
  }
#endif
  for (; j < dim; ++j) {
    const float p = w * HalfToFloat(row[j]);
    out[j] = kAssign ? p : out[j] + p;
  }
}

// Starts loading every cache line of a row that will be needed soon.
inline void PrefetchRow(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

// Same for a row that will be written.
inline void PrefetchRowForWrite(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 1, 3);
}

}  // namespace
}  // namespace recps::kernels::RECPS_ISA_NS
