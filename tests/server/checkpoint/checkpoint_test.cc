// Tests of the checkpoint library: row files, manifests, listing, pruning,
// and restore onto a different number of servers. Expected rows come from
// the source store (ReadRows), never from the checkpoint code.
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/hashing.h"
#include "common/thread_pool.h"
#include "common/wire/shard_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/table_specs.h"
#include "kernels/embedding_optimizer.h"
#include "server/checkpoint/checkpoint.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/row_file.h"
#include "server/checkpoint/store_rows.h"
#include "server/store/embedding_store.h"

namespace recps::server::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::recps::OptimizerKind;
using ::testing::HasSubstr;

constexpr uint32_t kSlots = 64;
constexpr char kDigest[] = "00000000000000aa";

config::TableSpec Spec(std::string name, int dim, int64_t num_rows = 0,
                       OptimizerKind kind = OptimizerKind::kSgd, float lr = 0.5f) {
  return testing::TestTableSpec(std::move(name), dim, num_rows, kind, lr);
}

// One table per optimizer kind, fixed and dynamic.
std::vector<config::TableSpec> Tables() {
  return {Spec("sgd", 8, 0, OptimizerKind::kSgd, 0.5f),
          Spec("adagrad_fixed", 5, 3000, OptimizerKind::kAdagrad, 0.1f),
          Spec("rowwise", 7, 0, OptimizerKind::kRowWiseAdagrad, 0.2f),
          Spec("adam", 6, 0, OptimizerKind::kAdam, 0.01f),
          Spec("adam_fixed", 4, 500, OptimizerKind::kAdam, 0.02f)};
}

std::unique_ptr<EmbeddingStore> MakeStore(
    std::vector<config::TableSpec> specs = Tables()) {
  StoreOptions o;
  o.seed = 11;
  o.num_slots = kSlots;
  o.max_rows_per_table = 1 << 18;
  auto store = CreateHostEmbeddingStore(std::move(specs), o);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

// The ids a test touches in table t: fixed tables within range, dynamic
// ones spread over int64 including negatives.
std::vector<int64_t> Ids(const EmbeddingStore& store, int t, int step) {
  std::vector<int64_t> ids;
  const int64_t n = store.spec(t).num_rows;
  for (int64_t i = 0; i < 300; ++i) {
    const int64_t k = i + 37 * step;
    ids.push_back(n > 0 ? (k * 7) % n
                        : static_cast<int64_t>(Mix64(k + 1000 * t)) >> (k % 5));
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Deterministic gradients of one push.
std::vector<float> Grads(absl::Span<const int64_t> ids, int dim, int step) {
  std::vector<float> g(ids.size() * dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int d = 0; d < dim; ++d) {
      g[i * dim + d] = std::sin(0.001f * static_cast<float>(ids[i] % 100003) +
                                0.7f * step + 0.3f * d);
    }
  }
  return g;
}

// Owner of (table, id) among `servers` under a uniform contiguous split.
int OwnerOf(const std::string& table, int64_t id, int servers) {
  const uint32_t slot = SlotOf(StableNameKey(table), id, kSlots);
  return static_cast<int>(uint64_t{slot} * servers / kSlots);
}

std::vector<uint32_t> SlotsOf(int server, int servers) {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < kSlots; ++s) {
    if (static_cast<int>(uint64_t{s} * servers / kSlots) == server) out.push_back(s);
  }
  return out;
}

// One push of `step` to the stores (one per server, ids routed by owner).
void Push(const std::vector<EmbeddingStore*>& stores, int step) {
  const int servers = static_cast<int>(stores.size());
  for (int t = 0; t < stores[0]->num_tables(); ++t) {
    const config::TableSpec& spec = stores[0]->spec(t);
    for (int s = 0; s < servers; ++s) {
      std::vector<int64_t> ids;
      for (int64_t id : Ids(*stores[0], t, step)) {
        if (OwnerOf(spec.name, id, servers) == s) ids.push_back(id);
      }
      if (ids.empty()) continue;
      std::vector<float> out(ids.size() * spec.dim);
      ASSERT_TRUE(stores[s]->Lookup(t, ids, out.data()).ok());
      const std::vector<float> g = Grads(ids, spec.dim, step);
      ASSERT_TRUE(stores[s]->ValidateGradients(t, ids, g.data()).ok());
      ASSERT_TRUE(stores[s]->ApplyGradients(t, ids, g.data()).ok());
    }
  }
}

// Every touched id's whole row (bit-identical) in `stores` equals the
// source's.
void ExpectSameRows(const EmbeddingStore& source,
                    const std::vector<EmbeddingStore*>& stores, int steps) {
  const int servers = static_cast<int>(stores.size());
  for (int t = 0; t < source.num_tables(); ++t) {
    const config::TableSpec& spec = source.spec(t);
    const int64_t stride = FusedRowStride(spec.optimizer.kind, spec.dim);
    std::vector<int64_t> all;
    for (int step = 0; step < steps; ++step) {
      for (int64_t id : Ids(source, t, step)) all.push_back(id);
    }
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    std::vector<float> want(stride), got(stride);
    for (int64_t id : all) {
      ASSERT_TRUE(source.ReadRows(t, {&id, 1}, want.data()).ok());
      const int s = OwnerOf(spec.name, id, servers);
      const absl::Status status = stores[s]->ReadRows(t, {&id, 1}, got.data());
      ASSERT_TRUE(status.ok()) << spec.name << " id " << id << ": " << status;
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), stride * sizeof(float)))
          << spec.name << " id " << id << " on server " << s;
    }
  }
  int64_t source_rows = 0, restored_rows = 0;
  for (int64_t r : source.RowsPerSlot()) source_rows += r;
  for (EmbeddingStore* s : stores) {
    for (int64_t r : s->RowsPerSlot()) restored_rows += r;
  }
  EXPECT_EQ(source_rows, restored_rows);
}

bool AllEmpty(const EmbeddingStore& store) {
  for (int64_t r : store.RowsPerSlot()) {
    if (r != 0) return false;
  }
  return true;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(::testing::TempDir(), "/ckpt_test_", getpid(), "_",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    source_ = MakeStore();
    for (int step = 0; step < kTrainSteps; ++step) Push({source_.get()}, step);
  }
  void TearDown() override { fs::remove_all(root_); }

  // The source as two servers (uniform 2-way split), each writing a file.
  absl::StatusOr<CheckpointInfo> Write(uint64_t step,
                                       const std::string& digest = kDigest) {
    CheckpointSpec spec;
    spec.step = step;
    spec.job_config_digest = digest;
    spec.shard_map = ShardMap::Uniform(1, kSlots, {"a:1", "b:2"}).ToProto();
    const std::vector<ShardRows> shards = {{source_.get(), SlotsOf(0, 2)},
                                           {source_.get(), SlotsOf(1, 2)}};
    return WriteCheckpoint(root_, spec, shards);
  }

  static constexpr int kTrainSteps = 4;
  std::string root_;
  std::unique_ptr<EmbeddingStore> source_;
};

TEST_F(CheckpointTest, RestoresOntoOneAndThreeServersBitIdentical) {
  absl::StatusOr<CheckpointInfo> info = Write(100);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->manifest.files_size(), 2);
  EXPECT_GT(info->manifest.files(0).rows(), 0);
  EXPECT_GT(info->manifest.files(1).rows(), 0);
  EXPECT_EQ(info->manifest.kind(), v1::CHECKPOINT_KIND_FULL);
  EXPECT_EQ(info->manifest.tables_size(), 5);

  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 100u);
  const std::string dir = (*list)[0].dir;

  std::unique_ptr<EmbeddingStore> one = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(dir, kDigest, *one, SlotsOf(0, 1));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->files, 2);
  ExpectSameRows(*source_, {one.get()}, kTrainSteps);

  std::vector<std::unique_ptr<EmbeddingStore>> three;
  std::vector<EmbeddingStore*> three_ptrs;
  for (int s = 0; s < 3; ++s) {
    three.push_back(MakeStore());
    three_ptrs.push_back(three.back().get());
    absl::StatusOr<RestoreStats> st =
        RestoreCheckpoint(dir, kDigest, *three.back(), SlotsOf(s, 3));
    ASSERT_TRUE(st.ok()) << st.status();
  }
  ExpectSameRows(*source_, three_ptrs, kTrainSteps);

  // Training goes on identically from the restored state.
  for (int step = kTrainSteps; step < kTrainSteps + 3; ++step) {
    Push({source_.get()}, step);
    Push({one.get()}, step);
    Push(three_ptrs, step);
  }
  ExpectSameRows(*source_, {one.get()}, kTrainSteps + 3);
  ExpectSameRows(*source_, three_ptrs, kTrainSteps + 3);
}

TEST_F(CheckpointTest, ParallelRestoreMatches) {
  absl::StatusOr<CheckpointInfo> info = Write(100);
  ASSERT_TRUE(info.ok()) << info.status();
  ThreadPool pool(4);
  ImportOptions options;
  options.pool = &pool;
  options.batch_rows = 7;  // many batches per slot
  std::vector<std::unique_ptr<EmbeddingStore>> two;
  std::vector<EmbeddingStore*> ptrs;
  int64_t rows = 0;
  for (int s = 0; s < 2; ++s) {
    two.push_back(MakeStore());
    ptrs.push_back(two.back().get());
    absl::StatusOr<RestoreStats> st =
        RestoreCheckpoint(info->dir, kDigest, *two.back(), SlotsOf(s, 2), options);
    ASSERT_TRUE(st.ok()) << st.status();
    rows += st->rows;
  }
  EXPECT_EQ(rows, info->manifest.files(0).rows() + info->manifest.files(1).rows());
  ExpectSameRows(*source_, ptrs, kTrainSteps);
}

// A shard server's file holds only the (table, slot) units it owned at the
// cut (RowSelection::unit); the live writer and the snapshot writer agree.
TEST_F(CheckpointTest, RowSelectionKeepsOnlyTheChosenUnits) {
  fs::create_directories(root_);
  auto chosen = [](int t, uint32_t slot) { return t == 0 && slot % 2 == 0; };
  RowSelection selection;
  selection.unit = chosen;
  std::vector<uint32_t> all(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) all[s] = s;
  int64_t want = 0;
  for (uint32_t slot = 0; slot < kSlots; slot += 2) {
    SlotCursor cursor;
    SlotChunk chunk;
    while (!cursor.done) {
      ASSERT_TRUE(source_->ExportSlot(0, slot, &cursor, 1 << 20, &chunk).ok());
      want += static_cast<int64_t>(chunk.ids.size());
    }
  }
  ASSERT_GT(want, 0);
  ASSERT_TRUE(source_->BeginSnapshot(1).ok());
  for (bool snapshot : {false, true}) {
    SCOPED_TRACE(snapshot ? "snapshot" : "live");
    const std::string path = absl::StrCat(root_, snapshot ? "/snap.sst" : "/live.sst");
    const RowFileWriter writer;
    absl::StatusOr<RowFileInfo> info =
        snapshot ? writer.WriteSnapshot(*source_, 0, all, path, selection)
                 : writer.Write(*source_, all, path, selection);
    ASSERT_TRUE(info.ok()) << info.status();
    auto reader = RowFileReader::Open(path, info->size_bytes, info->crc32c);
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::unique_ptr<EmbeddingStore> restored = MakeStore();
    auto imported = ImportRowFile(**reader, *restored, all);
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(*imported, want);
    EXPECT_EQ(restored->Info(0).rows, want);
    for (int t = 1; t < restored->num_tables(); ++t) {
      EXPECT_EQ(restored->Info(t).rows, 0) << restored->spec(t).name;
    }
    const std::vector<int64_t> per_slot = restored->RowsPerSlot();
    for (uint32_t slot = 1; slot < kSlots; slot += 2) EXPECT_EQ(per_slot[slot], 0);
  }
  source_->EndSnapshot();
}

TEST_F(CheckpointTest, RowFileKeysSortByTableSlotId) {
  std::string a, b;
  EncodeRowKey("t", 1, -5, &a);
  EncodeRowKey("t", 1, 3, &b);
  EXPECT_LT(a, b);
  EncodeRowKey("t", 2, std::numeric_limits<int64_t>::min(), &a);
  EXPECT_LT(b, a);
  EncodeRowKey("t", 0, std::numeric_limits<int64_t>::max(), &a);
  EncodeRowKey("tb", 0, std::numeric_limits<int64_t>::min(), &b);
  EXPECT_LT(a, b);
}

TEST_F(CheckpointTest, Crc32cMatchesTheStandardCheckValue) {
  EXPECT_EQ(Crc32cExtend(0, "123456789", 9), 0xe3069283u);
  // Extending in pieces equals one pass.
  const std::string s(1000, 'x');
  EXPECT_EQ(Crc32cExtend(Crc32cExtend(0, s.data(), 333), s.data() + 333, 667),
            Crc32cExtend(0, s.data(), s.size()));
}

// Parts checksummed apart and combined give the whole's CRC (any split,
// empty parts included), and so does the parallel file checksum, which
// splits a file of 40 MiB + 3 bytes into ranges of the pool's threads.
TEST_F(CheckpointTest, Crc32cCombineAndParallelFileChecksumMatchOnePass) {
  std::string s(size_t{40} << 20, '\0');
  uint64_t x = 1;
  for (char& c : s) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    c = static_cast<char>(x >> 56);
  }
  s += "abc";
  const uint32_t whole = Crc32cExtend(0, s.data(), s.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4097}, s.size() - 1, s.size()}) {
    EXPECT_EQ(Crc32cCombine(Crc32cExtend(0, s.data(), cut),
                            Crc32cExtend(0, s.data() + cut, s.size() - cut),
                            s.size() - cut),
              whole)
        << cut;
  }
  fs::create_directories(root_);
  const std::string path = root_ + "/crc.bin";
  {
    std::ofstream f(path, std::ios::binary);
    f.write(s.data(), static_cast<std::streamsize>(s.size()));
  }
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    absl::StatusOr<FileCrc> crc = ChecksumFileParallel(path, &pool);
    ASSERT_TRUE(crc.ok()) << crc.status();
    EXPECT_EQ(crc->size_bytes, s.size());
    EXPECT_EQ(crc->crc32c, whole) << threads << " threads";
  }
  // A flipped byte in the last range changes it.
  {
    std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(s.size() - 2));
    f.put('X');
  }
  ThreadPool pool(2);
  absl::StatusOr<FileCrc> flipped = ChecksumFileParallel(path, &pool);
  ASSERT_TRUE(flipped.ok()) << flipped.status();
  EXPECT_NE(flipped->crc32c, whole);
  EXPECT_EQ(ChecksumFileParallel(root_ + "/missing", nullptr).status().code(),
            absl::StatusCode::kNotFound);
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

TEST_F(CheckpointTest, CorruptedRowFileIsRefusedAndLeavesNoRow) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string file = info->dir + "/shard-00001.sst";
  FlipByte(file, static_cast<off_t>(fs::file_size(file) / 2));
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(stats.status().message(), HasSubstr(file));
  EXPECT_THAT(stats.status().message(), HasSubstr("corrupted"));
  EXPECT_TRUE(AllEmpty(*target));
}

// The CRC is checked beside the import: a file whose rows all import
// cleanly but whose CRC is not the manifest's is refused after the fact,
// and the rows it brought in (and those of the files before it) are
// dropped again.
TEST_F(CheckpointTest, ACrcMismatchFoundAfterTheImportUndoesIt) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::unique_ptr<RowFileReader>> readers;
  std::vector<const RowFileReader*> chain;
  for (const char* name : {"shard-00000.sst", "shard-00001.sst"}) {
    const std::string file = info->dir + "/" + name;
    const uint32_t crc = ChecksumFile(file).value().crc32c;
    // The second file's expected CRC is off by one bit: it reads fine.
    absl::StatusOr<std::unique_ptr<RowFileReader>> reader = RowFileReader::Open(
        file, fs::file_size(file), readers.empty() ? crc : crc ^ 1, nullptr,
        RowFileReader::Verify::kLater);
    ASSERT_TRUE(reader.ok()) << reader.status();
    chain.push_back(reader->get());
    readers.push_back(*std::move(reader));
  }
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  const std::vector<uint32_t> all = SlotsOf(0, 1);
  const std::vector<std::vector<uint32_t>> by_table(target->num_tables(), all);
  absl::StatusOr<int64_t> rows = ImportRowFilesVerified(chain, *target, by_table);
  ASSERT_FALSE(rows.ok());
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(rows.status().message(), HasSubstr("shard-00001.sst"));
  EXPECT_THAT(rows.status().message(), HasSubstr("corrupted"));
  EXPECT_TRUE(AllEmpty(*target));
  // With the right CRCs the same files import every row.
  std::unique_ptr<EmbeddingStore> good = MakeStore();
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(info->dir, kDigest, *good, all);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->rows, 0);
  EXPECT_FALSE(AllEmpty(*good));
}

TEST_F(CheckpointTest, TruncatedRowFileIsRefusedBeforeAnyImport) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string file = info->dir + "/shard-00001.sst";
  fs::resize_file(file, fs::file_size(file) - 100);
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(stats.status().message(), HasSubstr(file));
  EXPECT_THAT(stats.status().message(), HasSubstr("truncated"));
  EXPECT_TRUE(AllEmpty(*target));
}

TEST_F(CheckpointTest, MissingRowFileIsRefused) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  const std::string file = info->dir + "/shard-00000.sst";
  fs::remove(file);
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(stats.status().message(), HasSubstr(file));
  EXPECT_TRUE(AllEmpty(*target));
}

TEST_F(CheckpointTest, MissingManifestIsNotListedAndNotRestored) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  fs::remove(info->dir + "/MANIFEST");
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(stats.status().message(), HasSubstr(info->dir + "/MANIFEST"));
  EXPECT_TRUE(AllEmpty(*target));
}

TEST_F(CheckpointTest, CorruptedManifestIsNotListed) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  FlipByte(info->dir + "/MANIFEST", 12);
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_TRUE(list->empty());
  absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(info->dir);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointTest, ManifestOfAnotherJobIsRefused) {
  absl::StatusOr<CheckpointInfo> info = Write(5, "1111111111111111");
  ASSERT_TRUE(info.ok()) << info.status();
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats = RestoreCheckpoint(
      info->dir, "2222222222222222", *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stats.status().message(), HasSubstr("1111111111111111"));
  EXPECT_THAT(stats.status().message(), HasSubstr("2222222222222222"));
  EXPECT_THAT(stats.status().message(), HasSubstr("MANIFEST"));
  EXPECT_TRUE(AllEmpty(*target));
}

TEST_F(CheckpointTest, JobConfigDigestIsStableAndSensitive) {
  v1::JobConfig a;
  a.set_name("job");
  v1::JobConfig b = a;
  EXPECT_EQ(JobConfigDigest(a), JobConfigDigest(b));
  EXPECT_EQ(JobConfigDigest(a).size(), 16u);
  b.set_name("job2");
  EXPECT_NE(JobConfigDigest(a), JobConfigDigest(b));
}

TEST_F(CheckpointTest, LayoutMismatchIsRefusedNamingTableAndField) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<config::TableSpec> specs = Tables();
  specs[2].dim = 9;  // "rowwise"
  std::unique_ptr<EmbeddingStore> target = MakeStore(specs);
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stats.status().message(), HasSubstr("'rowwise'"));
  EXPECT_THAT(stats.status().message(), HasSubstr("dim 7"));
  EXPECT_TRUE(AllEmpty(*target));

  specs = Tables();
  specs[3].optimizer.kind = OptimizerKind::kAdagrad;  // "adam"
  target = MakeStore(specs);
  stats = RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stats.status().message(), HasSubstr("'adam'"));
  EXPECT_THAT(stats.status().message(), HasSubstr("optimizer"));

  specs = Tables();
  specs.push_back(Spec("new_table", 4, 0, OptimizerKind::kSgd, 0.1f));
  target = MakeStore(specs);
  stats = RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stats.status().message(), HasSubstr("'new_table'"));
}

TEST_F(CheckpointTest, RestoreIntoANonEmptyStoreIsRefused) {
  absl::StatusOr<CheckpointInfo> info = Write(5);
  ASSERT_TRUE(info.ok()) << info.status();
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  Push({target.get()}, 0);
  const std::vector<int64_t> before = target->RowsPerSlot();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint(info->dir, kDigest, *target, SlotsOf(0, 1));
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stats.status().message(), HasSubstr("fresh store"));
  EXPECT_EQ(target->RowsPerSlot(), before);
}

TEST_F(CheckpointTest, WritingAStepTwiceIsRefused) {
  ASSERT_TRUE(Write(5).ok());
  absl::StatusOr<CheckpointInfo> again = Write(5);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(CheckpointTest, PruneKeepsTheNewestCompleteOnes) {
  for (uint64_t step : {10, 20, 30, 40}) ASSERT_TRUE(Write(step).ok());
  // Partial directories: an old leftover and one still being written.
  fs::create_directories(root_ + "/" + CheckpointDirName(25));
  std::ofstream(root_ + "/" + CheckpointDirName(25) + "/shard-00000.sst") << "x";
  fs::create_directories(root_ + "/" + CheckpointDirName(50));
  fs::create_directories(root_ + "/unrelated");

  EXPECT_EQ(PruneCheckpoints(root_, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::vector<std::string>> removed = PruneCheckpoints(root_, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(removed->size(), 3u);  // 10, 20 and the partial 25
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].step, 30u);
  EXPECT_EQ((*list)[1].step, 40u);
  EXPECT_FALSE(fs::exists(root_ + "/" + CheckpointDirName(25)));
  EXPECT_TRUE(fs::exists(root_ + "/" + CheckpointDirName(50)));
  EXPECT_TRUE(fs::exists(root_ + "/unrelated"));

  removed = PruneCheckpoints(root_, 1);
  ASSERT_TRUE(removed.ok());
  list = ListCheckpoints(root_);
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 40u);
}

TEST_F(CheckpointTest, RootUnderARegularFileIsAClearError) {
  ASSERT_TRUE(Write(10).ok());
  const std::string file = root_ + "/plain_file";
  std::ofstream(file) << "not a directory";
  CheckpointSpec spec;
  spec.step = 20;
  spec.job_config_digest = kDigest;
  const std::vector<ShardRows> shards = {{source_.get(), SlotsOf(0, 1)}};
  absl::StatusOr<CheckpointInfo> info =
      WriteCheckpoint(file + "/ckpt", spec, shards);
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr(file + "/ckpt"));
  EXPECT_EQ(ListCheckpoints(file).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ(ListCheckpoints(root_ + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CheckpointTest, FailedWriteLeavesNoDirectoryAndKeepsThePreviousOne) {
  ASSERT_TRUE(Write(10).ok());
  CheckpointSpec spec;
  spec.step = 20;
  spec.job_config_digest = kDigest;
  // The second shard's slot is out of range: the first file is written,
  // then the write fails.
  const std::vector<ShardRows> shards = {{source_.get(), SlotsOf(0, 2)},
                                         {source_.get(), {kSlots}}};
  absl::StatusOr<CheckpointInfo> info = WriteCheckpoint(root_, spec, shards);
  EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(root_ + "/" + CheckpointDirName(20)));
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 10u);
}

// Mounts need CAP_SYS_ADMIN; where the test cannot mount, it skips. The
// manifest's and directories' faults need no mount (checkpoint_faults_test.cc,
// through the FileSystem seam); these two also reach RocksDB's row files.
class MountedDir {
 public:
  ~MountedDir() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool Tmpfs(const std::string& path, const char* size) {
    path_ = path;
    fs::create_directories(path);
    mounted_ = mount("tmpfs", path.c_str(), "tmpfs", 0, size) == 0;
    return mounted_;
  }
  bool ReadOnlyBind(const std::string& path) {
    path_ = path;
    if (mount(path.c_str(), path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return false;
    }
    mounted_ = true;
    return mount(nullptr, path.c_str(), nullptr,
                 MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0;
  }

 private:
  std::string path_;
  bool mounted_ = false;
};

TEST_F(CheckpointTest, ReadOnlyDirectoryIsAClearErrorAndThePreviousOneLists) {
  ASSERT_TRUE(Write(10).ok());
  MountedDir ro;
  if (!ro.ReadOnlyBind(root_)) GTEST_SKIP() << "cannot bind-mount: " << std::strerror(errno);
  absl::StatusOr<CheckpointInfo> info = Write(20);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied)
      << info.status();
  EXPECT_THAT(info.status().message(), HasSubstr(CheckpointDirName(20)));
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 10u);
}

TEST_F(CheckpointTest, DiskFullIsResourceExhaustedAndThePreviousOneSurvives) {
  fs::create_directories(root_);
  MountedDir small;
  if (!small.Tmpfs(root_, "size=1m")) GTEST_SKIP() << "cannot mount tmpfs: " << std::strerror(errno);
  // A small checkpoint fits; one of ~3 MB of rows does not.
  std::unique_ptr<EmbeddingStore> tiny = MakeStore();
  Push({tiny.get()}, 0);
  CheckpointSpec spec;
  spec.step = 10;
  spec.job_config_digest = kDigest;
  const std::vector<ShardRows> tiny_shards = {{tiny.get(), SlotsOf(0, 1)}};
  absl::StatusOr<CheckpointInfo> first = WriteCheckpoint(root_, spec, tiny_shards);
  ASSERT_TRUE(first.ok()) << first.status();

  std::unique_ptr<EmbeddingStore> big =
      MakeStore({Spec("big", 64, 0, OptimizerKind::kSgd, 0.1f)});
  std::vector<int64_t> ids(12000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i);
  std::vector<float> out(ids.size() * 64);
  ASSERT_TRUE(big->Lookup(0, ids, out.data()).ok());
  spec.step = 20;
  const std::vector<ShardRows> big_shards = {{big.get(), SlotsOf(0, 1)}};
  absl::StatusOr<CheckpointInfo> second = WriteCheckpoint(root_, spec, big_shards);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted)
      << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr(CheckpointDirName(20)));
  EXPECT_FALSE(fs::exists(root_ + "/" + CheckpointDirName(20)));
  absl::StatusOr<std::vector<CheckpointInfo>> list = ListCheckpoints(root_);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step, 10u);
  // And it still restores.
  std::unique_ptr<EmbeddingStore> target = MakeStore();
  absl::StatusOr<RestoreStats> stats =
      RestoreCheckpoint((*list)[0].dir, kDigest, *target, SlotsOf(0, 1));
  ASSERT_TRUE(stats.ok()) << stats.status();
  ExpectSameRows(*tiny, {target.get()}, 1);
}

}  // namespace
}  // namespace recps::server::checkpoint
