#include "server/store/stored_row.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/optimizer_registry.h"
#include "common/row_init.h"
#include "kernels/row_init.h"

namespace recps::server {

StoredRowFormat StoredRowFormat::For(const config::TableSpec& spec) {
  StoredRowFormat f;
  f.dim = spec.dim;
  f.kind = spec.optimizer.kind;
  f.precision = spec.precision;
  f.stride = FusedRowStride(f.kind, f.dim);
  f.row_words = FusedRowStride(f.kind, f.dim, f.precision);
  f.state_offset = FusedRowStateOffset(f.dim, f.precision);
  return f;
}

void StoredRowFormat::ReadWeights(const float* row, float* out) const {
  if (!Is16Bit()) {
    std::memcpy(out, row, sizeof(float) * dim);
  } else {
    WidenRows(reinterpret_cast<const char*>(row), dim, Encoding16(), out);
  }
}

void StoredRowFormat::ExportRow(const float* row, float* out) const {
  if (!Is16Bit()) {
    std::memcpy(out, row, sizeof(float) * stride);
    return;
  }
  const int64_t state = FusedRowStateWidth(kind, dim);
  ReadWeights(row, out);
  std::memcpy(out + dim, row + state_offset, sizeof(float) * state);
  std::fill(out + dim + state, out + stride, 0.0f);
}

void StoredRowFormat::ImportRow(const float* src, float* dst) const {
  const int64_t state = FusedRowStateWidth(kind, dim);
  if (!Is16Bit()) {
    std::memcpy(dst, src, sizeof(float) * (dim + state));
    std::fill(dst + dim + state, dst + stride, 0.0f);
    return;
  }
  StoreWeights(src, dst);
  std::memcpy(dst + state_offset, src + dim, sizeof(float) * state);
  std::fill(dst + state_offset + state, dst + row_words, 0.0f);
}

void StoredRowFormat::StoreWeights(const float* weights, float* row) const {
  if (!Is16Bit()) {
    std::memcpy(row, weights, sizeof(float) * dim);
    return;
  }
  char* out = reinterpret_cast<char*>(row);
  EncodeRows(weights, dim, Encoding16(), out);
  std::memset(out + 2 * int64_t{dim}, 0, state_offset * 4 - 2 * int64_t{dim});
}

void StoredRowFormat::InitStoredRow(const RowInit& init, uint64_t seed,
                                    uint64_t table_key, int64_t id,
                                    float* row) const {
  if (!Is16Bit()) {
    kernels::InitRow(init, seed, table_key, id, dim, row);
    InitFusedRowState(kind, dim, row);
    const int64_t used = dim + FusedRowStateWidth(kind, dim);
    std::fill(row + used, row + row_words, 0.0f);
    return;
  }
  // One buffer per thread, grown to the widest table (<= 4096 floats).
  thread_local std::vector<float> weights;
  if (weights.size() < static_cast<size_t>(dim)) weights.resize(dim);
  kernels::InitRow(init, seed, table_key, id, dim, weights.data());
  StoreWeights(weights.data(), row);
  std::memset(row + state_offset, 0, sizeof(float) * (row_words - state_offset));
}

absl::Status ValidateImportedRow(const config::TableSpec& spec,
                                 const float* row, int64_t id,
                                 size_t position) {
  const int dim = spec.dim;
  // (first column, columns, what they are, whether they must be >= 0):
  // the weights, then the optimizer's state parts as its registry entry
  // lays them out (a step count is bits, not a float: not checked).
  using Part = std::tuple<int64_t, int64_t, const char*, bool>;
  constexpr int kMaxParts = 8;
  Part parts[kMaxParts];
  int num_parts = 0;
  parts[num_parts++] = Part{0, dim, "weight", false};
  const OptimizerInfo* info = FindOptimizer(spec.optimizer.kind);
  if (info == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", spec.name, "': optimizer kind ",
        static_cast<int>(spec.optimizer.kind), " is not registered"));
  }
  int64_t column = dim;
  for (const OptimizerStatePart& part : info->row_state) {
    const int64_t width = part.Width(dim);
    if (part.values != OptimizerStatePart::Values::kCount && num_parts < kMaxParts) {
      parts[num_parts++] = Part{
          column, width, part.what,
          part.values == OptimizerStatePart::Values::kNonNegativeFloat};
    }
    column += width;
  }
  // Fast path, branch-free so it vectorises: a restore validates every
  // row. Non-finite: exponent bits all set; negative: sign bit set on
  // anything but -0.0 (which is >= 0). Only a bad row takes the loop below,
  // which names the column.
  uint32_t bad = 0;
  for (int k = 0; k < num_parts; ++k) {
    const auto [first, n, what, non_negative] = parts[k];
    const uint32_t sign_mask = non_negative ? 0x80000000u : 0u;
    for (int64_t c = first; c < first + n; ++c) {
      uint32_t bits;
      std::memcpy(&bits, row + c, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
      bad |= static_cast<uint32_t>((bits & sign_mask) != 0 &&
                                   bits != 0x80000000u);
    }
  }
  // fp16 weights: a finite float that rounds past 65504 would be stored as
  // infinity (bf16 has fp32's range).
  constexpr uint32_t kFp16Overflow = 0x477ff000u;  // rounds to infinity
  const bool fp16 = spec.precision == RowPrecision::kFp16;
  if (fp16) {
    for (int c = 0; c < dim; ++c) {
      uint32_t bits;
      std::memcpy(&bits, row + c, sizeof(bits));
      bad |= static_cast<uint32_t>((bits & 0x7fffffffu) >= kFp16Overflow);
    }
  }
  if (bad == 0) return absl::OkStatus();
  if (fp16) {
    for (int c = 0; c < dim; ++c) {
      uint32_t bits;
      std::memcpy(&bits, row + c, sizeof(bits));
      if ((bits & 0x7fffffffu) >= kFp16Overflow &&
          (bits & 0x7f800000u) != 0x7f800000u) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", spec.name, "': row of id ", id, " (position ",
            position, ") has weight ", row[c], " at column ", c,
            "; the table stores FP16 weights, which hold at most 65504"));
      }
    }
  }
  for (int k = 0; k < num_parts; ++k) {
    const auto [first, n, what, non_negative] = parts[k];
    for (int64_t c = first; c < first + n; ++c) {
      const float v = row[c];
      if (std::isfinite(v) && (!non_negative || v >= 0)) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name, "': row of id ", id, " (position ",
          position, ") has ", what, " ", v, " at column ", c,
          non_negative ? "; it must be finite and >= 0"
                       : "; it must be finite"));
    }
  }
  return absl::OkStatus();
}

}  // namespace recps::server
