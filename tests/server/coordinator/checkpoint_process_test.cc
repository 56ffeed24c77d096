// Checkpoints orchestrated by a real recps-coordinator over real recps-shard
// processes, with two fake workers (CoordinatorClient::CheckpointCut) and an
// embedding client that trains rows: a complete checkpoint with its
// manifest, an increment after it, a server that fails mid-checkpoint,
// --restore onto another number of servers (rows bit-identical, resume
// state), the startup refusals, and recpsctl against the coordinator.
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator_client.h"
#include "client/embedding_client.h"
#include "common/rpc/channels.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/checkpoint/manifest.h"
#include "tests/testing/files.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::testing::HasSubstr;
using testing::LocalShard;
using testing::TempDir;
namespace ck = server::checkpoint;

constexpr char kTables[] = R"(
tables { name: "user" dim: 8 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
tables { name: "item" dim: 8 num_rows: 500 optimizer { kind: SGD learning_rate: 0.05 } }
)";
const int kDims[] = {8, 8};

std::string Job(const std::string& checkpoint_dir, bool incremental, int seed = 7) {
  return absl::StrCat(R"(
name: "ckjob"
tables { name: "user" dim: 8 optimizer { kind: ADAGRAD learning_rate: 0.1 } }
tables { name: "item" dim: 8 num_rows: 500 optimizer { kind: SGD learning_rate: 0.05 } }
features { name: "f0" table: "user" }
features { name: "f1" table: "item" }
model { bottom_mlp: 8 top_mlp: 1 }
training { batch_size: 32 steps: 100 seed: )", seed, R"( eval_batches: 1 eval_interval: 50
           dense_optimizer { kind: SGD learning_rate: 0.1 }
           checkpoint { dir: ")", checkpoint_dir, R"(" keep_last: 5 incremental: )",
                      incremental ? "true" : "false", R"( } }
data { synthetic { seed: 1 num_dense: 4
                   features { id_space: 1000 min_ids_per_bag: 1 max_ids_per_bag: 1 }
                   features { id_space: 500 min_ids_per_bag: 1 max_ids_per_bag: 1 } } }
)");
}

struct Output {
  int code = -1;
  std::string out, err;
};

// Runs `binary args` to completion through sh, capturing its output.
Output RunBinary(const TempDir& dir, const std::string& binary,
           const std::vector<std::string>& args) {
  std::vector<std::string> quoted = {binary};
  for (const std::string& a : args) quoted.push_back("'" + a + "'");
  quoted.push_back("--insecure");  // the test's daemons are plaintext
  const std::string out = dir.path() + "/run.out", err = dir.path() + "/run.err";
  absl::StatusOr<int> code = testing::RunProcess(
      "/bin/sh", {"-c", absl::StrCat(absl::StrJoin(quoted, " "), " >", out, " 2>", err)},
      absl::Seconds(60));
  EXPECT_TRUE(code.ok()) << code.status();
  return {code.ok() ? *code : -1, ::recps::testing::ReadAll(out), ::recps::testing::ReadAll(err)};
}

uint64_t MapEpoch(const std::string& address) {
  auto stub = v1::ShardAdmin::NewStub(rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  rpc::SetTimeout(absl::Seconds(5), &ctx);
  v1::ShardMap map;
  return stub->GetShardMap(&ctx, v1::GetShardMapRequest(), &map).ok() ? map.epoch() : 0;
}

float Grad(int64_t step, int64_t id, int j) {
  return static_cast<float>((id * 31 + step * 7 + j) % 17 - 8) * 0.01f;
}

using Cluster = testing::CoordinatedCluster;

class CheckpointProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = dir_.path() + "/ckpt";
    tables_ = dir_.WriteFile("tables.textproto", kTables);
  }

  Cluster Start(int n, const std::string& job_text, const std::string& state,
                const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "--state_dir=" + dir_.path() + "/" + state,
        "--job=" + dir_.WriteFile(state + ".job.textproto", job_text),
        absl::StrCat("--num_shards=", n), "--num_slots=64", "--world_size=2",
        "--lease=3s", "--tick=20ms", "--checkpoint_cut_timeout=20s"};
    args.insert(args.end(), extra.begin(), extra.end());
    absl::StatusOr<Cluster> started = testing::StartCoordinatedCluster(
        RECPS_COORDINATOR_BINARY, args, RECPS_SHARD_BINARY,
        {"--tables=" + tables_, "--num_slots=64", "--threads=2", "--seed=7", "--world_size=1",
         "--consistency=sync", "--step_timeout=20s"},
        n);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return Cluster();
    Cluster c = *std::move(started);
    for (const std::string& a : c.addresses) {
      EXPECT_TRUE(testing::Eventually([&] { return MapEpoch(a) >= 1; })) << a;
    }
    return c;
  }

  static std::unique_ptr<client::EmbeddingClient> Client(const Cluster& c) {
    client::EmbeddingClientOptions options;
    options.worker_rank = 0;
    options.rpc_timeout = absl::Seconds(30);
    auto client = client::EmbeddingClient::Create(
        {{"user", 8}, {"item", 8}}, client::MakeServerShardMapSource(c.addresses), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Training steps [from, to): lookups and pushes of users and items.
  void Train(client::EmbeddingClient* client, int64_t from, int64_t to) {
    for (int64_t step = from; step < to; ++step) {
      const std::vector<int64_t>* ids[] = {&users_, &items_};
      std::vector<float> out[2], grads[2];
      for (int t = 0; t < 2; ++t) {
        out[t].resize(ids[t]->size() * kDims[t]);
        for (int64_t id : *ids[t]) {
          for (int j = 0; j < kDims[t]; ++j) grads[t].push_back(Grad(step, id, j));
        }
      }
      ASSERT_TRUE(client->Lookup(step, {{0, users_, out[0].data()},
                                        {1, items_, out[1].data()}}).ok());
      ASSERT_TRUE(client->PushGradients(step, {{0, users_, grads[0].data()},
                                               {1, items_, grads[1].data()}}).ok());
    }
  }

  // The weights a lookup of step `step` returns, both tables.
  std::vector<float> Weights(client::EmbeddingClient* client, int64_t step) {
    std::vector<float> users(users_.size() * 8), items(items_.size() * 8);
    EXPECT_TRUE(client->Lookup(step, {{0, users_, users.data()},
                                      {1, items_, items.data()}}).ok());
    users.insert(users.end(), items.begin(), items.end());
    return users;
  }

  // Both fake workers cut at `step`; rank 0 sends a dense state.
  std::vector<absl::StatusOr<v1::CheckpointCutResponse>> Cut(const Cluster& c,
                                                               uint64_t step,
                                                               bool wait = true) {
    return Cut(c.coordinator->address(), step, wait);
  }
  std::vector<absl::StatusOr<v1::CheckpointCutResponse>> Cut(const std::string& address,
                                                               uint64_t step,
                                                               bool wait = true) {
    std::vector<absl::StatusOr<v1::CheckpointCutResponse>> results(
        2, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < 2; ++rank) {
      threads.emplace_back([&, rank] {
        client::CoordinatorClient client(address);
        v1::CheckpointCutRequest request;
        request.set_rank(rank);
        request.set_step(step);
        request.set_wait_complete(wait);
        request.set_reason("periodic");
        request.mutable_position()->set_batches_read(static_cast<int64_t>(step));
        request.mutable_position()->set_source_state("rank" + std::to_string(rank));
        if (rank == 0) request.set_dense_state(DenseFor(step));
        results[rank] = client.CheckpointCut(request, absl::Seconds(60));
      });
    }
    for (std::thread& t : threads) t.join();
    return results;
  }

  static std::string DenseFor(uint64_t step) {
    return std::string(1000 + step, static_cast<char>('a' + step % 26));
  }

  v1::ListCheckpointsResponse List(const Cluster& c) {
    client::CoordinatorClient client(c.coordinator->address());
    absl::StatusOr<v1::ListCheckpointsResponse> list = client.ListCheckpoints();
    EXPECT_TRUE(list.ok()) << list.status();
    return list.ok() ? *list : v1::ListCheckpointsResponse();
  }

  TempDir dir_;
  std::string root_;
  std::string tables_;
  std::vector<int64_t> users_ = {1, 7, 99, 1234, 77777, 5, 6, 8};
  std::vector<int64_t> items_ = {0, 3, 42, 499, 250};
};

TEST_F(CheckpointProcessTest, CutWritesCheckpointThenIncrementThenRestoresOntoThree) {
  std::vector<float> at10;
  {
    Cluster c = Start(2, Job(root_, /*incremental=*/true), "state");
    ASSERT_EQ(c.shards.size(), 2u);
    auto client = Client(c);
    Train(client.get(), 0, 5);
    for (const auto& r : Cut(c, 5)) {
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->complete());
    }
    absl::StatusOr<v1::CheckpointManifest> full =
        ck::ReadManifest(root_ + "/" + ck::CheckpointDirName(5));
    ASSERT_TRUE(full.ok()) << full.status();
    EXPECT_EQ(full->kind(), v1::CHECKPOINT_KIND_FULL);
    ASSERT_EQ(full->files_size(), 2);
    EXPECT_EQ(full->files(0).rows() + full->files(1).rows(), 13);
    EXPECT_EQ(full->dense().size_bytes(), DenseFor(5).size());
    ASSERT_EQ(full->workers_size(), 2);
    EXPECT_EQ(full->workers(1).source_state(), "rank1");

    Train(client.get(), 5, 10);
    for (const auto& r : Cut(c, 10)) ASSERT_TRUE(r.ok()) << r.status();
    absl::StatusOr<v1::CheckpointManifest> inc =
        ck::ReadManifest(root_ + "/" + ck::CheckpointDirName(10));
    ASSERT_TRUE(inc.ok()) << inc.status();
    EXPECT_EQ(inc->kind(), v1::CHECKPOINT_KIND_INCREMENTAL);
    EXPECT_EQ(inc->base_step(), 5u);
    EXPECT_EQ(inc->full_step(), 5u);
    at10 = Weights(client.get(), 10);

    // recpsctl lists them and asks for another.
    Output list = RunBinary(dir_, RECPSCTL_BINARY,
                      {"checkpoints", "--json", "--coordinator=" + c.coordinator->address()});
    ASSERT_EQ(list.code, 0) << list.err;
    v1::ListCheckpointsResponse parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(list.out, &parsed).ok())
        << list.out;
    ASSERT_EQ(parsed.checkpoints_size(), 2);
    EXPECT_EQ(parsed.checkpoints(1).kind(), v1::CHECKPOINT_KIND_INCREMENTAL);
    EXPECT_EQ(parsed.checkpoints(1).base_step(), 5u);
    EXPECT_EQ(parsed.checkpoints(0).rows(), 13);
    Output text = RunBinary(dir_, RECPSCTL_BINARY,
                      {"checkpoints", "--coordinator=" + c.coordinator->address()});
    ASSERT_EQ(text.code, 0) << text.err;
    EXPECT_THAT(text.out, HasSubstr("incremental"));
    EXPECT_THAT(text.out, HasSubstr("periodic"));
    Output now = RunBinary(dir_, RECPSCTL_BINARY,
                     {"checkpoint", "now", "--coordinator=" + c.coordinator->address()});
    ASSERT_EQ(now.code, 0) << now.err;
    EXPECT_THAT(now.out, HasSubstr("request 1"));
  }

  // A fresh run on the same directory is refused; a mismatched job too.
  {
    Output fresh = RunBinary(dir_, RECPS_COORDINATOR_BINARY,
                       {"--state_dir=" + dir_.path() + "/fresh",
                        "--job=" + dir_.WriteFile("j.textproto", Job(root_, true))});
    EXPECT_EQ(fresh.code, 2);
    EXPECT_THAT(fresh.err, HasSubstr("--restore"));
    EXPECT_THAT(fresh.err, HasSubstr("of this job"));
    Output other = RunBinary(dir_, RECPS_COORDINATOR_BINARY,
                       {"--state_dir=" + dir_.path() + "/other", "--restore=latest",
                        "--job=" + dir_.WriteFile("o.textproto", Job(root_, true, /*seed=*/8))});
    EXPECT_EQ(other.code, 2);
    EXPECT_THAT(other.err, HasSubstr("step-000000000010/MANIFEST"));
  }

  // Restore onto three servers: the rows come back bit-identical, the
  // workers get step, dense state and positions.
  Cluster c = Start(3, Job(root_, true), "restored", {"--restore=latest"});
  ASSERT_EQ(c.shards.size(), 3u);
  client::CoordinatorClient coordinator(c.coordinator->address());
  absl::StatusOr<v1::GetResumeStateResponse> resume =
      coordinator.GetResumeState(1, absl::Seconds(60));
  ASSERT_TRUE(resume.ok()) << resume.status();
  EXPECT_TRUE(resume->resume());
  EXPECT_EQ(resume->step(), 10u);
  EXPECT_EQ(resume->dense_state(), DenseFor(10));
  EXPECT_EQ(resume->position().rank(), 1);
  EXPECT_EQ(resume->position().source_state(), "rank1");
  auto client = Client(c);
  EXPECT_EQ(Weights(client.get(), 10), at10);
  EXPECT_EQ(List(c).restored_step(), 10u);
  // A cut at the restored step finds it complete; the next one is an
  // increment on the restored checkpoint (every server restored it).
  for (const auto& r : Cut(c, 10)) EXPECT_TRUE(r.ok()) << r.status();
  Train(client.get(), 10, 12);
  for (const auto& r : Cut(c, 12)) ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<v1::CheckpointManifest> next =
      ck::ReadManifest(root_ + "/" + ck::CheckpointDirName(12));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->kind(), v1::CHECKPOINT_KIND_INCREMENTAL);
  EXPECT_EQ(next->base_step(), 10u);
  EXPECT_EQ(next->full_step(), 5u);
  EXPECT_EQ(next->files_size(), 3);
}

TEST_F(CheckpointProcessTest, FailedServerLeavesNoManifestAndKeepsThePrevious) {
  Cluster c = Start(2, Job(root_, false), "state");
  ASSERT_EQ(c.shards.size(), 2u);
  auto client = Client(c);
  Train(client.get(), 0, 3);
  for (const auto& r : Cut(c, 3)) ASSERT_TRUE(r.ok()) << r.status();

  // Shard 1 cannot write its file (a directory is in the way).
  Train(client.get(), 3, 4);
  const std::string step4 = root_ + "/" + ck::CheckpointDirName(4);
  ASSERT_EQ(mkdir(step4.c_str(), 0755), 0);
  ASSERT_EQ(mkdir((step4 + "/shard-00001.sst").c_str(), 0755), 0);
  for (const auto& r : Cut(c, 4)) EXPECT_FALSE(r.ok());
  EXPECT_FALSE(ck::ReadManifest(step4).ok());
  v1::ListCheckpointsResponse list = List(c);
  EXPECT_THAT(list.last_error(), HasSubstr("step 4"));
  EXPECT_THAT(list.last_error(), HasSubstr("(shard 1)"));
  EXPECT_THAT(list.last_error(), HasSubstr("shard-00001.sst"));

  // A killed server: the checkpoint fails, the previous one stays.
  Train(client.get(), 4, 5);
  c.shards[1]->Kill();
  for (const auto& r : Cut(c, 5, /*wait=*/false)) {
    // ABORTED, not UNAVAILABLE: the client must not resend the arrival.
    EXPECT_TRUE(absl::IsAborted(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(c.addresses[1]));
  }
  EXPECT_FALSE(ck::ReadManifest(root_ + "/" + ck::CheckpointDirName(5)).ok());
  list = List(c);
  ASSERT_EQ(list.checkpoints_size(), 1);
  EXPECT_EQ(list.checkpoints(0).step(), 3u);
  EXPECT_THAT(list.last_error(), HasSubstr("step 5"));
  absl::StatusOr<v1::CheckpointManifest> kept =
      ck::ReadManifest(root_ + "/" + ck::CheckpointDirName(3));
  EXPECT_TRUE(kept.ok()) << kept.status();
  Output failed = RunBinary(dir_, RECPSCTL_BINARY,
                      {"checkpoints", "--coordinator=" + c.coordinator->address()});
  EXPECT_EQ(failed.code, 0);
  EXPECT_THAT(failed.out, HasSubstr("last error: checkpoint at step 5 failed"));
}

TEST_F(CheckpointProcessTest, CutAcrossACoordinatorRestart) {
  Cluster c = Start(2, Job(root_, false), "state");
  ASSERT_EQ(c.shards.size(), 2u);
  // A worker registered: the job ran (a restart must not refuse the
  // checkpoints it wrote).
  std::string member_id;
  {
    client::CoordinatorClient worker(c.coordinator->address());
    v1::RegisterRequest r;
    r.set_role(v1::WORKER);
    r.set_rank(0);
    auto registered = worker.Register(r);
    ASSERT_TRUE(registered.ok()) << registered.status();
    member_id = registered->member_id();
    ASSERT_TRUE(worker.RequestCheckpoint("").ok());
  }
  auto client = Client(c);
  Train(client.get(), 0, 3);
  for (const auto& r : Cut(c, 3)) ASSERT_TRUE(r.ok()) << r.status();
  Train(client.get(), 3, 5);

  // The coordinator dies; the workers' cut at step 5 waits for its
  // restart (their client resends on UNAVAILABLE) and completes there.
  const std::string address = c.coordinator->address();
  const std::string port = address.substr(address.rfind(':') + 1);
  c.coordinator->Kill();
  c.coordinator.reset();
  std::vector<absl::StatusOr<v1::CheckpointCutResponse>> results;
  std::thread cut([&] { results = Cut(address, 5); });
  auto restarted = LocalShard::Start(
      RECPS_COORDINATOR_BINARY,
      {"--state_dir=" + dir_.path() + "/state", "--listen=127.0.0.1:" + port,
       "--num_shards=2", "--num_slots=64", "--world_size=2", "--lease=3s",
       "--tick=20ms", "--checkpoint_cut_timeout=20s"});
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  c.coordinator = *std::move(restarted);
  cut.join();
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->complete());
  }
  EXPECT_TRUE(ck::ReadManifest(root_ + "/" + ck::CheckpointDirName(5)).ok());

  // `recpsctl checkpoint now --wait`: the worker sees the request in its
  // heartbeat (id 2: kept across the restart), cuts, recpsctl prints it.
  Output now;
  std::thread ctl([&] {
    now = RunBinary(dir_, RECPSCTL_BINARY,
                    {"checkpoint", "now", "--wait", "--timeout=60s",
                     "--coordinator=" + c.coordinator->address()});
  });
  client::CoordinatorClient worker(c.coordinator->address());
  EXPECT_TRUE(testing::Eventually([&] {
    auto hb = worker.HeartbeatOnce(member_id);
    return hb.ok() && hb->checkpoint_request_id() == 2;
  }));
  Train(client.get(), 5, 6);
  for (const auto& r : Cut(c, 6)) EXPECT_TRUE(r.ok()) << r.status();
  ctl.join();
  EXPECT_EQ(now.code, 0) << now.err;
  EXPECT_THAT(now.out, HasSubstr("checkpoint at step 6 complete"));
}

}  // namespace
}  // namespace recps
