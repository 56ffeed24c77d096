// recps launch's ranks from flags, SLURM and a Kubernetes indexed Job.
#include "client/launcher/launch_topology.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recps::client {
namespace {

using ::testing::HasSubstr;

GetEnv Env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

std::vector<std::pair<int, int>> Ranks(const LaunchTopology& t) {
  std::vector<std::pair<int, int>> out;
  for (const LaunchedWorker& w : t.workers) out.push_back({w.rank, w.local_rank});
  return out;
}

TEST(LaunchTopology, OneNodeByDefault) {
  absl::StatusOr<LaunchTopology> t = ResolveLaunchTopology({}, Env({}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->world_size, 1);
  EXPECT_EQ(t->nnodes, 1);
  EXPECT_EQ(t->node_rank, 0);
  EXPECT_THAT(Ranks(*t), ::testing::ElementsAre(std::make_pair(0, 0)));
}

TEST(LaunchTopology, FlagsGiveRanksOfThisNode) {
  LaunchFlags flags;
  flags.nproc_per_node = 4;
  flags.nnodes = 3;
  flags.node_rank = 2;
  // Flags win over the environment.
  absl::StatusOr<LaunchTopology> t =
      ResolveLaunchTopology(flags, Env({{"SLURM_NODEID", "0"}, {"SLURM_NNODES", "8"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->world_size, 12);
  EXPECT_EQ(t->local_world_size, 4);
  EXPECT_EQ(t->source, "--node_rank");
  EXPECT_THAT(Ranks(*t), ::testing::ElementsAre(std::make_pair(8, 0), std::make_pair(9, 1),
                                                std::make_pair(10, 2),
                                                std::make_pair(11, 3)));
}

TEST(LaunchTopology, SlurmOneTaskPerNode) {
  LaunchFlags flags;
  flags.nproc_per_node = 2;
  absl::StatusOr<LaunchTopology> t = ResolveLaunchTopology(
      flags, Env({{"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "2"},
                  {"SLURM_PROCID", "1"}, {"SLURM_LOCALID", "0"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "SLURM_NODEID");
  EXPECT_EQ(t->world_size, 4);
  EXPECT_THAT(Ranks(*t), ::testing::ElementsAre(std::make_pair(2, 0), std::make_pair(3, 1)));
}

TEST(LaunchTopology, SlurmOneTaskPerWorker) {
  // srun --nodes=2 --ntasks-per-node=4: task 6 is node 1's local rank 2.
  absl::StatusOr<LaunchTopology> t = ResolveLaunchTopology(
      {}, Env({{"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "8"},
               {"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "2"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->world_size, 8);
  EXPECT_EQ(t->local_world_size, 4);
  EXPECT_EQ(t->node_rank, 1);
  EXPECT_THAT(Ranks(*t), ::testing::ElementsAre(std::make_pair(6, 2)));
}

TEST(LaunchTopology, KubernetesIndexedJob) {
  LaunchFlags flags;
  flags.nproc_per_node = 8;
  flags.nnodes = 4;
  absl::StatusOr<LaunchTopology> t =
      ResolveLaunchTopology(flags, Env({{"JOB_COMPLETION_INDEX", "3"}}));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->source, "JOB_COMPLETION_INDEX");
  EXPECT_EQ(t->world_size, 32);
  ASSERT_EQ(t->workers.size(), 8u);
  EXPECT_EQ(t->workers.front().rank, 24);
  EXPECT_EQ(t->workers.back().rank, 31);
}

TEST(LaunchTopology, RefusesWhatCannotBeRight) {
  LaunchFlags several;
  several.nnodes = 2;
  absl::StatusOr<LaunchTopology> t = ResolveLaunchTopology(several, Env({}));
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("--node_rank"));

  LaunchFlags out_of_range;
  out_of_range.nnodes = 2;
  out_of_range.node_rank = 2;
  t = ResolveLaunchTopology(out_of_range, Env({}));
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();

  t = ResolveLaunchTopology({}, Env({{"JOB_COMPLETION_INDEX", "x"}}));
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("JOB_COMPLETION_INDEX"));

  // Index 1 of a job the flags say has one node.
  t = ResolveLaunchTopology({}, Env({{"JOB_COMPLETION_INDEX", "1"}}));
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();

  LaunchFlags zero;
  zero.nproc_per_node = 0;
  t = ResolveLaunchTopology(zero, Env({}));
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
}

// `recps launch --gpus=...`: each local rank sees one GPU and is told to
// train on it; the user's worker flags come after (and so win).
TEST(AssignGpu, EachLocalRankGetsItsGpuAndACudaDevice) {
  const std::vector<std::string> gpus = {"3", "5"};
  const GpuAssignment r0 = AssignGpu(gpus, 0);
  EXPECT_EQ(r0.env, std::vector<std::string>{"CUDA_VISIBLE_DEVICES=3"});
  EXPECT_EQ(r0.args, std::vector<std::string>{"--device=cuda:0"});
  EXPECT_EQ(r0.where, "GPU 3");
  EXPECT_EQ(AssignGpu(gpus, 1).env, std::vector<std::string>{"CUDA_VISIBLE_DEVICES=5"});
  // More ranks than GPUs: round-robin (the launcher warns).
  EXPECT_EQ(AssignGpu(gpus, 2).env, std::vector<std::string>{"CUDA_VISIBLE_DEVICES=3"});
  const GpuAssignment cpu = AssignGpu({}, 0);
  EXPECT_TRUE(cpu.env.empty());
  EXPECT_TRUE(cpu.args.empty());
  EXPECT_EQ(cpu.where, "CPU");
}

}  // namespace
}  // namespace recps::client
