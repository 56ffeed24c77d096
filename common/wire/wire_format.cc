#include "common/wire/wire_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"

#if defined(__x86_64__) && defined(RECPS_HAVE_X86_KERNELS)
#include <cpuid.h>
#include <immintrin.h>
#define RECPS_WIRE_F16C 1
#endif

namespace recps {
namespace {

#ifdef RECPS_WIRE_F16C
bool HasF16c() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
           (ecx & bit_AVX) != 0;
  }();
  return has;
}

// Eight at a time; a block with a NaN or an infinity (exponent all ones)
// goes through the scalar conversion, whose NaN payloads F16C would not
// reproduce. Returns how many values were converted (a multiple of 8).
__attribute__((target("avx,f16c"))) size_t FloatsToHalvesF16c(const float* in, size_t n,
                                                              char* out) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    const __m256i e =
        _mm256_castps_si256(_mm256_and_ps(v, _mm256_castsi256_ps(exp_mask)));
    // Integer compare without AVX2: the two halves with SSE.
    const __m128i lo = _mm_cmpeq_epi32(_mm256_castsi256_si128(e), _mm256_castsi256_si128(exp_mask));
    const __m128i hi = _mm_cmpeq_epi32(_mm256_extractf128_si256(e, 1),
                                       _mm256_castsi256_si128(exp_mask));
    if (_mm_movemask_epi8(_mm_or_si128(lo, hi)) != 0) {
      for (size_t k = i; k < i + 8; ++k) {
        const uint16_t bits = FloatToHalf(in[k]);
        std::memcpy(out + 2 * k, &bits, 2);
      }
      continue;
    }
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) size_t HalvesToFloatsF16c(const char* in, size_t n,
                                                              float* out) {
  const __m128i exp_mask = _mm_set1_epi16(0x7c00);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i));
    if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, exp_mask), exp_mask)) != 0) {
      for (size_t k = i; k < i + 8; ++k) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * k, 2);
        out[k] = HalfToFloat(bits);
      }
      continue;
    }
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  return i;
}
#endif

}  // namespace

void WidenRows(const char* src, size_t n, v1::RowEncoding encoding, float* out) {
  size_t i = 0;
  if (encoding == v1::ROW_ENCODING_FLOAT16) {
#ifdef RECPS_WIRE_F16C
    if (HasF16c()) i = HalvesToFloatsF16c(src, n, out);
#endif
    for (; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      out[i] = HalfToFloat(h);
    }
    return;
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    out[i] = Bf16ToFloat(h);
  }
}

int BytesPerElement(v1::RowEncoding encoding) {
  switch (encoding) {
    case v1::ROW_ENCODING_UNSPECIFIED:
    case v1::ROW_ENCODING_FLOAT32:
      return 4;
    case v1::ROW_ENCODING_FLOAT16:
    case v1::ROW_ENCODING_BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

void EncodeIds(absl::Span<const int64_t> ids, std::string* out) {
  out->resize(ids.size() * sizeof(int64_t));
  if (!ids.empty()) std::memcpy(out->data(), ids.data(), out->size());
}

absl::Status DecodeIds(const std::string& bytes, const char* what,
                       std::vector<int64_t>* scratch,
                       absl::Span<const int64_t>* ids) {
  if (bytes.size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", bytes.size(), " bytes of ids is not a whole number of "
        "8-byte int64 values"));
  }
  const size_t n = bytes.size() / sizeof(int64_t);
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(int64_t) == 0) {
    *ids = absl::MakeConstSpan(reinterpret_cast<const int64_t*>(bytes.data()), n);
    return absl::OkStatus();
  }
  scratch->resize(n);
  std::memcpy(scratch->data(), bytes.data(), bytes.size());
  *ids = absl::MakeConstSpan(*scratch);
  return absl::OkStatus();
}

void EncodeRows(const float* values, size_t n, v1::RowEncoding encoding,
                std::string* out) {
  out->resize(n * BytesPerElement(encoding));
  EncodeRows(values, n, encoding, out->data());
}

void EncodeRows(const float* values, size_t n, v1::RowEncoding encoding,
                char* out) {
  if (BytesPerElement(encoding) == 4) {
    if (n > 0) std::memcpy(out, values, n * 4);
    return;
  }
  if (encoding == v1::ROW_ENCODING_FLOAT16) {
    size_t i = 0;
#ifdef RECPS_WIRE_F16C
    if (HasF16c()) i = FloatsToHalvesF16c(values, n, out);
#endif
    for (; i < n; ++i) {
      const uint16_t bits = FloatToHalf(values[i]);
      std::memcpy(out + 2 * i, &bits, 2);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t bits = FloatToBf16(values[i]);
      std::memcpy(out + 2 * i, &bits, 2);
    }
  }
}

absl::Status DecodeRows(const std::string& bytes, v1::RowEncoding encoding,
                        size_t n, const char* what, float* out) {
  const int width = BytesPerElement(encoding);
  if (width == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": unknown row encoding ", static_cast<int>(encoding)));
  }
  if (bytes.size() != n * width) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": expected ", n, " values of ", width, " bytes (", n * width,
        " bytes), got ", bytes.size(), " bytes"));
  }
  if (width == 4) {
    if (n > 0) std::memcpy(out, bytes.data(), n * 4);
    return absl::OkStatus();
  }
  WidenRows(bytes.data(), n, encoding, out);
  return absl::OkStatus();
}

}  // namespace recps
