// Shard map decoding (common/wire ShardMap::FromProto) on untrusted bytes:
// a v1::ShardMap as it comes from the coordinator or a SetShardMap call
// (mode 0), or one built from server lists, slot owners, table routings and
// column groups worth trying (mode 1). An accepted map must round-trip
// through ToProto, answer every routing question without reading out of
// bounds, and (mode bit 2) be installed or refused by a shard server
// without a crash; a refused install changes no row.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/hashing.h"
#include "common/wire/shard_map.h"
#include "common/wire/wire_format.h"
#include "recps/v1/shard_admin.pb.h"
#include "tests/fuzz/request_checks.h"
#include "tests/fuzz/shard_fixture.h"

namespace recps::fuzz {
namespace {

const char* const kServers[] = {kSelf, kOther, "127.0.0.1:3", ""};
const char* const kNames[] = {"fixed", "dynamic", "adam", "wide", "x"};

v1::ShardMap Structured(FuzzedDataProvider& in) {
  v1::ShardMap m;
  m.set_epoch(in.ConsumeIntegralInRange<uint64_t>(0, 6));
  const uint32_t slots = in.ConsumeBool() ? kSlots : in.ConsumeIntegralInRange<uint32_t>(0, 40);
  m.set_num_slots(slots);
  const int servers = in.ConsumeIntegralInRange<int>(0, 4);
  for (int s = 0; s < servers; ++s) m.add_servers(kServers[in.ConsumeIntegralInRange<int>(0, 3)]);
  const uint32_t owners = in.ConsumeBool() ? slots : in.ConsumeIntegralInRange<uint32_t>(0, 40);
  for (uint32_t i = 0; i < owners; ++i) m.add_slot_owner(in.ConsumeIntegralInRange<uint32_t>(0, 4));
  const int tables = in.ConsumeIntegralInRange<int>(0, 3);
  for (int t = 0; t < tables; ++t) {
    v1::TableRouting* r = m.add_tables();
    const uint8_t name = in.ConsumeIntegral<uint8_t>();
    r->set_table(name < 240 ? kNames[name % 5] : in.ConsumeRandomLengthString(12));
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        r->set_owner(in.ConsumeIntegralInRange<uint32_t>(0, 4));
        break;
      case 1: {
        const uint32_t n = in.ConsumeBool() ? slots : in.ConsumeIntegralInRange<uint32_t>(0, 40);
        for (uint32_t i = 0; i < n; ++i) r->add_slot_owner(in.ConsumeIntegralInRange<uint32_t>(0, 4));
        break;
      }
      default: {
        const int groups = in.ConsumeIntegralInRange<int>(1, 4);
        uint32_t at = 0;
        for (int g = 0; g < groups; ++g) {
          v1::ColumnGroupRouting* cg = r->add_column_groups();
          const uint32_t begin = in.ConsumeIntegralInRange<int>(0, 7) == 0
                                     ? in.ConsumeIntegral<uint32_t>() : at;
          const uint32_t end = in.ConsumeIntegralInRange<int>(0, 7) == 0
                                   ? in.ConsumeIntegral<uint32_t>()
                                   : begin + in.ConsumeIntegralInRange<uint32_t>(0, 5);
          cg->set_column_begin(begin);
          cg->set_column_end(end);
          cg->set_owner(in.ConsumeIntegralInRange<uint32_t>(0, 4));
          at = end;
        }
      }
    }
  }
  return m;
}

void Exercise(const ShardMap& map) {
  const v1::ShardMap proto = map.ToProto();
  absl::StatusOr<ShardMap> again = ShardMap::FromProto(proto);
  if (!again.ok()) Fail("ToProto of an accepted map is refused: " + again.status().ToString());
  if (again->ToProto().SerializeAsString() != proto.SerializeAsString()) {
    Fail("shard map does not round-trip");
  }
  std::vector<std::string> names(std::begin(kNames), std::end(kNames));
  for (const v1::TableRouting& t : proto.tables()) {
    names.push_back(t.table());
    for (const ColumnGroup& g : map.ColumnGroupsOf(StableNameKey(t.table()))) {
      names.push_back(g.table);
      if (g.owner < 0 || g.owner >= map.num_servers()) Fail("group owner");
    }
  }
  for (const std::string& name : names) {
    const uint64_t key = StableNameKey(name);
    const TableRoute route = map.RouteOf(key);
    for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{-1}, INT64_MIN, INT64_MAX, int64_t{12345}}) {
      const int owner = route.OwnerOf(id);
      if (route.column_split() ? owner != -1 : (owner < 0 || owner >= map.num_servers())) {
        Fail("OwnerOf out of range for table " + name);
      }
      if (!route.column_split() && map.OwnerOf(key, id) != owner) Fail("OwnerOf disagrees");
    }
    for (int dim : {1, 4, 8, 4096}) (void)map.CheckWidth(name, dim);
  }
  size_t slots = 0;
  for (int s = 0; s < map.num_servers(); ++s) {
    slots += map.SlotsOf(s).size();
    if (map.IndexOf(map.servers()[s]) != s) Fail("IndexOf");
  }
  if (slots != map.num_slots()) Fail("SlotsOf does not cover the slots");
}

}  // namespace
}  // namespace recps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  if (size < 1) return 0;
  v1::ShardMap proto;
  if (data[0] % 2 == 0) {
    if (!proto.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  } else {
    FuzzedDataProvider in(data + 1, size - 1);
    proto = Structured(in);
  }
  absl::StatusOr<ShardMap> map = ShardMap::FromProto(proto);
  Report("FromProto", map.status());
  if (!map.ok()) {
    CheckRefusal(map.status(), "FromProto");
    return 0;
  }
  Exercise(*map);
  if (data[0] & 2) {
    std::unique_ptr<server::ShardServer> srv = MakeFixtureServer();
    // Rows in some slots (those this server owns), so that moving them
    // away is refused.
    for (int64_t id = 0; id < 16; ++id) {
      v1::LookupRequest warm;
      warm.mutable_header()->set_shard_map_epoch(kEpoch);
      v1::TableIds* t = warm.add_tables();
      t->set_table("dynamic");
      std::string ids;
      EncodeIds(std::vector<int64_t>{id}, &ids);
      t->set_ids(ids);
      absl::Notification done;
      server::SerializedLookupResponse r;
      srv->Lookup(&warm, &r, [&](absl::Status) { done.Notify(); });
      done.WaitForNotification();
    }
    const std::string before = StoreDigest(srv->store());
    v1::SetShardMapRequest req;
    *req.mutable_shard_map() = proto;
    if (data[0] & 4) req.set_self(kOther);
    const absl::Status s = srv->SetShardMap(req);
    Report("SetShardMap", s);
    if (!s.ok()) {
      if (s.code() != absl::StatusCode::kAlreadyExists) CheckRefusal(s, "SetShardMap");
      if (StoreDigest(srv->store()) != before) Fail("a refused map changed rows: " + s.ToString());
    }
  }
  return 0;
}
