#include "tests/server/shard/migration_cluster.h"

namespace recps::testing {

grpc::Status MigrateIn(const std::string& target, const v1::MigrateInRequest& request,
                       v1::MigrateInResponse* response) {
  // As the coordinator does: the source may export these units first. A
  // test's unreachable or bogus source fails the MigrateIn itself.
  {
    v1::AllowExportRequest grant;
    grant.set_move_id(request.move_id());
    *grant.mutable_slots() = request.slots();
    *grant.mutable_tables() = request.tables();
    grant.set_ttl_ms(120000);
    grant.set_for_backup(request.as_backup());
    v1::AllowExportResponse granted;
    grpc::ClientContext ctx;
    ctx.set_deadline(In(absl::Seconds(10)));
    (void)ShardAdminStub(request.source())->AllowExport(&ctx, grant, &granted);
  }
  v1::MigrateInResponse ignored;
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(60)));
  return ShardAdminStub(target)->MigrateIn(&ctx, request, response ? response : &ignored);
}

grpc::Status HandOver(const std::string& source, const v1::HandOverRequest& request,
                      v1::HandOverResponse* response) {
  v1::HandOverResponse ignored;
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(60)));
  return ShardAdminStub(source)->HandOver(&ctx, request, response ? response : &ignored);
}

grpc::Status AbortMove(const std::string& target, const std::string& id,
                       v1::AbortMoveResponse* response) {
  v1::AbortMoveResponse ignored;
  v1::AbortMoveRequest request;
  request.set_move_id(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(30)));
  return ShardAdminStub(target)->AbortMove(&ctx, request, response ? response : &ignored);
}

std::vector<v1::MoveState> ListMoves(const std::string& address) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::ListMovesResponse response;
  const grpc::Status s = ShardAdminStub(address)->ListMoves(&ctx, v1::ListMovesRequest(), &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return {response.moves().begin(), response.moves().end()};
}

uint64_t EpochOf(const std::string& address) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::ShardMap map;
  EXPECT_TRUE(ShardAdminStub(address)->GetShardMap(&ctx, v1::GetShardMapRequest(), &map).ok());
  return map.epoch();
}

int64_t TotalRows(const std::string& address) {
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(address);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return stats.ok() ? stats->total_rows() : -1;
}

int64_t UpdateIds(const std::string& address) {
  absl::StatusOr<v1::StatsResponse> stats = StatsOf(address);
  EXPECT_TRUE(stats.ok()) << stats.status();
  int64_t n = 0;
  if (stats.ok()) {
    for (const auto& t : stats->tables()) n += t.update_ids();
  }
  return n;
}

v1::ShardMap Moved(const v1::ShardMap& map, const std::vector<uint32_t>& slots,
                   uint32_t to, uint64_t epoch) {
  v1::ShardMap next = map;
  next.set_epoch(epoch);
  for (uint32_t s : slots) next.set_slot_owner(static_cast<int>(s), to);
  return next;
}

std::vector<uint32_t> SlotsOf(const v1::ShardMap& map, uint32_t owner, int every) {
  std::vector<uint32_t> out;
  int k = 0;
  for (int s = 0; s < map.slot_owner_size(); ++s) {
    if (map.slot_owner(s) == owner && k++ % every == 0) out.push_back(s);
  }
  return out;
}

}  // namespace recps::testing
