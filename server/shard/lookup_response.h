// A v1::LookupResponse serialized by hand into one pooled buffer, so that a
// lookup's rows are written once, by the store, where gRPC sends them from:
// no zero-filled protobuf string, no copy at serialization, no fresh
// megabytes per request. The bytes are exactly what the generated code
// would write (fields in number order, proto3 defaults omitted), so any
// client parses them.
#ifndef RECPS_SERVER_SHARD_LOOKUP_RESPONSE_H_
#define RECPS_SERVER_SHARD_LOOKUP_RESPONSE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/buffer_pool.h"

namespace recps::server {

class SerializedLookupResponse {
 public:
  // One TableRows entry: its fields, and the length of its rows.
  struct Table {
    absl::string_view name;
    int dim = 0;
    size_t rows_bytes = 0;
    // LookupRequest.updated_only's answer: TableRows.updated_only and the
    // packed positions, written before the rows.
    bool updated_only = false;
    absl::string_view positions;
  };
  // A byte range of the buffer; the message is the concatenation of the
  // segments, in order.
  struct Segment {
    size_t offset = 0;
    size_t length = 0;
  };

  // Lays out `tables` in a buffer from `pool` and writes everything but the
  // rows, which the caller then writes through rows(i). RESOURCE_EXHAUSTED
  // when the message would pass protobuf's 2 GiB limit or memory runs out.
  // A nonzero `incarnation` is written as LookupResponse.incarnation, an
  // `applied_step` as LookupResponse.applied_step (after the tables).
  absl::Status Init(BufferPool& pool, absl::Span<const Table> tables,
                    uint64_t incarnation = 0,
                    std::optional<int64_t> applied_step = std::nullopt);

  // Memory of the caller's (same-host rows) that Init lays the message out
  // in, as one segment without padding, when it fits there; otherwise Init
  // takes a pooled buffer as usual. Set before Init.
  void WriteInto(char* memory, size_t capacity) {
    external_ = memory;
    external_capacity_ = capacity;
  }
  // Whether Init wrote to the WriteInto memory: the message is then its
  // first message_bytes() bytes.
  bool in_external_memory() const { return in_external_; }
  size_t message_bytes() const { return message_bytes_; }

  // Table i's rows_bytes bytes of rows, 64-byte aligned in a pooled buffer.
  char* rows(int table) const { return base() + rows_offset_[table]; }

  const char* data() const { return base(); }
  absl::Span<const Segment> segments() const { return segments_; }
  // The serialized message, copied into one string.
  std::string ToString() const;

  // The buffer, for whoever sends the segments (the object keeps its
  // segment list but no longer its bytes).
  PooledBuffer TakeBuffer() { return std::move(buffer_); }

 private:
  char* base() const { return in_external_ ? external_ : buffer_.data(); }
  // Lays the tables out from offset 0, rows aligned to `alignment`; returns
  // the end of the layout.
  size_t Layout(absl::Span<const Table> tables, size_t alignment, uint64_t incarnation,
                std::optional<int64_t> applied_step, size_t* trailer_at);

  PooledBuffer buffer_;
  char* external_ = nullptr;
  size_t external_capacity_ = 0;
  bool in_external_ = false;
  size_t message_bytes_ = 0;
  std::vector<size_t> rows_offset_;
  std::vector<Segment> segments_;
};

}  // namespace recps::server

#endif  // RECPS_SERVER_SHARD_LOOKUP_RESPONSE_H_
