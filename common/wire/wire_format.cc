#include "common/wire/wire_format.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"

namespace recps {

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
    for (size_t i = 0; i < n; ++i) {
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
  const char* src = bytes.data();
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    out[i] = encoding == v1::ROW_ENCODING_FLOAT16 ? HalfToFloat(h) : Bf16ToFloat(h);
  }
  return absl::OkStatus();
}

}  // namespace recps
