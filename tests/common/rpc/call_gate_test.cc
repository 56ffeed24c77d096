// The roles table, SAN URI parsing and the refusal wording (no processes;
// tests/security/tls_process_test.cc checks them through real servers).
#include "common/rpc/call_gate.h"

#include "common/rpc/identity.h"
#include "gtest/gtest.h"

namespace recps::rpc {
namespace {

TEST(Identity, ParsesRecpsUris) {
  absl::StatusOr<PeerIdentity> id =
      ParseRecpsUri("spiffe://recps/prod-1/worker/worker-7");
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->cluster, "prod-1");
  EXPECT_EQ(id->role, Role::kWorker);
  EXPECT_EQ(id->name, "worker-7");
  EXPECT_EQ(RecpsUri("prod-1", Role::kWorker, "worker-7"), id->uri);
}

TEST(Identity, RefusesOtherUris) {
  for (const char* uri :
       {"spiffe://other/c/worker/n", "spiffe://recps/c/root/n",
        "spiffe://recps/c/worker", "spiffe://recps/c/worker/n/x",
        "spiffe://recps//worker/n", "spiffe://recps/c/worker/a b"}) {
    EXPECT_FALSE(ParseRecpsUri(uri).ok()) << uri;
  }
  EXPECT_FALSE(ParseRole("root").ok());
}

TEST(RolesTable, AdminMayCallEverythingAndUnknownMethodsAreAdminOnly) {
  for (const auto& [method, roles] : RolesTable()) {
    EXPECT_TRUE(roles & RoleBit(Role::kAdmin)) << method;
  }
  EXPECT_EQ(AllowedRoles("ShardAdmin.SomethingNew"), RoleBit(Role::kAdmin));
  EXPECT_EQ(AllowedRoles("ShardAdmin.SetShardMap"),
            RoleBit(Role::kAdmin) | RoleBit(Role::kCoordinator));
}

TEST(RolesTable, WhatEachRoleMayDo) {
  auto may = [](Role r, const char* method) {
    return (AllowedRoles(method) & RoleBit(r)) != 0;
  };
  EXPECT_TRUE(may(Role::kWorker, "EmbeddingShard.Lookup"));
  EXPECT_TRUE(may(Role::kWorker, "EmbeddingShard.PushGradients"));
  EXPECT_TRUE(may(Role::kWorker, "Coordinator.Barrier"));
  EXPECT_TRUE(may(Role::kWorker, "Coordinator.CheckpointCut"));
  EXPECT_FALSE(may(Role::kWorker, "ShardAdmin.SetShardMap"));
  EXPECT_FALSE(may(Role::kWorker, "Coordinator.ForgetMember"));
  EXPECT_TRUE(may(Role::kShard, "Coordinator.Register"));
  EXPECT_TRUE(may(Role::kShard, "Coordinator.KvGet"));
  EXPECT_FALSE(may(Role::kShard, "Coordinator.KvSet"));
  EXPECT_FALSE(may(Role::kShard, "EmbeddingShard.PushGradients"));
  EXPECT_TRUE(may(Role::kCoordinator, "ShardAdmin.SetShardMap"));
  EXPECT_TRUE(may(Role::kCoordinator, "ShardAdmin.SaveRows"));
  EXPECT_TRUE(may(Role::kCoordinator, "ShardAdmin.RestoreRows"));
  EXPECT_FALSE(may(Role::kCoordinator, "EmbeddingShard.PushGradients"));
  // Slot moves: the coordinator drives them, shard servers talk to each
  // other (the target reads the source's rows, the source hands over).
  EXPECT_TRUE(may(Role::kCoordinator, "ShardAdmin.MigrateIn"));
  EXPECT_TRUE(may(Role::kCoordinator, "ShardAdmin.HandOver"));
  EXPECT_TRUE(may(Role::kCoordinator, "ShardAdmin.AbortMove"));
  EXPECT_TRUE(may(Role::kShard, "ShardAdmin.ExportRows"));
  EXPECT_TRUE(may(Role::kShard, "ShardAdmin.FinishMove"));
  EXPECT_TRUE(may(Role::kShard, "ShardAdmin.AbortMove"));
  EXPECT_FALSE(may(Role::kShard, "ShardAdmin.MigrateIn"));
  EXPECT_FALSE(may(Role::kShard, "ShardAdmin.HandOver"));
  EXPECT_FALSE(may(Role::kCoordinator, "ShardAdmin.ExportRows"));
  EXPECT_FALSE(may(Role::kWorker, "ShardAdmin.ExportRows"));
  EXPECT_FALSE(may(Role::kWorker, "Coordinator.ApplyRebalance"));
  // Replication: only a shard server (a primary) forwards a push to a
  // backup; a worker's certificate cannot write rows past the primary.
  EXPECT_TRUE(may(Role::kShard, "EmbeddingShard.ReplicatePush"));
  EXPECT_FALSE(may(Role::kWorker, "EmbeddingShard.ReplicatePush"));
  EXPECT_FALSE(may(Role::kCoordinator, "EmbeddingShard.ReplicatePush"));
  EXPECT_FALSE(may(Role::kReader, "EmbeddingShard.ReplicatePush"));
  for (const char* m :
       {"ShardAdmin.Stats", "ShardAdmin.GetShardMap", "Coordinator.GetShardMap",
        "Coordinator.ListMembers", "Coordinator.ListCheckpoints",
        "Coordinator.GetPlan", "Coordinator.GetJob", "Coordinator.PlanRebalance",
        "Coordinator.ListMoves", "ShardAdmin.ListMoves"}) {
    EXPECT_TRUE(may(Role::kReader, m)) << m;
  }
  for (const char* m : {"EmbeddingShard.Lookup", "EmbeddingShard.PushGradients",
                        "ShardAdmin.SetShardMap", "Coordinator.ForgetMember",
                        "Coordinator.RequestCheckpoint", "Coordinator.KvSet",
                        "Coordinator.ApplyRebalance", "ShardAdmin.MigrateIn",
                        "ShardAdmin.ExportRows", "ShardAdmin.SaveRows"}) {
    EXPECT_FALSE(may(Role::kReader, m)) << m;
  }
}

TEST(RolesTable, DescribesRoleSets) {
  EXPECT_EQ(DescribeRoles(RoleBit(Role::kAdmin)), "admin");
  EXPECT_EQ(DescribeRoles(RoleBit(Role::kAdmin) | RoleBit(Role::kCoordinator)),
            "admin or coordinator");
  EXPECT_EQ(DescribeRoles(AllowedRoles("ShardAdmin.Stats")),
            "admin, coordinator or reader");
}

TEST(CallGate, PlaintextAllowsEverything) {
  CallGate gate(/*enforce=*/false, CallGateOptions(), nullptr);
  grpc::ServerContext context;
  absl::StatusOr<Admission> a = gate.Admit(context, "ShardAdmin.SetShardMap");
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->Require(RoleBit(Role::kWorker), "create rows").ok());
}

TEST(CallGate, AnUnauthenticatedCallerIsRefusedWhenEnforcing) {
  CallGate gate(/*enforce=*/true, CallGateOptions(), nullptr);
  grpc::ServerContext context;  // no auth context: plaintext
  absl::StatusOr<Admission> a = gate.Admit(context, "ShardAdmin.Stats");
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace recps::rpc
