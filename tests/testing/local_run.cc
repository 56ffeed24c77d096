#include "tests/testing/local_run.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/config/job_config.h"
#include "common/config/table_config.h"
#include "common/fused_row.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "common/rpc/channels.h"
#include "gtest/gtest.h"
#include "recps/v1/checkpoint.pb.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_reader.h"
#include "server/checkpoint/row_file.h"

namespace recps::testing {

namespace {

std::string WriteJob(const TempDir& dir, const SmallJob& spec, const std::string& checkpoints) {
  std::string tables, features;
  for (int t = 0; t < 4; ++t) {
    absl::StrAppend(&tables, "tables { name: \"t", t, "\" dim: 16 optimizer { kind: ",
                    spec.optimizer, " learning_rate: 0.05 } }\n");
    absl::StrAppend(&features, "features { name: \"f", t, "\" table: \"t", t,
                    "\" pooling: SUM }\n");
  }
  return dir.WriteFile(
      "job.textproto",
      absl::StrCat(
          "name: \"", spec.name, "\"\n", tables, features,
          "model { bottom_mlp: [16, 16] top_mlp: [16, 1] }\n"
          "training {\n  batch_size: 64\n  steps: ", spec.steps, "\n",
          "  dense_optimizer { kind: ADAM learning_rate: 0.001 }\n"
          "  consistency { mode: SYNC }\n  eval_interval: 0\n  eval_batches: 2\n"
          "  seed: 7\n  checkpoint { dir: \"", checkpoints,
          "\" every_steps: ", spec.checkpoint_every, " keep_last: 2 }\n}\n",
          "data { synthetic { seed: 11 num_dense: 13\n"
          "  features { id_space: 5000 zipf_exponent: 1.05 min_ids_per_bag: 1 max_ids_per_bag: 2 }\n"
          "  features { id_space: 500 zipf_exponent: 1.05 min_ids_per_bag: 1 max_ids_per_bag: 1 }\n"
          "  features { id_space: 20000 zipf_exponent: 1.1 min_ids_per_bag: 1 max_ids_per_bag: 3 }\n"
          "  features { id_space: 50 zipf_exponent: 0.8 min_ids_per_bag: 1 max_ids_per_bag: 1 }\n"
          "} }\n"));
}

}  // namespace

LocalRun::LocalRun(SmallJob job_spec)
    : spec(std::move(job_spec)), job(WriteJob(*dir, spec, checkpoints)) {}

absl::StatusOr<client::ChildProcess> LocalRun::Start(int shards,
                                                     std::vector<std::string> extra) const {
  std::vector<std::string> args = {"local", "--job=" + job, "--work_dir=" + work,
                                   absl::StrCat("--shards=", shards),
                                   absl::StrCat("--workers=", workers)};
  args.insert(args.end(), extra.begin(), extra.end());
  if (insecure) args.push_back("--insecure");
  args.push_back("--");
  args.push_back("--threads=1");
  args.push_back("--progress_every=1000h");
  args.push_back("--loss_log=" + dir->path() + "/loss{rank}.log");
  return client::ChildProcess::Spawn(RECPS_LAUNCHER_BINARY, args, log);
}

int LocalRun::LossLines() const {
  const std::string text = ReadAll(dir->path() + "/loss0.log");
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

pid_t LocalRun::PidOf(const std::string& name) const {
  for (absl::string_view line : absl::StrSplit(ReadAll(work + "/pids"), '\n')) {
    if (!absl::StartsWith(line, name + " ")) continue;
    pid_t pid = 0;
    if (absl::SimpleAtoi(line.substr(line.rfind(' ') + 1), &pid)) return pid;
  }
  return 0;
}

std::string LocalRun::PortAddress(const std::string& file) const {
  int port = 0;
  std::vector<std::string> f = absl::StrSplit(ReadAll(work + "/" + file), ' ');
  if (f.empty() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(f[0]), &port)) return "";
  return absl::StrCat("127.0.0.1:", port);
}

std::string LocalRun::Shard(int i) const {
  return PortAddress(absl::StrCat("shard", i, ".ports"));
}

std::vector<std::string> LocalRun::TlsFlags(const std::string& role) const {
  if (insecure) return {"--insecure"};
  const std::string certs = work + "/certs/";
  return {"--tls_ca=" + certs + "ca.crt", "--tls_cert=" + certs + role + ".crt",
          "--tls_key=" + certs + role + ".key"};
}

void LocalRun::UseAdminCertificate() const {
  if (insecure) {
    rpc::SetProcessSecurity(rpc::TransportSecurity::Insecure());
    return;
  }
  const std::string certs = work + "/certs/";
  rpc::SetProcessSecurity(
      rpc::TransportSecurity::Tls(certs + "ca.crt", certs + "admin.crt", certs + "admin.key"));
}

std::string CheckpointDir(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%012lld", static_cast<long long>(step));
  return root + "/" + name;
}

RunOutcome CollectOutcome(const LocalRun& run) {
  RunOutcome out;
  const std::string final_dir = CheckpointDir(run.checkpoints, run.spec.steps);
  EXPECT_TRUE(std::filesystem::exists(final_dir + "/MANIFEST")) << final_dir;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(final_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "dense.pb") {
      v1::DenseState dense;
      EXPECT_TRUE(dense.ParseFromString(ReadAll(entry.path().string())));
      out.dense = dense.parameters() + "|" + dense.optimizer_state() + "|" +
                  std::to_string(dense.optimizer_steps());
      continue;
    }
    if (entry.path().extension() != ".sst") continue;
    rocksdb::Options options;
    rocksdb::SstFileReader reader(options);
    EXPECT_TRUE(reader.Open(entry.path().string()).ok()) << name;
    std::unique_ptr<rocksdb::Iterator> it(reader.NewIterator(rocksdb::ReadOptions()));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const std::string key = it->key().ToString();
      if (!key.empty() && key[0] == '\0') continue;  // the file's header
      // A row in two files would be a slot with two owners.
      if (!out.rows.emplace(key, it->value().ToString()).second && out.error.empty()) {
        out.error = absl::StrCat("a row is in two row files (", name, ")");
      }
    }
  }
  out.losses.resize(run.workers);
  for (int rank = 0; rank < run.workers; ++rank) {
    for (absl::string_view line :
         absl::StrSplit(ReadAll(absl::StrCat(run.dir->path(), "/loss", rank, ".log")), '\n',
                        absl::SkipEmpty())) {
      const std::vector<std::string> f = absl::StrSplit(line, ' ');
      int64_t step = 0;
      if (f.size() != 2 || !absl::SimpleAtoi(f[0], &step)) continue;
      auto [it, fresh] = out.losses[rank].emplace(step, f[1]);
      // A step trained again after a restart must give the same loss.
      if (!fresh && it->second != f[1] && out.error.empty()) {
        out.error = absl::StrCat("rank ", rank, " step ", step, ": loss ", it->second,
                                 " before the restart, ", f[1], " after");
      }
    }
  }
  return out;
}

namespace {

// The stored bytes of row `id` of `spec` as created (fp32 weights from the
// deterministic init, then the optimizer's initial state, to the stride).
std::string InitialRow(const config::TableSpec& spec, uint64_t seed, int64_t id) {
  std::vector<float> row(FusedRowStride(spec.optimizer.kind, spec.dim), 0.0f);
  InitRow(spec.init, seed, StableNameKey(spec.name), id, spec.dim, row.data());
  InitFusedRowState(spec.optimizer.kind, spec.dim, row.data());
  return std::string(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float));
}

// The rows of `reference` that `got` lacks and that do not hold their
// initial value (each named), given the job at `job_path`.
std::vector<std::string> MissingTrainedRows(const RunOutcome& reference, const RunOutcome& got,
                                            const std::string& job_path) {
  std::vector<std::string> out;
  absl::StatusOr<v1::JobConfig> job = config::ReadJobConfig(job_path);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {"the job cannot be read"};
  v1::TablesConfig tables;
  *tables.mutable_tables() = job->tables();
  absl::StatusOr<std::vector<config::TableSpec>> specs = config::TableSpecsFromConfig(tables);
  EXPECT_TRUE(specs.ok()) << specs.status();
  if (!specs.ok()) return {"the tables cannot be read"};
  for (const auto& [key, bytes] : reference.rows) {
    if (got.rows.count(key) != 0) continue;
    absl::string_view table;
    uint32_t slot = 0;
    int64_t id = 0;
    const config::TableSpec* spec = nullptr;
    if (server::checkpoint::DecodeRowKey(key, &table, &slot, &id)) {
      for (const config::TableSpec& s : *specs) {
        if (s.name == table) spec = &s;
      }
    }
    if (spec == nullptr || InitialRow(*spec, job->training().seed(), id) != bytes) {
      out.push_back(absl::StrCat(table, " id ", id));
    }
  }
  return out;
}

}  // namespace

void ExpectSameOutcome(const RunOutcome& reference, const RunOutcome& got, int steps,
                       const std::string& read_only_rows_of) {
  EXPECT_EQ(got.error, "");
  EXPECT_FALSE(reference.rows.empty());
  if (read_only_rows_of.empty()) {
    EXPECT_EQ(reference.rows.size(), got.rows.size());
    EXPECT_TRUE(reference.rows == got.rows) << "the final tables differ";
  } else {
    size_t differ = 0, extra = 0;
    for (const auto& [key, bytes] : got.rows) {
      const auto it = reference.rows.find(key);
      extra += it == reference.rows.end();
      differ += it != reference.rows.end() && it->second != bytes;
    }
    EXPECT_EQ(differ, 0u) << "rows differ from the reference";
    EXPECT_EQ(extra, 0u) << "rows the reference does not have";
    const std::vector<std::string> missing =
        MissingTrainedRows(reference, got, read_only_rows_of);
    EXPECT_TRUE(missing.empty()) << missing.size() << " trained rows are missing, e.g. "
                                 << missing.front();
  }
  EXPECT_FALSE(reference.dense.empty());
  EXPECT_TRUE(reference.dense == got.dense) << "the final dense state differs";
  EXPECT_EQ(reference.losses.size(), got.losses.size());
  for (size_t rank = 0; rank < reference.losses.size() && rank < got.losses.size(); ++rank) {
    EXPECT_EQ(reference.losses[rank].size(), static_cast<size_t>(steps));
    if (reference.losses[rank] == got.losses[rank]) continue;
    // Name the first step that differs (the maps print truncated).
    std::string first;
    for (const auto& [step, loss] : reference.losses[rank]) {
      auto it = got.losses[rank].find(step);
      if (it == got.losses[rank].end() || it->second != loss) {
        first = absl::StrCat("step ", step, ": ", loss, " vs ",
                             it == got.losses[rank].end() ? "missing" : it->second);
        break;
      }
    }
    if (first.empty()) first = "extra steps in the second run";
    ADD_FAILURE() << "rank " << rank << "'s losses differ (" << reference.losses[rank].size()
                  << " vs " << got.losses[rank].size() << " steps), first at " << first;
  }
}

namespace {

void PutBytes(std::string& out, absl::string_view bytes) {
  const uint64_t n = bytes.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out.append(bytes.data(), bytes.size());
}

bool GetBytes(absl::string_view& in, std::string* bytes) {
  uint64_t n = 0;
  if (in.size() < sizeof(n)) return false;
  std::memcpy(&n, in.data(), sizeof(n));
  in.remove_prefix(sizeof(n));
  if (in.size() < n) return false;
  bytes->assign(in.data(), n);
  in.remove_prefix(n);
  return true;
}

std::string Encode(const RunOutcome& o) {
  std::string out;
  PutBytes(out, absl::StrCat(o.rows.size()));
  for (const auto& [key, row] : o.rows) {
    PutBytes(out, key);
    PutBytes(out, row);
  }
  PutBytes(out, o.dense);
  PutBytes(out, absl::StrCat(o.losses.size()));
  for (const auto& rank : o.losses) {
    PutBytes(out, absl::StrCat(rank.size()));
    for (const auto& [step, loss] : rank) {
      PutBytes(out, absl::StrCat(step));
      PutBytes(out, loss);
    }
  }
  PutBytes(out, o.error);
  return out;
}

bool Decode(absl::string_view in, RunOutcome* o) {
  std::string text;
  size_t n = 0;
  if (!GetBytes(in, &text) || !absl::SimpleAtoi(text, &n)) return false;
  for (size_t i = 0; i < n; ++i) {
    std::string key, row;
    if (!GetBytes(in, &key) || !GetBytes(in, &row)) return false;
    o->rows.emplace(std::move(key), std::move(row));
  }
  size_t ranks = 0;
  if (!GetBytes(in, &o->dense) || !GetBytes(in, &text) || !absl::SimpleAtoi(text, &ranks)) {
    return false;
  }
  o->losses.resize(ranks);
  for (auto& rank : o->losses) {
    if (!GetBytes(in, &text) || !absl::SimpleAtoi(text, &n)) return false;
    for (size_t i = 0; i < n; ++i) {
      int64_t step = 0;
      std::string loss;
      if (!GetBytes(in, &text) || !absl::SimpleAtoi(text, &step) || !GetBytes(in, &loss)) {
        return false;
      }
      rank.emplace(step, std::move(loss));
    }
  }
  return GetBytes(in, &o->error) && in.empty();
}

// What the reference run depends on besides its job: the binaries.
std::string BinariesKey() {
  std::string key;
  std::error_code ec;
  const std::filesystem::path bin = std::filesystem::path(RECPS_LAUNCHER_BINARY).parent_path();
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(bin, ec)) {
    if (absl::StartsWith(entry.path().filename().string(), "recps")) {
      files.push_back(entry.path().string());
    }
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) {
    const auto size = std::filesystem::file_size(f, ec);
    const auto time = std::filesystem::last_write_time(f, ec).time_since_epoch().count();
    absl::StrAppend(&key, "|", f, ":", size, ":", time);
  }
  return key;
}

}  // namespace

absl::StatusOr<RunOutcome> ReferenceOutcome(const LocalRun& run, int shards,
                                            absl::Duration timeout) {
  const char* tmp = std::getenv("TMPDIR");
  const std::filesystem::path dir =
      std::filesystem::path(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") / "recps-e2e-references";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // The job file as written (its checkpoint folder is the run's own).
  const std::string job =
      absl::StrCat(absl::StrReplaceAll(ReadAll(run.job), {{run.checkpoints, "CKPT"}}), "/",
                   run.workers, "/", shards, "/", run.insecure);
  const std::string prefix =
      absl::StrFormat("%s-%016x", run.spec.name, StableNameKey(job));
  const std::string file =
      (dir / absl::StrFormat("%s-%016x", prefix, StableNameKey(BinariesKey()))).string();
  // One process runs it; the suite's others wait here and read its file.
  const int lock = open((dir / (prefix + ".lock")).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock >= 0) flock(lock, LOCK_EX);
  absl::Cleanup unlock = [lock] {
    if (lock >= 0) close(lock);
  };
  RunOutcome outcome;
  if (std::filesystem::exists(file) && Decode(ReadAll(file), &outcome)) return outcome;
  absl::StatusOr<client::ChildProcess> p = run.Start(shards, {});
  if (!p.ok()) return p.status();
  absl::StatusOr<int> code = p->Wait(timeout);
  if (!code.ok() || *code != 0) {
    return absl::InternalError(absl::StrCat(
        "the reference run failed (", code.ok() ? absl::StrCat("exit ", *code)
                                                 : std::string(code.status().message()),
        "):\n", ReadAll(run.log)));
  }
  outcome = CollectOutcome(run);
  // Older builds' files of this job go; the new one is renamed in whole.
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, prefix + "-")) std::filesystem::remove(entry.path(), ec);
  }
  const std::string partial = file + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << Encode(outcome);
  }
  std::filesystem::rename(partial, file, ec);
  return outcome;
}

}  // namespace recps::testing
