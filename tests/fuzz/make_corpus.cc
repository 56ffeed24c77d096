// Writes the fuzzers' seed corpus: small valid inputs of every target, from
// real messages (requests the fixture server accepts, its shard map, a
// lookup response the client accepts, the example job configs, Criteo
// lines, a manifest of the fixture store's layout). Run by hand after a
// format change, and commit what it writes:
//   build-fuzz/tests/fuzz/recps_fuzz_make_corpus tests/fuzz/corpus .
// (the second argument: the source root, for examples/).
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/config/job_config.h"
#include "common/wire/wire_format.h"
#include "recps/v1/checkpoint.pb.h"
#include "server/checkpoint/manifest.h"
#include "server/checkpoint/row_file.h"
#include "tests/fuzz/lookup_response_fixture.h"
#include "tests/fuzz/shard_fixture.h"

namespace recps::fuzz {
namespace {

std::string g_root;

void Put(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = absl::StrCat(g_root, "/", target);
  mkdir(dir.c_str(), 0755);
  std::ofstream(absl::StrCat(dir, "/", name), std::ios::binary) << bytes;
}

std::string Ids(const std::vector<int64_t>& ids) {
  std::string s;
  EncodeIds(ids, &s);
  return s;
}

// Ids 0.. of `table` that this server owns in the fixture map.
std::vector<int64_t> OwnedIds(const std::string& table, int n) {
  const ShardMap map = *ShardMap::FromProto(FixtureMapProto());
  const TableRoute route = map.RouteOf(StableNameKey(table));
  std::vector<int64_t> out;
  for (int64_t id = 0; static_cast<int>(out.size()) < n && id < 1000; ++id) {
    if (route.OwnerOf(id) == 0) out.push_back(id);
  }
  return out;
}

void ShardRequests() {
  struct T { const char* name; int dim; };
  const T tables[] = {{"fixed", 4}, {"dynamic", 3}, {"adam", 2}, {"wide.cols0-4", 4}};
  int i = 0;
  for (const T& t : tables) {
    for (v1::RowEncoding enc : {v1::ROW_ENCODING_FLOAT32, v1::ROW_ENCODING_FLOAT16}) {
      const std::vector<int64_t> ids = OwnedIds(t.name, 3);
      v1::LookupRequest lookup;
      lookup.mutable_header()->set_shard_map_epoch(kEpoch);
      lookup.mutable_header()->set_worker_rank(1);
      lookup.set_row_encoding(enc);
      v1::TableIds* ti = lookup.add_tables();
      ti->set_table(t.name);
      ti->set_ids(Ids(ids));
      Put("fuzz_shard_lookup", absl::StrCat("valid-", i), std::string(1, '\0') + lookup.SerializeAsString());
      v1::PushGradientsRequest push;
      *push.mutable_header() = lookup.header();
      v1::TableGradients* tg = push.add_tables();
      tg->set_table(t.name);
      tg->set_ids(Ids(ids));
      tg->set_encoding(enc);
      std::vector<float> grads(ids.size() * t.dim, 0.5f);
      std::string bytes;
      EncodeRows(grads.data(), grads.size(), enc, &bytes);
      tg->set_grads(bytes);
      Put("fuzz_shard_push", absl::StrCat("valid-", i), std::string(1, '\0') + push.SerializeAsString());
      ++i;
    }
  }
  // Two tables in one request.
  v1::LookupRequest two;
  two.mutable_header()->set_shard_map_epoch(kEpoch);
  for (const char* name : {"fixed", "dynamic"}) {
    v1::TableIds* ti = two.add_tables();
    ti->set_table(name);
    ti->set_ids(Ids(OwnedIds(name, 2)));
  }
  Put("fuzz_shard_lookup", "two-tables", std::string(1, '\0') + two.SerializeAsString());
  // Structured mode: a few byte strings for FuzzedDataProvider.
  for (const std::string& s : {std::string("\x01\x00\x01\x00\x02\x00\x03\x00\x08\x10\x18", 11),
                               std::string(48, '\x01'), std::string(96, '\x05')}) {
    Put("fuzz_shard_lookup", absl::StrCat("structured-", s.size()), s);
    Put("fuzz_shard_push", absl::StrCat("structured-", s.size()), s);
    Put("fuzz_shard_map", absl::StrCat("structured-", s.size()), s);
  }
}

void ShardMaps() {
  const v1::ShardMap fixture = FixtureMapProto();
  Put("fuzz_shard_map", "fixture", std::string(1, '\0') + fixture.SerializeAsString());
  v1::ShardMap next = fixture;
  next.set_epoch(kEpoch + 1);
  Put("fuzz_shard_map", "fixture-next-install", "\x02" + next.SerializeAsString());
  Put("fuzz_shard_map", "fixture-next-install-other", "\x06" + next.SerializeAsString());
  Put("fuzz_shard_map", "uniform-1",
      "\x02" + ShardMap::Uniform(4, kSlots, {kSelf}).ToProto().SerializeAsString());
  v1::ShardMap swapped = ShardMap::Uniform(5, kSlots, {kOther, kSelf}).ToProto();
  Put("fuzz_shard_map", "uniform-swapped-install", "\x02" + swapped.SerializeAsString());
}

void LookupResponses() {
  const ResponseFixture f;
  for (int server = 0; server < 2; ++server) {
    for (v1::RowEncoding enc : {v1::ROW_ENCODING_FLOAT32, v1::ROW_ENCODING_FLOAT16,
                                v1::ROW_ENCODING_BFLOAT16}) {
      std::vector<float> u(f.users.size() * 8), it(f.items.size() * 4), w(f.wides.size() * 8);
      client::internal::RoutedBatch batch;
      f.Prepare(&batch, u.data(), it.data(), w.data());
      const int32_t count = batch.CountFor(server);
      if (count == 0) continue;
      v1::LookupRequest req;
      batch.BuildLookup(server, 0, count, &req);
      v1::LookupResponse resp;
      resp.set_incarnation(42);
      for (const v1::TableIds& t : req.tables()) {
        v1::TableRows* rows = resp.add_tables();
        rows->set_table(t.table());
        int dim = 0;
        for (const client::internal::TablePlan& p : batch.plans) {
          if (p.name != nullptr && *p.name == t.table()) dim = p.dim;
        }
        rows->set_dim(dim);
        const size_t n = t.ids().size() / 8 * dim;
        std::vector<float> values(n, 0.25f);
        std::string bytes;
        EncodeRows(values.data(), n, enc, &bytes);
        rows->set_rows(bytes);
      }
      const int enc_index = enc == v1::ROW_ENCODING_FLOAT32 ? 0
                            : enc == v1::ROW_ENCODING_FLOAT16 ? 1 : 2;
      for (uint8_t slice : {uint8_t{0}, uint8_t{7}}) {
        std::string head(4, '\0');
        head[0] = static_cast<char>(slice);
        head[1] = static_cast<char>(enc_index + 3 * server);
        head[2] = 0;
        head[3] = static_cast<char>(count - 1);
        Put("fuzz_lookup_response",
            absl::StrCat("server", server, "-enc", enc_index, "-slice", int{slice}),
            head + resp.SerializeAsString());
      }
    }
  }
}

void JobConfigs(const std::string& source_root) {
  for (const char* name : {"small", "criteo"}) {
    const std::string path = absl::StrCat(source_root, "/examples/", name, ".textproto");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    Put("fuzz_job_config", absl::StrCat(name, "-text"), std::string(1, '\0') + text.str());
    absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(path);
    if (!job.ok()) {
      std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
      continue;
    }
    Put("fuzz_job_config", absl::StrCat(name, "-binary"), "\x01" + job->SerializeAsString());
  }
}

void CriteoFiles() {
  std::string line = "1";
  for (int i = 0; i < 13; ++i) line += absl::StrCat("\t", i % 3 == 0 ? "" : absl::StrCat(i * 7));
  for (int i = 0; i < 26; ++i) line += absl::StrCat("\t", i % 5 == 0 ? "" : "68fd1e64");
  const std::string good = line + "\n" + "0" + line.substr(1) + "\r\n";
  Put("fuzz_criteo", "criteo-13-26", std::string("\x0f\x00\x00\x04", 4) + good);
  Put("fuzz_criteo", "criteo-13-26-hashed-2ranks", std::string("\x1f\x03\x04\x01", 4) + good);
  Put("fuzz_criteo", "small-2-1",
      std::string("\x06\x00\x00\x02", 4) + "1\t3\t-1.5\ta1,b2\n0\t\t7\t\nx\t1\t2\tz\n1\t1e3\t2\t0");
}

void StaleEpoch() {
  Put("fuzz_stale_epoch", "aborted-epoch", std::string("\x0a\x0bstale map\x03""a:1\x06Lookup\x01", 30) + "17");
  Put("fuzz_stale_epoch", "unavailable", std::string("\x0e\x04busy\x00\x00\x00", 8));
}

void Checkpoints() {
  auto store = server::CreateHostEmbeddingStore(FixtureTables(), FixtureStoreOptions());
  v1::CheckpointManifest m;
  m.set_format_version(server::checkpoint::kManifestFormatVersion);
  m.set_step(1);
  m.set_job_config_digest("0123456789abcdef");
  *m.mutable_shard_map() = FixtureMapProto();
  m.set_num_slots(kSlots);
  for (const v1::CheckpointTable& t : server::checkpoint::StoreLayout(**store)) *m.add_tables() = t;
  v1::CheckpointFile* file = m.add_files();
  file->set_name("shard-00000.sst");
  file->set_size_bytes(1234);
  file->set_crc32c(0x12345678);
  file->set_rows(10);
  Put("fuzz_checkpoint_manifest", "fixture-layout", "\x01" + m.SerializeAsString());
  Put("fuzz_checkpoint_manifest", "fixture-layout-any-digest", "\x05" + m.SerializeAsString());
  m.clear_files();
  Put("fuzz_checkpoint_manifest", "fixture-layout-no-files", "\x01" + m.SerializeAsString());
  Put("fuzz_checkpoint_manifest", "raw-magic", std::string("\x00RECPSCK1\x08\x01\x00\x00\x00\x00", 14));
  for (const std::string& s : {std::string(16, '\x00'), std::string(64, '\x01'),
                               std::string(200, '\x07'), std::string(300, '\x41')}) {
    Put("fuzz_row_file_header", absl::StrCat("bytes-", s.size(), "-", int{s[0]}), s);
  }
}

}  // namespace
}  // namespace recps::fuzz

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR SOURCE_ROOT\n", argv[0]);
    return 2;
  }
  recps::fuzz::g_root = argv[1];
  mkdir(argv[1], 0755);
  recps::fuzz::ShardRequests();
  recps::fuzz::ShardMaps();
  recps::fuzz::LookupResponses();
  recps::fuzz::JobConfigs(argv[2]);
  recps::fuzz::CriteoFiles();
  recps::fuzz::StaleEpoch();
  recps::fuzz::Checkpoints();
  return 0;
}
