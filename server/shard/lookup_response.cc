#include "server/shard/lookup_response.h"

#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace recps::server {
namespace {

// Wire tags: LookupResponse.tables = 1, TableRows.table = 1 (length
// delimited), TableRows.dim = 2 (varint), TableRows.rows = 3 (length
// delimited).
constexpr uint8_t kTablesTag = (1 << 3) | 2;
constexpr uint8_t kNameTag = (1 << 3) | 2;
constexpr uint8_t kDimTag = (2 << 3) | 0;
constexpr uint8_t kRowsTag = (3 << 3) | 2;
// TableRows.positions = 4 (length delimited), updated_only = 5 (varint),
// written before the rows.
constexpr uint8_t kPositionsTag = (4 << 3) | 2;
constexpr uint8_t kUpdatedOnlyTag = (5 << 3) | 0;
// LookupResponse.incarnation = 2 (fixed64).
constexpr uint8_t kIncarnationTag = (2 << 3) | 1;
constexpr size_t kIncarnationBytes = 1 + sizeof(uint64_t);
// LookupResponse.applied_step = 3 (varint; int64: a negative value takes
// ten bytes).
constexpr uint8_t kAppliedStepTag = (3 << 3) | 0;
// Rows start on a cache line: the store copies whole rows into them.
constexpr size_t kRowsAlignment = 64;

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

char* PutVarint(uint64_t v, char* p) {
  while (v >= 0x80) {
    *p++ = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<char>(v);
  return p;
}

// int32 fields are varints of their sign-extended 64-bit value.
uint64_t Int32Varint(int v) {
  return static_cast<uint64_t>(static_cast<int64_t>(v));
}

// Bytes of a TableRows message without its rows (proto3: empty and zero
// fields are not written).
size_t TableFieldsSize(const SerializedLookupResponse::Table& t) {
  size_t n = 0;
  if (!t.name.empty()) n += 1 + VarintSize(t.name.size()) + t.name.size();
  if (t.dim != 0) n += 1 + VarintSize(Int32Varint(t.dim));
  if (t.updated_only) n += 2;
  if (!t.positions.empty()) {
    n += 1 + VarintSize(t.positions.size()) + t.positions.size();
  }
  if (t.rows_bytes != 0) n += 1 + VarintSize(t.rows_bytes);
  return n;
}

}  // namespace

size_t SerializedLookupResponse::Layout(absl::Span<const Table> tables, size_t alignment,
                                        uint64_t incarnation,
                                        std::optional<int64_t> applied_step,
                                        size_t* trailer_at) {
  // Per table: [tag, length, name, dim, rows tag, rows length] right before
  // its rows, and padding before that, so each table's bytes are one
  // segment with its rows aligned.
  rows_offset_.clear();
  segments_.clear();
  size_t end = 0;
  message_bytes_ = 0;
  for (const Table& t : tables) {
    const size_t inner = TableFieldsSize(t) + t.rows_bytes;
    const size_t header = 1 + VarintSize(inner) + TableFieldsSize(t);
    const size_t rows = (end + header + alignment - 1) / alignment * alignment;
    segments_.push_back({rows - header, header + t.rows_bytes});
    rows_offset_.push_back(rows);
    end = rows + t.rows_bytes;
    message_bytes_ += header + t.rows_bytes;
  }
  // The incarnation and the applied step last, in one segment (parsers
  // accept fields in any order).
  *trailer_at = end;
  size_t trailer = 0;
  if (incarnation != 0) trailer += kIncarnationBytes;
  if (applied_step.has_value()) {
    trailer += 1 + VarintSize(static_cast<uint64_t>(*applied_step));
  }
  if (trailer != 0) {
    segments_.push_back({*trailer_at, trailer});
    end += trailer;
    message_bytes_ += trailer;
  }
  return end;
}

absl::Status SerializedLookupResponse::Init(BufferPool& pool,
                                            absl::Span<const Table> tables,
                                            uint64_t incarnation,
                                            std::optional<int64_t> applied_step) {
  size_t trailer_at = 0;
  in_external_ = false;
  size_t end = 0;
  if (external_ != nullptr) {
    // Without padding: the message is then one run a reader takes as it is.
    end = Layout(tables, 1, incarnation, applied_step, &trailer_at);
    in_external_ = end <= external_capacity_;
  }
  if (!in_external_) end = Layout(tables, kRowsAlignment, incarnation, applied_step, &trailer_at);
  if (message_bytes_ > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    in_external_ = false;
    return absl::ResourceExhaustedError(absl::StrCat(
        "the lookup response would be ", message_bytes_,
        " bytes, over protobuf's 2 GiB message limit; split the batch"));
  }
  if (!in_external_) {
    absl::StatusOr<PooledBuffer> buffer = pool.Take(end);
    if (!buffer.ok()) return buffer.status();
    buffer_ = *std::move(buffer);
  }
  char* tail = base() + trailer_at;
  if (incarnation != 0) {
    *tail++ = kIncarnationTag;
    for (int b = 0; b < 8; ++b) *tail++ = static_cast<char>(incarnation >> (8 * b));
  }
  if (applied_step.has_value()) {
    *tail++ = kAppliedStepTag;
    PutVarint(static_cast<uint64_t>(*applied_step), tail);
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    const Table& t = tables[i];
    char* p = base() + segments_[i].offset;
    *p++ = kTablesTag;
    p = PutVarint(TableFieldsSize(t) + t.rows_bytes, p);
    if (!t.name.empty()) {
      *p++ = kNameTag;
      p = PutVarint(t.name.size(), p);
      std::memcpy(p, t.name.data(), t.name.size());
      p += t.name.size();
    }
    if (t.dim != 0) {
      *p++ = kDimTag;
      p = PutVarint(Int32Varint(t.dim), p);
    }
    if (t.updated_only) {
      *p++ = kUpdatedOnlyTag;
      *p++ = 1;
    }
    if (!t.positions.empty()) {
      *p++ = kPositionsTag;
      p = PutVarint(t.positions.size(), p);
      std::memcpy(p, t.positions.data(), t.positions.size());
      p += t.positions.size();
    }
    if (t.rows_bytes != 0) {
      *p++ = kRowsTag;
      p = PutVarint(t.rows_bytes, p);
    }
  }
  return absl::OkStatus();
}

std::string SerializedLookupResponse::ToString() const {
  std::string out;
  for (const Segment& s : segments_) out.append(data() + s.offset, s.length);
  return out;
}

}  // namespace recps::server
