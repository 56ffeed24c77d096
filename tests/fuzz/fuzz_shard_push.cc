// The shard server's push path on untrusted bytes: a v1::PushGradientsRequest
// as gRPC hands it over (mode 0), or one built from table names, ids,
// gradient values and encodings worth trying (mode 1). Checks: no crash or
// sanitizer report; a refused push has a code a client can act on and
// changes no stored row (the server is in async mode, so an accepted push is
// applied before done runs).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/synchronization/notification.h"
#include "common/wire/wire_format.h"
#include "recps/v1/shard.pb.h"
#include "tests/fuzz/request_checks.h"
#include "tests/fuzz/shard_fixture.h"

namespace recps::fuzz {
namespace {

int DimOf(const std::string& name) {
  if (name == "fixed") return 4;
  if (name == "dynamic") return 3;
  if (name == "adam") return 2;
  if (name == "wide") return 8;
  return 4;  // the column groups, and unknown names
}

float InterestingFloat(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return 0.0f;
    case 1: return 1.0f;
    case 2: return -0.5f;
    case 3: return std::numeric_limits<float>::quiet_NaN();
    case 4: return std::numeric_limits<float>::infinity();
    case 5: return -std::numeric_limits<float>::infinity();
    case 6: return std::numeric_limits<float>::max();
    case 7: return std::numeric_limits<float>::denorm_min();
    case 8: return 1e30f;
    default: return in.ConsumeFloatingPoint<float>();
  }
}

v1::PushGradientsRequest Structured(FuzzedDataProvider& in) {
  v1::PushGradientsRequest req;
  v1::RequestHeader* h = req.mutable_header();
  const uint8_t epoch = in.ConsumeIntegral<uint8_t>();
  h->set_shard_map_epoch(epoch < 200 ? kEpoch : epoch - 200);
  h->set_worker_rank(in.ConsumeIntegralInRange<int32_t>(-1, kWorld));
  h->set_step(in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 3)
                               : in.ConsumeIntegral<int64_t>());
  const int tables = in.ConsumeIntegralInRange<int>(0, 4);
  for (int t = 0; t < tables; ++t) {
    v1::TableGradients* tg = req.add_tables();
    const uint8_t name = in.ConsumeIntegral<uint8_t>();
    tg->set_table(name < 240 ? kTableNames[name % 6]
                             : in.ConsumeRandomLengthString(16));
    const auto encoding =
        static_cast<v1::RowEncoding>(in.ConsumeIntegralInRange<int>(0, 5));
    tg->set_encoding(encoding);
    const int n = in.ConsumeIntegralInRange<int>(0, 16);
    std::vector<int64_t> ids;
    for (int i = 0; i < n && in.remaining_bytes() > 0; ++i) {
      ids.push_back(InterestingId(in.ConsumeIntegral<uint8_t>(),
                                  in.ConsumeIntegral<int64_t>()));
    }
    std::string id_bytes;
    EncodeIds(ids, &id_bytes);
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0 && !id_bytes.empty()) {
      id_bytes.pop_back();  // torn ids
    }
    tg->set_ids(id_bytes);
    std::vector<float> grads(ids.size() * DimOf(tg->table()));
    for (float& g : grads) g = in.remaining_bytes() > 0 ? InterestingFloat(in) : 0.25f;
    std::string grad_bytes;
    const v1::RowEncoding as =
        BytesPerElement(encoding) == 0 ? v1::ROW_ENCODING_FLOAT32 : encoding;
    EncodeRows(grads.data(), grads.size(), as, &grad_bytes);
    const int delta = in.ConsumeIntegralInRange<int>(-3, 3);  // wrong lengths
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
      if (delta < 0 && grad_bytes.size() >= 3) grad_bytes.resize(grad_bytes.size() + delta);
      if (delta > 0) grad_bytes.append(delta, '\0');
    }
    tg->set_grads(grad_bytes);
  }
  return req;
}

}  // namespace
}  // namespace recps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  if (size < 1) return 0;
  v1::PushGradientsRequest req;
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
  v1::PushGradientsResponse response;
  srv->PushGradients(&req, &response, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  Report("push", status);
  if (response.incarnation() != srv->incarnation()) Fail("push response incarnation");
  if (!status.ok()) {
    // A header naming another incarnation (a client of a process that was
    // here before) is refused with DATA_LOSS, before anything else.
    const uint64_t named = req.header().incarnation();
    CheckRefusal(status, "push", named != 0 && named != srv->incarnation());
    if (StoreDigest(srv->store()) != before) {
      Fail("a refused push changed the store: " + status.ToString());
    }
  }
  return 0;
}
