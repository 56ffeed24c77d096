// Checkpoints through real recps-shard processes: ShardAdmin.SaveRows /
// SaveRowsStatus / RestoreRows, incremental chains, compaction and export.
// The expected rows come from an in-process host store given the same
// lookups and pushes (same seed, same kernels: bit-identical).
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/embedding_client.h"
#include "common/config/table_config.h"
#include "common/rpc/channels.h"
#include "common/wire/shard_map.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "server/checkpoint/chain.h"
#include "server/checkpoint/compact.h"
#include "server/checkpoint/export.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/row_file.h"
#include "server/checkpoint/store_rows.h"
#include "server/store/embedding_store.h"
#include "tests/server/shard/shard_stats.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

namespace ck = server::checkpoint;
namespace fs = std::filesystem;
using testing::LocalShard;
using testing::TempDir;

constexpr uint32_t kSlots = 64;
constexpr char kDigest[] = "00000000000000d1";
constexpr char kTables[] = R"(
tables {
  name: "user"
  dim: 8
  optimizer { kind: ADAGRAD learning_rate: 0.1 }
}
tables {
  name: "item"
  dim: 4
  num_rows: 500
  optimizer { kind: SGD learning_rate: 0.05 }
}
)";
const int kDims[] = {8, 4};

std::unique_ptr<server::EmbeddingStore> MakeReference() {
  v1::TablesConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(kTables, &config));
  auto specs = config::TableSpecsFromConfig(config);
  EXPECT_TRUE(specs.ok()) << specs.status();
  server::StoreOptions options;
  options.seed = 7;
  options.num_slots = kSlots;
  options.max_rows_per_table = 1 << 16;
  auto store = server::CreateHostEmbeddingStore(*specs, options);
  EXPECT_TRUE(store.ok()) << store.status();
  return *std::move(store);
}

float Grad(int64_t step, int64_t id, int j) {
  return static_cast<float>((id * 31 + step * 7 + j) % 17 - 8) * 0.01f;
}

std::vector<int64_t> Range(int64_t begin, int64_t end) {
  std::vector<int64_t> out;
  for (int64_t i = begin; i < end; ++i) out.push_back(i);
  return out;
}

template <typename Request, typename Response, typename Call>
grpc::Status AdminCall(const std::string& address, Call call,
                       const Request& request, Response* response) {
  auto stub = v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return ((*stub).*call)(&ctx, request, response);
}

class ShardCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    args_ = {"--tables=" + dir_.WriteFile("tables.textproto", kTables),
             "--world_size=1", "--consistency=sync",
             absl::StrCat("--num_slots=", kSlots), "--seed=7",
             "--step_timeout=20s", "--threads=2"};
    root_ = dir_.path() + "/ckpt";
  }

  // `n` fresh servers with one map over them (epoch 1).
  std::vector<std::unique_ptr<LocalShard>> StartServers(int n) {
    std::vector<std::unique_ptr<LocalShard>> out;
    std::vector<std::string> addresses;
    for (int i = 0; i < n; ++i) {
      auto s = LocalShard::Start(RECPS_SHARD_BINARY, args_);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok()) return {};
      addresses.push_back((*s)->address());
      out.push_back(*std::move(s));
    }
    EXPECT_TRUE(testing::InstallShardMap(addresses, 1, kSlots).ok());
    return out;
  }

  static std::vector<std::string> Addresses(
      const std::vector<std::unique_ptr<LocalShard>>& servers) {
    std::vector<std::string> out;
    for (const auto& s : servers) out.push_back(s->address());
    return out;
  }

  static std::unique_ptr<client::EmbeddingClient> Client(
      const std::vector<std::unique_ptr<LocalShard>>& servers) {
    client::EmbeddingClientOptions options;
    options.worker_rank = 0;
    options.rpc_timeout = absl::Seconds(30);
    auto c = client::EmbeddingClient::Create(
        {{"user", 8}, {"item", 4}},
        client::MakeServerShardMapSource(Addresses(servers)), options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // One training step on the cluster (when given) and on the reference:
  // lookup of users and items, then their gradients.
  static void Step(client::EmbeddingClient* client,
                   server::EmbeddingStore* ref, int64_t step,
                   const std::vector<int64_t>& users,
                   const std::vector<int64_t>& items) {
    const std::vector<int64_t>* ids[] = {&users, &items};
    std::vector<float> out[2], grads[2];
    for (int t = 0; t < 2; ++t) {
      out[t].resize(ids[t]->size() * kDims[t]);
      for (size_t i = 0; i < ids[t]->size(); ++i) {
        for (int j = 0; j < kDims[t]; ++j) {
          grads[t].push_back(Grad(step, (*ids[t])[i], j));
        }
      }
    }
    if (client != nullptr) {
      ASSERT_TRUE(client
                      ->Lookup(step, {{0, users, out[0].data()},
                                      {1, items, out[1].data()}})
                      .ok());
      ASSERT_TRUE(client
                      ->PushGradients(step, {{0, users, grads[0].data()},
                                             {1, items, grads[1].data()}})
                      .ok());
    }
    if (ref != nullptr) {
      for (int t = 0; t < 2; ++t) {
        std::vector<float> w(ids[t]->size() * kDims[t]);
        ASSERT_TRUE(ref->Lookup(t, *ids[t], w.data()).ok());
        ASSERT_TRUE(ref->ApplyGradients(t, *ids[t], grads[t].data()).ok());
      }
    }
  }

  // Every stored row of the reference: table -> id -> fused row.
  static std::map<int64_t, std::vector<float>> Rows(
      const server::EmbeddingStore& store, int table) {
    std::map<int64_t, std::vector<float>> out;
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      server::SlotCursor cursor;
      server::SlotChunk chunk;
      while (!cursor.done) {
        EXPECT_TRUE(store.ExportSlot(table, slot, &cursor, 1024, &chunk).ok());
        for (size_t i = 0; i < chunk.ids.size(); ++i) {
          out[chunk.ids[i]].assign(chunk.rows.begin() + i * chunk.row_stride,
                                   chunk.rows.begin() + (i + 1) * chunk.row_stride);
        }
      }
    }
    return out;
  }

  // SaveRows on server `shard`; the status of the call.
  grpc::Status Save(const std::string& address, uint64_t step, int shard,
                    bool incremental = false, uint64_t base = 0,
                    const std::string& path = "") {
    v1::SaveRowsRequest req;
    req.set_step(step);
    req.set_path(path.empty() ? FilePath(step, shard) : path);
    req.set_incremental(incremental);
    req.set_base_step(base);
    req.set_shard(static_cast<uint32_t>(shard));
    req.set_job_config_digest(kDigest);
    v1::SaveRowsResponse resp;
    return AdminCall(address, &v1::ShardAdmin::Stub::SaveRows, req, &resp);
  }

  std::string FilePath(uint64_t step, int shard) const {
    return absl::StrCat(root_, "/", ck::CheckpointDirName(step), "/shard-",
                        shard, ".sst");
  }

  // Waits for DONE; the file's manifest entry.
  static v1::CheckpointFile WaitDone(const std::string& address, uint64_t step) {
    v1::SaveRowsStatusResponse status;
    EXPECT_TRUE(testing::Eventually([&] {
      v1::SaveRowsStatusRequest req;
      req.set_step(step);
      status.Clear();
      EXPECT_TRUE(AdminCall(address, &v1::ShardAdmin::Stub::SaveRowsStatus, req,
                            &status)
                      .ok());
      return status.state() == v1::SaveRowsStatusResponse::DONE ||
             status.state() == v1::SaveRowsStatusResponse::FAILED;
    })) << "step " << step;
    EXPECT_EQ(status.state(), v1::SaveRowsStatusResponse::DONE) << status.error();
    return status.file();
  }

  // The coordinator's part: the manifest over the servers' files.
  std::string Commit(uint64_t step, const std::vector<v1::CheckpointFile>& files,
                     uint64_t base = 0, uint64_t full = 0) {
    v1::CheckpointManifest m;
    m.set_format_version(ck::kManifestFormatVersion);
    m.set_kind(base == 0 && full == 0 ? v1::CHECKPOINT_KIND_FULL
                                      : v1::CHECKPOINT_KIND_INCREMENTAL);
    m.set_step(step);
    m.set_base_step(base);
    m.set_full_step(full);
    m.set_job_config_digest(kDigest);
    m.set_num_slots(kSlots);
    for (const v1::CheckpointTable& t : ck::StoreLayout(*MakeReference())) {
      *m.add_tables() = t;
    }
    for (const v1::CheckpointFile& f : files) *m.add_files() = f;
    m.mutable_dense()->set_name("dense.pb");  // compaction must keep it
    const std::string dir = absl::StrCat(root_, "/", ck::CheckpointDirName(step));
    EXPECT_TRUE(ck::WriteManifest(dir, m).ok());
    return dir;
  }

  static grpc::Status Restore(const std::string& address,
                              const std::vector<std::string>& dirs,
                              uint64_t step, const std::string& digest = kDigest) {
    v1::RestoreRowsRequest req;
    for (const std::string& d : dirs) req.add_checkpoint_dirs(d);
    req.set_step(step);
    req.set_expected_digest(digest);
    v1::RestoreRowsResponse resp;
    return AdminCall(address, &v1::ShardAdmin::Stub::RestoreRows, req, &resp);
  }

  // Lookups of every id of `expected` at `step` match its weights bit for bit.
  static void ExpectWeights(client::EmbeddingClient* client, int64_t step,
                            const server::EmbeddingStore& expected) {
    for (int t = 0; t < 2; ++t) {
      const auto rows = Rows(expected, t);
      std::vector<int64_t> ids;
      for (const auto& [id, row] : rows) ids.push_back(id);
      std::vector<float> out(ids.size() * kDims[t]);
      ASSERT_TRUE(client->Lookup(step, {{t, ids, out.data()}}).ok());
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(std::memcmp(out.data() + i * kDims[t],
                              rows.at(ids[i]).data(), kDims[t] * 4),
                  0)
            << "table " << t << " id " << ids[i];
      }
    }
  }

  TempDir dir_;
  std::vector<std::string> args_;
  std::string root_;
};

// The rows of a checkpoint file set, read back: table -> id -> row.
std::map<int64_t, std::vector<float>> FileRows(const std::string& dir,
                                               const v1::CheckpointManifest& m,
                                               const std::string& table) {
  std::map<int64_t, std::vector<float>> out;
  for (const v1::CheckpointFile& f : m.files()) {
    auto r = ck::RowFileReader::Open(dir + "/" + f.name(), f.size_bytes(),
                                     f.crc32c());
    EXPECT_TRUE(r.ok()) << r.status();
    const v1::CheckpointTable* layout = (*r)->FindTable(table);
    if (layout == nullptr) continue;
    std::vector<uint32_t> slots;
    for (uint32_t s = 0; s < kSlots; ++s) slots.push_back(s);
    EXPECT_TRUE((*r)->ReadSlots(*layout, slots, 100,
                                [&](uint32_t, absl::Span<const int64_t> ids,
                                    const float* rows) {
                                  for (size_t i = 0; i < ids.size(); ++i) {
                                    out[ids[i]].assign(
                                        rows + i * layout->row_stride(),
                                        rows + (i + 1) * layout->row_stride());
                                  }
                                  return absl::OkStatus();
                                })
                    .ok());
  }
  return out;
}

TEST_F(ShardCheckpointTest, SaveOnTwoRestoreOntoOneAndThreeBitExact) {
  auto two = StartServers(2);
  ASSERT_EQ(two.size(), 2u);
  auto client = Client(two);
  auto ref = MakeReference();
  for (int64_t step = 0; step < 3; ++step) {
    Step(client.get(), ref.get(), step, Range(step * 50, step * 50 + 200),
         Range(step * 20, step * 20 + 100));
  }
  const auto cut_users = Rows(*ref, 0);
  const auto cut_items = Rows(*ref, 1);
  for (int s = 0; s < 2; ++s) {
    const grpc::Status st = Save(two[s]->address(), 3, s);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  // Training goes on while the files are written: none of it may leak in.
  for (int64_t step = 3; step < 6; ++step) {
    Step(client.get(), nullptr, step, Range(0, 400), Range(0, 300));
  }
  std::vector<v1::CheckpointFile> files;
  for (int s = 0; s < 2; ++s) files.push_back(WaitDone(two[s]->address(), 3));
  const std::string dir = Commit(3, files);
  auto manifest = ck::ReadManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(FileRows(dir, *manifest, "user"), cut_users);
  EXPECT_EQ(FileRows(dir, *manifest, "item"), cut_items);
  // Repeated and late saves are refused.
  EXPECT_EQ(Save(two[0]->address(), 3, 0).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(Save(two[0]->address(), 4, 0).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // The cut's state, replayed, to continue from.
  auto at_cut = MakeReference();
  for (int64_t step = 0; step < 3; ++step) {
    Step(nullptr, at_cut.get(), step, Range(step * 50, step * 50 + 200),
         Range(step * 20, step * 20 + 100));
  }
  for (int n : {1, 3}) {
    auto servers = StartServers(n);
    ASSERT_EQ(servers.size(), static_cast<size_t>(n));
    for (const auto& s : servers) {
      const grpc::Status st = Restore(s->address(), {dir}, 3);
      ASSERT_TRUE(st.ok()) << st.error_message();
    }
    auto c = Client(servers);
    ExpectWeights(c.get(), 3, *at_cut);
    // A bit-identical continuation (optimizer state included).
    auto cont = MakeReference();
    for (int64_t step = 0; step < 4; ++step) {
      Step(nullptr, cont.get(), step, Range(step * 50, step * 50 + 200),
           Range(step * 20, step * 20 + 100));
    }
    Step(c.get(), nullptr, 3, Range(150, 350), Range(60, 160));
    ExpectWeights(c.get(), 4, *cont);
  }
}

TEST_F(ShardCheckpointTest, IncrementalChainCompactAndExport) {
  auto one = StartServers(1);
  ASSERT_EQ(one.size(), 1u);
  const std::string addr = one[0]->address();
  auto client = Client(one);
  auto ref = MakeReference();
  for (int64_t step = 0; step < 2; ++step) {
    Step(client.get(), ref.get(), step, Range(0, 300), Range(0, 200));
  }
  // Incremental without a base on this server: refused.
  EXPECT_EQ(Save(addr, 2, 0, true, 1).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Save(addr, 2, 0).ok());
  const v1::CheckpointFile full = WaitDone(addr, 2);
  Commit(2, {full});
  EXPECT_EQ(full.rows(), 500);
  // Step 2 touches 5 rows; step 3 touches 7 (2 of them new).
  Step(client.get(), ref.get(), 2, {1, 2, 3, 4, 5}, {});
  ASSERT_TRUE(Save(addr, 3, 0, true, 2).ok());
  const v1::CheckpointFile inc1 = WaitDone(addr, 3);
  Commit(3, {inc1}, 2, 2);
  Step(client.get(), ref.get(), 3, {3, 4, 5, 6, 7, 1000, 1001}, {});
  ASSERT_TRUE(Save(addr, 4, 0, true, 3).ok());
  const v1::CheckpointFile inc2 = WaitDone(addr, 4);
  Commit(4, {inc2}, 3, 2);
  // An increment's size follows the rows touched, not the table.
  EXPECT_EQ(inc1.rows(), 5);
  EXPECT_EQ(inc2.rows(), 7);
  EXPECT_LT(inc1.size_bytes() * 10, full.size_bytes());

  auto chain = ck::ResolveChain(root_);
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 3u);
  auto restored = StartServers(1);
  ASSERT_TRUE(Restore(restored[0]->address(), ck::ChainDirs(*chain), 4).ok());
  auto rc = Client(restored);
  ExpectWeights(rc.get(), 4, *ref);
  // The restored step is a base for the next increment there.
  Step(rc.get(), nullptr, 4, {8}, {});
  EXPECT_TRUE(Save(restored[0]->address(), 5, 0, true, 4).ok());
  EXPECT_EQ(WaitDone(restored[0]->address(), 5).rows(), 1);

  // Export of the chain: ids ascending, weights of the cut.
  auto exported = ck::ExportTable(*chain, "user", dir_.path() + "/export");
  ASSERT_TRUE(exported.ok()) << exported.status();
  const auto users = Rows(*ref, 0);
  ASSERT_EQ(exported->rows, static_cast<int64_t>(users.size()));
  std::ifstream ids_in(exported->ids_path, std::ios::binary);
  std::ifstream w_in(exported->weights_path, std::ios::binary);
  for (const auto& [id, row] : users) {
    int64_t got_id = 0;
    float w[8];
    ids_in.read(reinterpret_cast<char*>(&got_id), 8);
    w_in.read(reinterpret_cast<char*>(w), sizeof(w));
    ASSERT_EQ(got_id, id);
    ASSERT_EQ(std::memcmp(w, row.data(), sizeof(w)), 0) << id;
  }
  EXPECT_TRUE(fs::exists(exported->meta_path));

  // The same through recpsctl (offline).
  auto rc_export = testing::RunProcess(
      RECPSCTL_BINARY,
      {"export", dir_.path() + "/export2", "--table=item",
       "--dir=" + root_ + "@4", "--json"},
      absl::Seconds(60));
  ASSERT_TRUE(rc_export.ok()) << rc_export.status();
  EXPECT_EQ(*rc_export, 0);
  EXPECT_TRUE(fs::exists(dir_.path() + "/export2/item.meta.json"));
  EXPECT_EQ(fs::file_size(dir_.path() + "/export2/item.weights"), 200u * 4 * 4);

  // Compaction folds the chain into a full checkpoint at step 4.
  auto compacted = ck::CompactChain(root_, std::nullopt);
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  EXPECT_EQ(compacted->chain_length, 3);
  EXPECT_EQ(compacted->checkpoint.manifest.kind(), v1::CHECKPOINT_KIND_FULL);
  EXPECT_EQ(compacted->checkpoint.manifest.dense().name(), "dense.pb");
  EXPECT_EQ(compacted->rows, 502);
  auto after = ck::ResolveChain(root_);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->size(), 1u);
  EXPECT_FALSE(fs::exists(after->back().dir + "/shard-0.sst"));
  auto fresh = StartServers(2);
  for (const auto& s : fresh) {
    ASSERT_TRUE(Restore(s->address(), ck::ChainDirs(*after), 4).ok());
  }
  auto fc = Client(fresh);
  ExpectWeights(fc.get(), 4, *ref);
  auto rc_compact = testing::RunProcess(
      RECPSCTL_BINARY, {"checkpoint", "compact", "--dir=" + root_, "--step=4"},
      absl::Seconds(60));
  ASSERT_TRUE(rc_compact.ok());
  EXPECT_EQ(*rc_compact, 0);  // already full
  // Pruning keeps what the newest needs only.
  auto removed = ck::PruneCheckpoints(root_, 1);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 2u);
}

void FlipByte(const std::string& path, off_t offset) {
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c;
  ASSERT_EQ(pread(fd, &c, 1, offset), 1);
  c ^= 0x40;
  ASSERT_EQ(pwrite(fd, &c, 1, offset), 1);
  close(fd);
}

TEST_F(ShardCheckpointTest, BadCheckpointsAreRefusedBeforeAnyImport) {
  auto one = StartServers(1);
  ASSERT_EQ(one.size(), 1u);
  auto client = Client(one);
  Step(client.get(), nullptr, 0, Range(0, 100), Range(0, 50));
  // A directory that cannot be created: refused at once, naming the file.
  const std::string blocker = dir_.WriteFile("not-a-dir", "x");
  const grpc::Status bad_dir = Save(one[0]->address(), 1, 0, false, 0,
                                    blocker + "/step-1/shard-0.sst");
  EXPECT_FALSE(bad_dir.ok());
  EXPECT_NE(bad_dir.error_message().find(blocker), std::string::npos)
      << bad_dir.error_message();
  ASSERT_TRUE(Save(one[0]->address(), 1, 0).ok());
  const v1::CheckpointFile file = WaitDone(one[0]->address(), 1);
  const std::string dir = Commit(1, {file});
  const std::string path = dir + "/" + file.name();

  auto fresh = StartServers(1);
  const std::string target = fresh[0]->address();
  auto expect_nothing_imported = [&] {
    auto stats = testing::StatsOf(target);
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->total_rows(), 0);
  };
  // Another job's checkpoint.
  grpc::Status st = Restore(target, {dir}, 1, "00000000000000ff");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("MANIFEST"), std::string::npos);
  expect_nothing_imported();
  // Wrong step for the chain.
  EXPECT_EQ(Restore(target, {dir}, 2).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Corrupted, then truncated row file.
  const std::string saved = dir_.path() + "/saved.sst";
  fs::copy_file(path, saved);
  FlipByte(path, static_cast<off_t>(fs::file_size(path) / 2));
  st = Restore(target, {dir}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(st.error_message().find(path), std::string::npos) << st.error_message();
  expect_nothing_imported();
  fs::copy_file(saved, path, fs::copy_options::overwrite_existing);
  fs::resize_file(path, fs::file_size(path) - 100);
  st = Restore(target, {dir}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_NE(st.error_message().find(path), std::string::npos);
  expect_nothing_imported();
  // Missing manifest.
  fs::copy_file(saved, path, fs::copy_options::overwrite_existing);
  fs::rename(dir + "/MANIFEST", dir + "/MANIFEST.away");
  st = Restore(target, {dir}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find(dir + "/MANIFEST"), std::string::npos);
  expect_nothing_imported();
  fs::rename(dir + "/MANIFEST.away", dir + "/MANIFEST");
  // A store that already holds rows (a lookup created them).
  std::vector<float> out(4 * 8);
  auto fc = Client(fresh);
  ASSERT_TRUE(fc->Lookup(0, {{0, Range(0, 4), out.data()}}).ok());
  st = Restore(target, {dir}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("already holds"), std::string::npos)
      << st.error_message();
  // A server that trained already.
  st = Restore(one[0]->address(), {dir}, 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // A broken chain: an increment without its base.
  auto chain = ck::ResolveChain(root_, 7);
  EXPECT_EQ(chain.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recps
