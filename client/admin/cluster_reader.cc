#include "client/admin/cluster_reader.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/shard_fanout.h"
#include "common/rpc/channels.h"
#include "common/rpc/status_conversion.h"
#include "common/status_macros.h"
#include "recps/v1/coordinator.grpc.pb.h"
#include "recps/v1/shard_admin.grpc.pb.h"

namespace recps::client::admin {
namespace {

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  return rpc::FromGrpcStatus(status, what, "");
}

// gRPC answers UNIMPLEMENTED, with an empty message, when the process
// reached serves other services: say what it is not.
absl::Status NotA(const grpc::Status& status, absl::string_view what,
                  const std::string& address, absl::string_view service,
                  absl::string_view hint) {
  if (status.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
    return FromGrpc(status, what);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", address, " answered but is not a ", service,
      " (UNIMPLEMENTED from the server: it does not serve that API); ", hint));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ClusterReader>> ClusterReader::Create(
    ClusterReaderOptions options) {
  if (options.coordinator.empty() && options.servers.empty()) {
    return absl::InvalidArgumentError(
        "no cluster to ask: give a coordinator or at least one server");
  }
  if (options.rpc_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the RPC timeout must be positive");
  }
  return std::unique_ptr<ClusterReader>(new ClusterReader(std::move(options)));
}

std::shared_ptr<grpc::Channel> ClusterReader::Channel(
    const std::string& address) {
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    channel = rpc::MakeChannel(address, rpc::ChannelKind::kControl, options_.security);
  }
  return channel;
}

absl::StatusOr<ClusterSnapshot> ClusterReader::Read(bool include_slots) {
  ClusterSnapshot snapshot;
  if (!options_.coordinator.empty()) {
    RETURN_IF_ERROR(ReadFromCoordinator(&snapshot));
  } else {
    RETURN_IF_ERROR(ReadMapFromServers(&snapshot));
  }
  ReadStats(include_slots, &snapshot);
  return snapshot;
}

absl::Status ClusterReader::ReadFromCoordinator(ClusterSnapshot* snapshot) {
  snapshot->coordinator = options_.coordinator;
  auto stub = v1::Coordinator::NewStub(Channel(options_.coordinator));
  const std::string where = absl::StrCat("coordinator ", options_.coordinator);
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(options_.rpc_timeout, &ctx);
    v1::ListMembersResponse members;
    grpc::Status s =
        stub->ListMembers(&ctx, v1::ListMembersRequest(), &members);
    if (!s.ok()) {
      return NotA(s, absl::StrCat("cannot ask the ", where), options_.coordinator,
                  "coordinator (recps.v1.Coordinator)",
                  "is it a shard server? Ask it with --server=HOST:PORT");
    }
    snapshot->members = std::move(members);
  }
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(options_.rpc_timeout, &ctx);
    v1::ListRebalanceMovesResponse moves;
    // An older coordinator answers UNIMPLEMENTED: no moves shown.
    if (stub->ListMoves(&ctx, v1::ListRebalanceMovesRequest(), &moves).ok()) {
      snapshot->moves = std::move(moves);
    }
  }
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(options_.rpc_timeout, &ctx);
    v1::GetPlanResponse plan;
    const grpc::Status s = stub->GetPlan(&ctx, v1::GetPlanRequest(), &plan);
    if (s.ok()) {
      snapshot->sharding = absl::StrFormat(
          "planned (plan %d, %s): predicted step %.3f ms", plan.plan().plan_id(),
          plan.plan().proposer(), plan.plan().predicted_step_seconds() * 1e3);
    } else if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      snapshot->sharding = absl::StrCat("even: ", s.error_message());
    } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      snapshot->sharding = absl::StrCat("planning: ", s.error_message());
    }
  }
  {
    grpc::ClientContext ctx;
    rpc::SetTimeout(options_.rpc_timeout, &ctx);
    v1::GetCoordinatorShardMapResponse map;
    grpc::Status s =
        stub->GetShardMap(&ctx, v1::GetCoordinatorShardMapRequest(), &map);
    if (s.ok()) {
      snapshot->map = map.shard_map();
    } else if (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
               snapshot->members->shard_map_epoch() == 0) {
      // The coordinator answers but has built no map yet.
      snapshot->map_error = s.error_message();
    } else {
      return FromGrpc(
          s, absl::StrCat("cannot get the shard map from the ", where));
    }
  }
  snapshot->servers.assign(snapshot->map.servers().begin(),
                           snapshot->map.servers().end());
  absl::flat_hash_set<std::string> listed(snapshot->servers.begin(),
                                          snapshot->servers.end());
  for (const v1::Member& m : snapshot->members->members()) {
    if (m.role() == v1::SHARD_SERVER && m.state() == v1::ALIVE &&
        listed.insert(m.address()).second) {
      snapshot->servers.push_back(m.address());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Member> ClusterReader::ForgetMember(const std::string& member_id) {
  if (options_.coordinator.empty()) {
    return absl::InvalidArgumentError("forgetting a member needs --coordinator");
  }
  auto stub = v1::Coordinator::NewStub(Channel(options_.coordinator));
  grpc::ClientContext ctx;
  rpc::SetTimeout(options_.rpc_timeout, &ctx);
  v1::ForgetMemberRequest request;
  request.set_member_id(member_id);
  v1::ForgetMemberResponse response;
  grpc::Status s = stub->ForgetMember(&ctx, request, &response);
  if (!s.ok()) {
    return NotA(s,
                absl::StrCat("coordinator ", options_.coordinator, " did not forget ",
                             member_id),
                options_.coordinator, "coordinator (recps.v1.Coordinator)",
                "give the coordinator's address (or one that knows ForgetMember)");
  }
  return response.member();
}

absl::Status ClusterReader::ReadMapFromServers(ClusterSnapshot* snapshot) {
  struct Call {
    std::unique_ptr<v1::ShardAdmin::Stub> stub;
    grpc::ClientContext ctx;
    v1::ShardMap response;
    grpc::Status status;
  };
  const std::vector<std::string>& servers = options_.servers;
  std::vector<Call> calls(servers.size());
  internal::DoneQueue done(static_cast<int>(calls.size()));
  const v1::GetShardMapRequest request;
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i].stub = v1::ShardAdmin::NewStub(Channel(servers[i]));
    rpc::SetTimeout(options_.rpc_timeout, &calls[i].ctx);
    calls[i].stub->async()->GetShardMap(
        &calls[i].ctx, &request, &calls[i].response,
        done.Callback(static_cast<int>(i), &calls[i].status));
  }
  while (done.Next() != internal::DoneQueue::kAllReturned) {
  }
  std::vector<std::string> errors;
  bool any = false;
  for (size_t i = 0; i < calls.size(); ++i) {
    if (!calls[i].status.ok()) {
      errors.push_back(std::string(
          NotA(calls[i].status, servers[i], servers[i],
               "shard server (recps.v1.ShardAdmin)",
               "is it the coordinator? Ask it with --coordinator=HOST:PORT")
              .message()));
      continue;
    }
    any = true;
    // During a rebalance servers install a new map one by one: the newest
    // is the current one.
    if (calls[i].response.epoch() > snapshot->map.epoch()) {
      snapshot->map = calls[i].response;
    }
  }
  if (!any) {
    return absl::UnavailableError(absl::StrCat("cannot ask any shard server: ",
                                               absl::StrJoin(errors, "; ")));
  }
  if (snapshot->map.epoch() == 0) {
    snapshot->map_error = "no server asked has a shard map yet";
  }
  snapshot->servers = servers;
  return absl::OkStatus();
}

void ClusterReader::ReadStats(bool include_slots, ClusterSnapshot* snapshot) {
  struct Call {
    std::unique_ptr<v1::ShardAdmin::Stub> stub;
    grpc::ClientContext ctx;
    v1::StatsResponse response;
    grpc::Status status;
  };
  const std::vector<std::string>& servers = snapshot->servers;
  std::vector<Call> calls(servers.size());
  internal::DoneQueue done(static_cast<int>(calls.size()));
  v1::StatsRequest request;
  request.set_include_slots(include_slots);
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i].stub = v1::ShardAdmin::NewStub(Channel(servers[i]));
    rpc::SetTimeout(options_.rpc_timeout, &calls[i].ctx);
    calls[i].stub->async()->Stats(
        &calls[i].ctx, &request, &calls[i].response,
        done.Callback(static_cast<int>(i), &calls[i].status));
  }
  while (done.Next() != internal::DoneQueue::kAllReturned) {
  }
  snapshot->taken = absl::Now();
  snapshot->stats.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    if (calls[i].status.ok()) {
      snapshot->stats.push_back(std::move(calls[i].response));
    } else {
      snapshot->stats.push_back(FromGrpc(calls[i].status, "ShardAdmin.Stats"));
    }
  }
}

}  // namespace recps::client::admin
