#include "client/lookup_response_reader.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"

namespace recps::client::internal {
namespace lookup_wire {

absl::Status Malformed(const char* what) {
  return absl::InternalError(absl::StrCat("malformed lookup response: ", what));
}

}  // namespace lookup_wire

namespace {

using namespace lookup_wire;  // NOLINT: the tags of this file's format


// One row from the wire into `out`. REQUIRES: encoding is FLOAT32, FLOAT16 or
// BFLOAT16 (the client normalises UNSPECIFIED).
void DecodeRow(const char* src, int dim, v1::RowEncoding encoding, float* out) {
  if (encoding == v1::ROW_ENCODING_FLOAT32) {
    std::memcpy(out, src, sizeof(float) * dim);
    return;
  }
  WidenRows(src, dim, encoding, out);
}


}  // namespace

using lookup_wire::Malformed;


absl::Status TableRowsReader::Read(const RowsTarget& t) {
  uint32_t length;
  if (!in_.ReadVarint32(&length)) return Malformed("bad table length");
  const auto limit = in_.PushLimit(static_cast<int>(length));
  row_bytes_ = static_cast<size_t>(t.plan.dim) * width_;
  name_.clear();
  dim_ = 0;
  have_name_ = have_dim_ = partial_ = false;
  rows_bytes_ = 0;
  positions_.clear();
  for (uint32_t tag = in_.ReadTag(); tag != 0; tag = in_.ReadTag()) {
    RETURN_IF_ERROR(ReadField(tag, t));
  }
  if (!in_.ConsumedEntireMessage()) return Malformed("bad table");
  in_.PopLimit(limit);
  if (name_ != *t.plan.name || dim_ != t.plan.dim) return WrongTable(t);
  if (partial_ ? rows_bytes_ != row_bytes_ * positions_.size()
               : rows_bytes_ != row_bytes_ * t.n) {  // no rows field at all
    return absl::InternalError(absl::StrCat(
        "table '", *t.plan.name, "': ", rows_bytes_, " bytes of rows for ",
        t.n, " ids of ", row_bytes_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status TableRowsReader::ReadField(uint32_t tag, const RowsTarget& t) {
  if (tag == kTableTag) {
    if (!WireFormatLite::ReadString(&in_, &name_)) {
      return Malformed("bad table name");
    }
    have_name_ = true;
  } else if (tag == kDimTag) {
    uint32_t v;
    if (!in_.ReadVarint32(&v)) return Malformed("bad dim");
    dim_ = static_cast<int32_t>(v);
    have_dim_ = true;
  } else if (tag == kUpdatedOnlyTag) {
    uint64_t v;
    if (!in_.ReadVarint64(&v)) return Malformed("bad updated_only");
    if (!updated_only_asked_ && v != 0) {
      return Malformed("updated_only not asked for");
    }
    partial_ = v != 0;
  } else if (tag == kPositionsTag) {
    return ReadPositions(t);
  } else if (tag == kRowsTag) {
    return ReadRows(t);
  } else if (!WireFormatLite::SkipField(&in_, tag)) {
    return Malformed("bad field in a table");
  }
  return absl::OkStatus();
}

absl::Status TableRowsReader::ReadPositions(const RowsTarget& t) {
  uint32_t size;
  if (!in_.ReadVarint32(&size) || size % sizeof(int32_t) != 0 ||
      size / sizeof(int32_t) > static_cast<uint32_t>(t.n)) {
    return Malformed("bad positions");
  }
  positions_.resize(size / sizeof(int32_t));
  if (!in_.ReadRaw(positions_.data(), static_cast<int>(size))) {
    return Malformed("truncated positions");
  }
  for (const int32_t q : positions_) {
    if (q < 0 || q >= t.n) return Malformed("position out of range");
  }
  return absl::OkStatus();
}

absl::Status TableRowsReader::ReadRows(const RowsTarget& t) {
  // Name and dim come first from a real server (fields in number order):
  // refuse a wrong table before writing any of its rows.
  if ((have_name_ && name_ != *t.plan.name) ||
      (have_dim_ && dim_ != t.plan.dim)) {
    return WrongTable(t);
  }
  uint32_t size;
  if (!in_.ReadVarint32(&size)) return Malformed("bad rows length");
  rows_bytes_ = size;
  if (width_ != sizeof(float)) row_scratch_.resize(row_bytes_);
  if (partial_) {
    if (rows_bytes_ != row_bytes_ * positions_.size()) {
      return absl::InternalError(absl::StrCat(
          "table '", *t.plan.name, "': ", rows_bytes_, " bytes of rows for ",
          positions_.size(), " updated positions of ", row_bytes_, " bytes"));
    }
    // Only the updated rows, one per position, one at a time.
    for (const int32_t q : positions_) {
      if (!ReadRow(t, t.routed[q])) return Malformed("truncated rows");
    }
    return absl::OkStatus();
  }
  if (rows_bytes_ != row_bytes_ * t.n) {
    return absl::InternalError(absl::StrCat(
        "table '", *t.plan.name, "': ", rows_bytes_, " bytes of rows for ",
        t.n, " ids of ", row_bytes_, " bytes"));
  }
  for (int32_t k = 0; k < t.n;) {
    if (const int32_t copied = CopyDirectRows(t, k); copied > 0) {
      k += copied;
      continue;
    }
    // A row split across slices, or rows to decode: one at a time.
    if (!ReadRow(t, t.routed[k++])) return Malformed("truncated rows");
  }
  return absl::OkStatus();
}

int32_t TableRowsReader::CopyDirectRows(const RowsTarget& t, int32_t k) {
  // float32 rows are copied straight from gRPC's slice, in runs:
  // consecutive rows that land consecutively in the caller's buffer (one
  // table looked up into one array, the usual case) take one memcpy, not
  // one ReadRaw each.
  const void* direct = nullptr;
  int avail = 0;
  if (width_ != sizeof(float) || !in_.GetDirectBufferPointer(&direct, &avail) ||
      static_cast<size_t>(avail) < row_bytes_) {
    return 0;
  }
  const auto here = static_cast<int32_t>(
      std::min<size_t>(t.n - k, static_cast<size_t>(avail) / row_bytes_));
  const char* src = static_cast<const char*>(direct);
  char* run_dst = nullptr;
  const char* run_src = nullptr;
  size_t run = 0;
  for (int32_t r = 0; r < here; ++r) {
    const int32_t u = t.routed[k + r];
    const char* row = src + r * row_bytes_;
    // Every unique id has at least one position. The plan's columns start
    // at column_offset.
    char* dst = reinterpret_cast<char*>(t.data.dst[t.data.dst_begin[u]] +
                                        t.plan.column_offset);
    if (dst != run_dst + run) {
      if (run > 0) std::memcpy(run_dst, run_src, run);
      run_dst = dst;
      run_src = row;
      run = 0;
    }
    run += row_bytes_;
    CopyToRepeats(t, u, row);
  }
  if (run > 0) std::memcpy(run_dst, run_src, run);
  in_.Skip(static_cast<int>(static_cast<size_t>(here) * row_bytes_));
  return here;
}

bool TableRowsReader::ReadRow(const RowsTarget& t, int32_t u) {
  float* first = t.data.dst[t.data.dst_begin[u]] + t.plan.column_offset;
  if (width_ == sizeof(float)) {
    if (!in_.ReadRaw(first, static_cast<int>(row_bytes_))) return false;
  } else {
    if (!in_.ReadRaw(row_scratch_.data(), static_cast<int>(row_bytes_))) {
      return false;
    }
    DecodeRow(row_scratch_.data(), t.plan.dim, encoding_, first);
  }
  CopyToRepeats(t, u, first);
  return true;
}

void TableRowsReader::CopyToRepeats(const RowsTarget& t, int32_t u,
                                    const void* row) {
  for (int32_t d = t.data.dst_begin[u] + 1; d < t.data.dst_begin[u + 1]; ++d) {
    std::memcpy(t.data.dst[d] + t.plan.column_offset, row,
                sizeof(float) * t.plan.dim);
  }
}

absl::Status TableRowsReader::WrongTable(const RowsTarget& t) const {
  return absl::InternalError(absl::StrCat(
      "response table ", t.index, " is '", name_, "' of dim ", dim_,
      ", expected '", *t.plan.name, "' of dim ", t.plan.dim));
}

}  // namespace recps::client::internal
