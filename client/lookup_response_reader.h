// The hand parser of a lookup's answer (RoutedBatch::ConsumeLookup): the
// wire tags of LookupResponse and TableRows, and TableRowsReader, which puts
// one TableRows' rows straight into the caller's buffers.
//
// The response is parsed by hand rather than into a v1::LookupResponse: the
// generated parser would copy every `rows` field out of gRPC's slices into a
// fresh string, one more pass over the largest buffer of the call. Here each
// row goes from the slices to its first place in the caller's buffer.
//
//   LookupResponse { repeated TableRows tables = 1; }
//   TableRows { string table = 1; int32 dim = 2; bytes rows = 3; }
//
// Unknown fields are skipped, as the generated parser would.
#ifndef RECPS_CLIENT_LOOKUP_RESPONSE_READER_H_
#define RECPS_CLIENT_LOOKUP_RESPONSE_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/routed_batch.h"
#include "common/wire/wire_format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "recps/v1/shard.pb.h"

namespace recps::client::internal {
namespace lookup_wire {

using google::protobuf::internal::WireFormatLite;
constexpr uint32_t kTablesTag =
    WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kTableTag =
    WireFormatLite::MakeTag(1, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kDimTag =
    WireFormatLite::MakeTag(2, WireFormatLite::WIRETYPE_VARINT);
constexpr uint32_t kRowsTag =
    WireFormatLite::MakeTag(3, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kPositionsTag =
    WireFormatLite::MakeTag(4, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kUpdatedOnlyTag =
    WireFormatLite::MakeTag(5, WireFormatLite::WIRETYPE_VARINT);
constexpr uint32_t kIncarnationTag =
    WireFormatLite::MakeTag(2, WireFormatLite::WIRETYPE_FIXED64);
constexpr uint32_t kAppliedStepTag =
    WireFormatLite::MakeTag(3, WireFormatLite::WIRETYPE_VARINT);
// INTERNAL: "malformed lookup response: <what>".
absl::Status Malformed(const char* what);

}  // namespace lookup_wire

// Where one response table's rows go: the part's ids of `plan`, whose
// output rows `data` holds; `index` is the table's place in the response.
struct RowsTarget {
  const TablePlan& plan;
  const TablePlan& data;
  const int32_t* routed;  // unique ids, in the request's order
  int32_t n;
  int index;
};

// Reads the TableRows of one response into the caller's buffers. Holds this
// call's scratch only: parts are consumed concurrently.
class TableRowsReader {
 public:
  TableRowsReader(google::protobuf::io::CodedInputStream* in,
                  v1::RowEncoding encoding, bool updated_only_asked)
      : in_(*in),
        encoding_(encoding),
        width_(BytesPerElement(encoding)),
        updated_only_asked_(updated_only_asked) {}

  // Reads a length-delimited TableRows (its tag already read) for `t`.
  absl::Status Read(const RowsTarget& t);

 private:
  // One field of the table, tag `tag`.
  absl::Status ReadField(uint32_t tag, const RowsTarget& t);
  absl::Status ReadPositions(const RowsTarget& t);
  // The rows field: every id's row, or with updated_only only those at
  // positions_.
  absl::Status ReadRows(const RowsTarget& t);
  // fp32 rows that lie whole in the stream's current buffer, from the k-th
  // id on; returns how many were copied (0: none lie whole there).
  int32_t CopyDirectRows(const RowsTarget& t, int32_t k);
  // The row of unique id u: into its first output row (the plan's columns),
  // decoded when 16-bit, then to its other output rows. False when the
  // stream ends first.
  bool ReadRow(const RowsTarget& t, int32_t u);
  // Copies u's first output row, at `row`, to its other output rows: a
  // repeated id's row goes to every position it was asked at.
  static void CopyToRepeats(const RowsTarget& t, int32_t u, const void* row);
  absl::Status WrongTable(const RowsTarget& t) const;

  google::protobuf::io::CodedInputStream& in_;
  const v1::RowEncoding encoding_;
  const size_t width_;  // bytes per value on the wire
  const bool updated_only_asked_;

  // Of the table being read (proto3 defaults until its fields come).
  size_t row_bytes_ = 0;
  std::string name_;
  int32_t dim_ = 0;
  bool have_name_ = false;
  bool have_dim_ = false;
  uint64_t rows_bytes_ = 0;
  // An updated_only answer: rows only for these positions of the part's
  // ids (sent before the rows); the other rows stay as the caller has them.
  bool partial_ = false;
  std::vector<int32_t> positions_;
  std::vector<char> row_scratch_;  // a row to decode (fp16 / bf16)
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_LOOKUP_RESPONSE_READER_H_
