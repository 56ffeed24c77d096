// The embedding client's raw lookup response path: bytes a shard server
// (or anything that answers on its port) sends back, parsed straight from
// gRPC's slices into the caller's row buffers (RoutedBatch::ConsumeLookup).
// The first bytes pick the slice size, the row encoding, the server and the
// part of its ids the response answers; the rest is the response. Checks:
// no crash or sanitizer report (every write stays inside the caller's
// buffers, each its own allocation), and a refusal is INTERNAL with a
// message.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "client/routed_batch.h"
#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "tests/fuzz/request_checks.h"
#include "tests/fuzz/lookup_response_fixture.h"


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  static const ResponseFixture* const f = new ResponseFixture();
  if (size < 4) return 0;
  const size_t slice = data[0] == 0 ? (size_t{1} << 20) : data[0];
  static constexpr v1::RowEncoding kEncodings[] = {
      v1::ROW_ENCODING_FLOAT32, v1::ROW_ENCODING_FLOAT16,
      v1::ROW_ENCODING_BFLOAT16};
  const v1::RowEncoding encoding = kEncodings[data[1] % 3];
  const int server = data[1] / 3 % 2;
  // Each output array its own allocation, so ASan sees any stray write.
  std::vector<float> out_u(f->users.size() * 8), out_i(f->items.size() * 4),
      out_w(f->wides.size() * 8);
  client::internal::RoutedBatch batch;
  f->Prepare(&batch, out_u.data(), out_i.data(), out_w.data());
  const int32_t count = batch.CountFor(server);
  if (count == 0) return 0;
  const int32_t begin = data[2] % count;
  const int32_t end = begin + 1 + data[3] % (count - begin);
  const uint8_t* wire = data + 4;
  const size_t wire_size = size - 4;
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire_size; at += slice) {
    slices.emplace_back(wire + at, std::min(slice, wire_size - at));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  uint64_t incarnation = 0;
  const absl::Status s =
      batch.ConsumeLookup(server, begin, end, encoding, &buffer, &incarnation);
  Report("ConsumeLookup", s);
  if (!s.ok() && (s.code() != absl::StatusCode::kInternal || s.message().empty())) {
    Fail("ConsumeLookup refused with " + s.ToString());
  }
  return 0;
}
