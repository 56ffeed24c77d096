// The shard server's lookup path on untrusted bytes: the bytes are a
// v1::LookupRequest as gRPC would hand it to the service (mode 0), or drive
// a request built field by field from names, ids and epochs worth trying
// (mode 1), serialized and parsed back. Checks: no crash or sanitizer
// report; a refusal has a code a client can act on and changes no stored
// row; an answer parses as a v1::LookupResponse with one entry per table of
// ids x dim values.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/synchronization/notification.h"
#include "common/wire/wire_format.h"
#include "recps/v1/shard.pb.h"
#include "tests/fuzz/request_checks.h"
#include "tests/fuzz/shard_fixture.h"

namespace recps::fuzz {
namespace {

v1::LookupRequest Structured(FuzzedDataProvider& in) {
  v1::LookupRequest req;
  v1::RequestHeader* h = req.mutable_header();
  const uint8_t epoch = in.ConsumeIntegral<uint8_t>();
  h->set_shard_map_epoch(epoch < 200 ? kEpoch : epoch - 200);
  h->set_worker_rank(in.ConsumeIntegralInRange<int32_t>(-1, kWorld));
  h->set_step(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 3)
                               : in.ConsumeIntegral<int64_t>());
  const int encoding = in.ConsumeIntegralInRange<int>(0, 5);
  req.set_row_encoding(static_cast<v1::RowEncoding>(encoding));
  const int tables = in.ConsumeIntegralInRange<int>(0, 4);
  for (int t = 0; t < tables; ++t) {
    v1::TableIds* ti = req.add_tables();
    const uint8_t name = in.ConsumeIntegral<uint8_t>();
    ti->set_table(name < 240 ? kTableNames[name % 6] : in.ConsumeRandomLengthString(16));
    const int n = in.ConsumeIntegralInRange<int>(0, 24);
    std::vector<int64_t> ids;
    for (int i = 0; i < n && in.remaining_bytes() > 0; ++i) {
      ids.push_back(InterestingId(in.ConsumeIntegral<uint8_t>(),
                                  in.ConsumeIntegral<int64_t>()));
    }
    std::string bytes;
    EncodeIds(ids, &bytes);
    const int trim = in.ConsumeIntegralInRange<int>(-2, 2);  // torn ids
    if (trim < 0 && bytes.size() >= 3) bytes.resize(bytes.size() + trim);
    if (trim > 1) bytes.push_back('\x7f');
    ti->set_ids(bytes);
  }
  return req;
}

}  // namespace
}  // namespace recps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  if (size < 1) return 0;
  v1::LookupRequest req;
  if (data[0] % 2 == 0) {
    if (!req.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  } else {
    FuzzedDataProvider in(data + 1, size - 1);
    const std::string wire = Structured(in).SerializeAsString();
    // A name that is not UTF-8 does not parse (proto3 strings), as gRPC
    // would refuse it before the service.
    if (!req.ParseFromString(wire)) return 0;
  }
  std::unique_ptr<server::ShardServer> srv = MakeFixtureServer();
  const std::string before = StoreDigest(srv->store());
  absl::Notification done;
  absl::Status status;
  server::SerializedLookupResponse response;
  srv->Lookup(&req, &response, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  Report("lookup", status);
  if (!status.ok()) {
    // A header naming another incarnation (a client of a process that was
    // here before) is refused with DATA_LOSS, before anything else.
    const uint64_t named = req.header().incarnation();
    CheckRefusal(status, "lookup", named != 0 && named != srv->incarnation());
    if (StoreDigest(srv->store()) != before) {
      Fail("a refused lookup changed the store: " + status.ToString());
    }
    return 0;
  }
  v1::LookupResponse parsed;
  if (!parsed.ParseFromString(response.ToString())) Fail("response does not parse");
  if (parsed.tables_size() != req.tables_size()) Fail("response table count");
  const int width = BytesPerElement(req.row_encoding());
  for (int i = 0; i < req.tables_size(); ++i) {
    const v1::TableRows& rows = parsed.tables(i);
    if (rows.table() != req.tables(i).table()) Fail("response table order");
    const size_t ids = req.tables(i).ids().size() / 8;
    if (rows.rows().size() != ids * rows.dim() * width) Fail("response rows size");
  }
  return 0;
}
