// Packed little-endian payloads of the wire protocol (proto/recps/v1):
// ids are int64, rows float32, fp16 or bf16. One owner for the encoding, used
// by the shard server and the embedding client.
#ifndef RECPS_COMMON_WIRE_WIRE_FORMAT_H_
#define RECPS_COMMON_WIRE_WIRE_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "recps/v1/shard.pb.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the wire format is little-endian; add byte swaps for this host");

namespace recps {

// gRPC trailing-metadata key (and absl::Status payload key) with which a
// shard server tells a caller its current shard-map epoch, on ABORTED
// replies to a stale epoch or a slot it does not own.
inline constexpr char kShardMapEpochKey[] = "recps-shard-map-epoch";

// Bytes per element of an encoding (UNSPECIFIED counts as float32), or 0 for
// an unknown value.
int BytesPerElement(v1::RowEncoding encoding);

// Ids as packed bytes.
void EncodeIds(absl::Span<const int64_t> ids, std::string* out);
// Views (when 8-byte aligned) or copies packed ids. INVALID_ARGUMENT naming
// `what` when the length is not a multiple of 8.
absl::Status DecodeIds(const std::string& bytes, const char* what,
                       std::vector<int64_t>* scratch,
                       absl::Span<const int64_t>* ids);

// n floats to `encoding` (float32 copies; fp16/bf16 round to nearest even).
void EncodeRows(const float* values, size_t n, v1::RowEncoding encoding,
                std::string* out);
// The same into n * BytesPerElement(encoding) bytes at `out`.
void EncodeRows(const float* values, size_t n, v1::RowEncoding encoding,
                char* out);
// n 16-bit values (FLOAT16 or BFLOAT16) at `src` (any alignment) widened
// to floats at `out`. REQUIRES: BytesPerElement(encoding) == 2.
void WidenRows(const char* src, size_t n, v1::RowEncoding encoding, float* out);
// fp16 <-> fp32 in bulk run on F16C when the CPU has it, bit-identical to
// HalfToFloat / FloatToHalf (blocks holding NaN or infinity take the scalar
// path); the scalar path was 0.05-0.2 GB/s on gradient-sized values, where
// most are fp16 subnormals.

// Writes n floats decoded from `bytes`. INVALID_ARGUMENT naming `what` when
// the byte length is not n elements of `encoding`.
absl::Status DecodeRows(const std::string& bytes, v1::RowEncoding encoding,
                        size_t n, const char* what, float* out);

}  // namespace recps

#endif  // RECPS_COMMON_WIRE_WIRE_FORMAT_H_
