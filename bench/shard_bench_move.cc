// recps_shard_bench --op=move: slot moves between two real recps-shard
// processes while a worker steps, each copy timed against raw TCP measured
// just before it (bench/shard_bench.cc has the usage).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "bench/shard_bench_util.h"
#include "client/embedding_client.h"
#include "common/rpc/channels.h"
#include "grpcpp/grpcpp.h"
#include "recps/v1/shard_admin.grpc.pb.h"
#include "tests/testing/local_shard.h"

namespace recps::shard_bench {
namespace {

constexpr uint32_t kMoveSlots = 4096;

// The move bench's flags and what its steps share (declared so that the
// client goes before the servers, and the servers before their files).
struct MoveBench {
  std::string binary;
  int64_t rows = int64_t{1} << 20, ids = 4096, max_bytes_per_second = 0;
  int moves = 4;
  std::vector<std::string> extra_flags;  // --move_* and --threads, passed on
  testing::TempDir dir;
  std::vector<std::unique_ptr<testing::LocalShard>> servers;
  std::string a, b;  // the two servers' addresses
  std::unique_ptr<client::EmbeddingClient> client;
  std::vector<int64_t> all;  // every row's id
  int64_t step = 0;
};

// The worker: one step after the other, recording push latencies in the
// current phase (0 before the first move, 1 during moves, 2 after).
struct MoveWorker {
  std::atomic<int> phase{0};
  std::atomic<bool> stop{false};
  absl::Mutex mu;
  std::vector<double> latencies[3];
  std::thread thread;
};

// Two servers (sync, one worker) and a client of both.
bool StartMoveCluster(MoveBench* m) {
  const std::string tables = m->dir.WriteFile("tables.textproto", R"(
tables { name: "t" dim: 64 optimizer { kind: SGD learning_rate: 0.01 } }
)");
  std::vector<std::string> flags = {
      "--tables=" + tables, "--world_size=1", "--consistency=sync",
      "--num_slots=4096", "--step_timeout=60s"};
  flags.insert(flags.end(), m->extra_flags.begin(), m->extra_flags.end());
  auto servers = testing::StartShardCluster(m->binary, flags, 2, kMoveSlots);
  if (!servers.ok()) {
    std::fprintf(stderr, "%s\n", servers.status().ToString().c_str());
    return false;
  }
  m->servers = *std::move(servers);
  m->a = m->servers[0]->address();
  m->b = m->servers[1]->address();
  auto client = client::EmbeddingClient::Create(
      {{"t", kDim}}, client::MakeServerShardMapSource({m->a, m->b}),
      client::EmbeddingClientOptions());
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return false;
  }
  m->client = *std::move(client);
  return true;
}

// Creates the `rows` rows (a lookup and a push of each batch).
bool FillMoveRows(MoveBench* m) {
  const int64_t rows = m->rows;
  m->all.resize(rows);
  for (int64_t i = 0; i < rows; ++i) m->all[i] = i * 0x9e3779b97f4a7c15LL;
  std::vector<float> buf(65536 * kDim);
  for (int64_t lo = 0; lo < rows; lo += 65536) {
    client::LookupSpec spec{0, absl::MakeConstSpan(m->all).subspan(lo, std::min<int64_t>(65536, rows - lo)), buf.data()};
    client::PushSpec push{0, spec.ids, buf.data()};
    std::fill(buf.begin(), buf.end(), 0.0f);
    if (absl::Status st = m->client->Lookup(m->step, {&spec, 1}); !st.ok()) {
      std::fprintf(stderr, "fill: %s\n", st.ToString().c_str());
      return false;
    }
    if (absl::Status st = m->client->PushGradients(m->step++, {&push, 1}); !st.ok()) {
      std::fprintf(stderr, "fill: %s\n", st.ToString().c_str());
      return false;
    }
  }
  return true;
}

void StartMoveWorker(MoveBench* m, MoveWorker* w) {
  w->thread = std::thread([m, w] {
    const int64_t ids = m->ids;
    std::mt19937_64 rng(3);
    std::vector<int64_t> mine(ids);
    std::vector<float> grads(ids * kDim, 0.001f);
    while (ids > 0 && !w->stop.load()) {
      for (int64_t& id : mine) id = m->all[rng() % m->all.size()];
      std::sort(mine.begin(), mine.end());
      mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
      client::LookupSpec spec{0, mine, grads.data()};
      if (!m->client->Lookup(m->step, {&spec, 1}).ok()) break;
      std::fill(grads.begin(), grads.end(), 0.001f);
      client::PushSpec push{0, mine, grads.data()};
      const int ph = w->phase.load();
      const double t0 = Now();
      const absl::Status st = m->client->PushGradients(m->step++, {&push, 1});
      const double dt = Now() - t0;
      if (!st.ok()) {
        std::fprintf(stderr, "push: %s\n", st.ToString().c_str());
        break;
      }
      absl::MutexLock lock(&w->mu);
      w->latencies[ph].push_back(dt);
      mine.resize(ids);
    }
  });
}

std::unique_ptr<v1::ShardAdmin::Stub> Admin(const std::string& address) {
  return v1::ShardAdmin::NewStub(
      rpc::MakeChannel(address, rpc::ChannelKind::kControl));
}

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
}

// Move `index`: every slot that `map` gives the server it leaves (0 on
// even moves, 1 on odd) to the other one (MigrateIn, then HandOver),
// timed against raw TCP measured just before it; prints its row and
// appends its ratio. False (said on stderr) when an RPC fails.
bool MoveOnce(const MoveBench& m, int index, v1::ShardMap* map,
              std::vector<double>* ratios) {
  const int from = index % 2 == 0 ? 0 : 1;
  const std::string src = from == 0 ? m.a : m.b, dst = from == 0 ? m.b : m.a;
  const double tcp = RawTcpBandwidth(size_t{512} << 20, size_t{64} << 20);
  v1::MigrateInRequest in;
  in.set_move_id(absl::StrCat("bench-", index));
  in.set_source(src);
  in.set_epoch(map->epoch());
  in.set_max_bytes_per_second(m.max_bytes_per_second);
  v1::ShardMap next = *map;
  next.set_epoch(map->epoch() + 1);
  for (uint32_t s = 0; s < kMoveSlots; ++s) {
    if (map->slot_owner(s) == static_cast<uint32_t>(from)) {
      in.add_slots(s);
      next.set_slot_owner(s, 1 - from);
    }
  }
  // A source exports only what the coordinator allowed before MigrateIn.
  v1::AllowExportRequest allow;
  allow.set_move_id(in.move_id());
  *allow.mutable_slots() = in.slots();
  allow.set_ttl_ms(600000);
  v1::AllowExportResponse allowed;
  grpc::ClientContext c0;
  SetDeadline(&c0);
  grpc::Status st = Admin(src)->AllowExport(&c0, allow, &allowed);
  if (!st.ok()) {
    std::fprintf(stderr, "AllowExport: %s\n", st.error_message().c_str());
    return false;
  }
  v1::MigrateInResponse copied;
  grpc::ClientContext c1;
  SetDeadline(&c1);
  st = Admin(dst)->MigrateIn(&c1, in, &copied);
  if (!st.ok()) {
    std::fprintf(stderr, "MigrateIn: %s\n", st.error_message().c_str());
    return false;
  }
  v1::HandOverRequest over;
  over.set_move_id(in.move_id());
  over.set_target(dst);
  over.set_self(src);
  *over.mutable_new_map() = next;
  v1::HandOverResponse handed;
  grpc::ClientContext c2;
  SetDeadline(&c2);
  st = Admin(src)->HandOver(&c2, over, &handed);
  if (!st.ok()) {
    std::fprintf(stderr, "HandOver: %s\n", st.error_message().c_str());
    return false;
  }
  *map = next;
  const double rate = copied.bytes() / copied.seconds();
  ratios->push_back(rate / tcp);
  std::printf("%-5d %10lld %10.1f %9.3f %9.1f %7.3f %9lld %9.2f\n", index,
              static_cast<long long>(copied.rows()), copied.bytes() / 1e6,
              copied.seconds(), rate / 1e6, rate / tcp,
              static_cast<long long>(handed.delta_rows()),
              handed.hold_seconds() * 1e3);
  return true;
}

void PrintMoveSummary(const MoveBench& m, MoveWorker* w,
                      const std::vector<double>& ratios) {
  std::printf("\nmove rate / raw TCP (each copy against TCP measured just "
              "before it): median %.3f (goal >= 0.3)\n", Median(ratios));
  std::printf("push latency of a %lld-id step (ms):  %-7s %8s %8s %8s %7s\n",
              static_cast<long long>(m.ids), "", "p50", "p99", "max", "steps");
  const char* names[3] = {"before moves", "during moves", "after moves"};
  for (int ph = 0; ph < 3; ++ph) {
    absl::MutexLock lock(&w->mu);
    std::printf("  %-34s %8.2f %8.2f %8.2f %7zu\n", names[ph],
                Percentile(w->latencies[ph], 0.5) * 1e3,
                Percentile(w->latencies[ph], 0.99) * 1e3,
                Percentile(w->latencies[ph], 1.0) * 1e3, w->latencies[ph].size());
  }
}

// Two servers (sync, one worker), `rows` rows of dim 64 (SGD: 256 B each)
// spread over them; a worker steps (lookup + push of `ids` ids) the whole
// time. Moves every slot of server 0 to server 1 (MigrateIn, then
// HandOver) and back, timing each copy against raw TCP measured just
// before it, and the worker's push latency before and during the moves.
int MoveMain(MoveBench* m) {
  if (!StartMoveCluster(m) || !FillMoveRows(m)) return 1;
  MoveWorker w;
  StartMoveWorker(m, &w);
  absl::SleepFor(absl::Seconds(2));  // latencies before
  v1::ShardMap map;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    Admin(m->a)->GetShardMap(&ctx, v1::GetShardMapRequest(), &map);
  }
  std::printf("%-5s %10s %10s %9s %9s %7s %9s %9s\n", "move", "rows", "MB",
              "copy s", "MB/s", "x_tcp", "delta", "hold ms");
  std::vector<double> ratios;
  w.phase = 1;
  bool moved = true;
  for (int i = 0; i < m->moves && moved; ++i) moved = MoveOnce(*m, i, &map, &ratios);
  w.phase = 2;
  absl::SleepFor(absl::Seconds(1));
  w.stop = true;
  w.thread.join();
  PrintMoveSummary(*m, &w, ratios);
  return moved ? 0 : 1;  // a failed move fails the run
}

// ---- lookups and pushes against one server ----

// The flags (those of --op=move are read by RunMoveOp).

}  // namespace

int RunMoveBench(const std::string& binary, int argc, char** argv,
                 const std::vector<std::string>& shard_flags) {
  MoveBench m;
  m.binary = binary;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--rows=", 0) == 0) m.rows = std::stoll(a.substr(7));
    if (a.rfind("--moves=", 0) == 0) m.moves = std::stoi(a.substr(8));
    if (a.rfind("--ids=", 0) == 0) m.ids = std::stoll(a.substr(6));
    if (a.rfind("--max_bytes_per_second=", 0) == 0) m.max_bytes_per_second = std::stoll(a.substr(23));
  }
  for (const std::string& flag : shard_flags) {
    if (flag.rfind("--move", 0) == 0 || flag.rfind("--threads", 0) == 0) {
      m.extra_flags.push_back(flag);
    }
  }
  return MoveMain(&m);
}

}  // namespace recps::shard_bench
