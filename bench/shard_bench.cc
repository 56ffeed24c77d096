// Shard server throughput on loopback against raw TCP on the same machine.
//
// Starts real recps-shard processes (standalone, sync, one worker): one
// over plaintext gRPC, one over mutual TLS and one over mutual TLS with
// same-host rows (the rows through shared memory; --wire), then
// drives batched Lookups and PushGradients of 4k..64k unique ids of width 64
// through the embedding client, and measures in the same run the bandwidth
// of one TCP connection over loopback (the anchor): once for the run, and
// before each of a case's rounds. Prints ids/s, payload GB/s, p50/p99
// latency, and payload GB/s as a ratio to raw TCP: the median over the
// rounds of each round's ratio to its own anchor, and their range.
//
//   recps_shard_bench [--shard_binary=PATH] [--seconds_per_case=2]
//                     [--rounds=5] [--op=lookup|push] [--ids=N]
//                     [--max_ids_per_lookup_request=N]
//                     [--id_space=ROWS] [--shard_flag=--threads=1 ...]
//                     [--inflight=N] [--optimizer=sgd|adagrad|rowwise_adagrad]
//                     [--wire=all|both|plain|tls|shm]
//   recps_shard_bench --op=move [--rows=N] [--moves=N] [--ids=N]
//                     [--max_bytes_per_second=N]
//   --op=move: two servers, a worker stepping all the time; moves every
//   slot of one server to the other and back (--moves times), printing each
//   copy's MB/s against raw TCP measured just before it, and the worker's
//   push latency (p50/p99/max) before, during and after the moves
//   (--ids=0: no worker); --shard_flag=--move_* and --threads pass on.
//   --rounds: a case's seconds are split into this many rounds, each right
//   after its own anchor (the machine's speed drifts within seconds);
//   --id_space: rows created and drawn from (default 1M: 256 MiB, beyond
//   the L3); --shard_flag: an extra recps-shard flag, repeatable;
//   --inflight: lookups in flight at once, each from its own caller thread
//   (default 1: one call at a time; a trainer overlaps a step's lookup with
//   the previous step's compute and push, and several workers share a
//   server). Pushes always run one at a time, as one worker sends them.
//   --optimizer: the table's (default sgd). Each push case also times the
//   fused update kernel alone on the same number of distinct random rows of
//   an id_space-row arena, over as many threads as the server's store, and
//   prints the push's payload GB/s as a ratio to it (the push path's target
//   is the kernel's speed: decode, validate and sum add no pass of their
//   own that costs as much as the update).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
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
#include "common/malloc_tuning.h"
#include "common/security/certs.h"
#include "common/thread_pool.h"
#include "kernels/dispatch.h"
#include "kernels/embedding_optimizer.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using shard_bench::kDim;
using shard_bench::Median;
using shard_bench::Now;
using shard_bench::ProcessCpuSeconds;
using shard_bench::RawTcpBandwidth;
using shard_bench::SelfCpuSeconds;

// Gradient bytes per second of the fused update kernel alone: n distinct
// random rows of an id_space-row arena, `threads` threads (each a contiguous
// part of the batch, as the store splits a push), best of `reps`.
double FusedUpdateBandwidth(OptimizerParams params, int64_t id_space,
                            int64_t n, int threads, int reps) {
  const int64_t stride = FusedRowStride(params.kind, kDim);
  std::vector<float> arena(static_cast<size_t>(id_space) * stride, 0.01f);
  std::vector<float> grads(static_cast<size_t>(n) * kDim, 1e-4f);
  std::vector<int64_t> rows(id_space);
  for (int64_t i = 0; i < id_space; ++i) rows[i] = i;
  std::mt19937_64 rng(7);
  ThreadPool pool(threads);
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    // A fresh random subset each rep (a partial shuffle).
    for (int64_t i = 0; i < n; ++i) {
      std::swap(rows[i], rows[i + static_cast<int64_t>(rng() % (id_space - i))]);
    }
    const double t0 = Now();
    const int64_t grain = (n + pool.num_threads() - 1) / pool.num_threads();
    pool.ParallelFor(n, grain, [&](int64_t lo, int64_t hi) {
      kernels::FusedUpdateArgs args;
      args.rows = arena.data();
      args.num_rows = id_space;
      args.row_stride = stride;
      args.dim = kDim;
      args.row_indices = rows.data() + lo;
      args.num_updates = hi - lo;
      args.grads = grads.data() + lo * kDim;
      args.optimizer = params;
      (void)kernels::FusedOptimizerUpdate(args, kernels::ExecContext{});
    });
    best = std::max(best, n * kDim * sizeof(float) / (Now() - t0));
  }
  return best;
}

struct Result {
  double ids_per_second;
  double payload_bytes_per_second;
  double p50_ms;
  double p99_ms;
};

// Throughput of all calls over the case's wall time (the callers ran
// together); latencies per call.
Result Summarise(std::vector<double> latencies, int64_t ids_per_call,
                 double wall_seconds) {
  std::sort(latencies.begin(), latencies.end());
  const double calls = latencies.size();
  auto pct = [&](double p) {
    return latencies[std::min<size_t>(latencies.size() - 1,
                                      static_cast<size_t>(p * calls))] * 1e3;
  };
  const double ids_per_s = ids_per_call * calls / wall_seconds;
  return {ids_per_s, ids_per_s * kDim * sizeof(float), pct(0.5), pct(0.99)};
}

struct Flags {
  std::string binary = RECPS_SHARD_BINARY;
  double seconds_per_case = 2.0;
  std::string only_op;   // "lookup" or "push"; empty runs both
  int64_t only_ids = 0;  // one batch size; 0 runs all
  // Rows created up front and drawn from: 256 MiB by default, far beyond the
  // L3; a small space (say 80000) measures the wire path with rows in cache.
  int64_t id_space = int64_t{1} << 20;
  // Lookups in flight at once, each from its own caller thread.
  int inflight = 1;
  // Each case is split into rounds, each paired with its own anchor.
  int rounds = 5;
  std::string optimizer = "sgd";
  // Servers to run each case against: "plain", "tls", "shm" (TLS, with
  // same-host rows: docs/shard-server.md), "both" (plain and tls) or "all"
  // (one of each, the same table and rows, the cases alternating between
  // them).
  std::string wire = "all";
  std::vector<std::string> shard_flags = {"--standalone", "--world_size=1",
                                          "--consistency=sync"};
  client::EmbeddingClientOptions options;
};

void ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--max_ids_per_lookup_request=", 0) == 0) {
      f->options.max_ids_per_lookup_request = std::stoi(a.substr(29));
    }
    if (a.rfind("--shard_binary=", 0) == 0) f->binary = a.substr(15);
    if (a.rfind("--seconds_per_case=", 0) == 0) f->seconds_per_case = std::stod(a.substr(19));
    if (a.rfind("--op=", 0) == 0) f->only_op = a.substr(5);
    if (a.rfind("--ids=", 0) == 0) f->only_ids = std::stoll(a.substr(6));
    if (a.rfind("--inflight=", 0) == 0) f->inflight = std::stoi(a.substr(11));
    if (a.rfind("--rounds=", 0) == 0) f->rounds = std::stoi(a.substr(9));
    if (a.rfind("--id_space=", 0) == 0) f->id_space = std::stoll(a.substr(11));
    if (a.rfind("--shard_flag=", 0) == 0) f->shard_flags.push_back(a.substr(13));
    if (a.rfind("--optimizer=", 0) == 0) f->optimizer = a.substr(12);
    if (a.rfind("--wire=", 0) == 0) f->wire = a.substr(7);
  }
}

// The table's optimizer from --optimizer, and its name in the tables file.
bool ParseOptimizer(const std::string& optimizer, OptimizerParams* params,
                    std::string* kind_name) {
  params->learning_rate = 0.01f;
  if (optimizer == "sgd") {
    params->kind = OptimizerKind::kSgd;
    *kind_name = "SGD";
  } else if (optimizer == "adagrad") {
    params->kind = OptimizerKind::kAdagrad;
    *kind_name = "ADAGRAD";
  } else if (optimizer == "rowwise_adagrad") {
    params->kind = OptimizerKind::kRowWiseAdagrad;
    *kind_name = "ROWWISE_ADAGRAD";
  } else {
    std::fprintf(stderr, "--optimizer must be sgd, adagrad or rowwise_adagrad\n");
    return false;
  }
  return true;
}

// A server and the client that calls it: the same table and rows, reached
// over plaintext gRPC or over mutual TLS (each case runs against both, so
// that the cost of the encryption is measured in the same run).
struct Target {
  std::string wire;  // "plain", "tls" or "shm"
  std::unique_ptr<testing::LocalShard> shard;
  std::unique_ptr<client::EmbeddingClient> client;
  int64_t step = 0;  // pushes advance the step; lookups read at the next one
};

// What the lookup and push cases share: the servers, their clients and the
// ids.
struct Bench {
  Bench(const Flags& f, OptimizerParams p, int threads)
      : flags(f), params(p), store_threads(threads) {}
  const Flags& flags;
  OptimizerParams params;
  int store_threads;  // the server's --store_threads (0: one per core)
  testing::TempDir dir;
  std::vector<Target> targets;
  std::vector<int64_t> all;  // the id space's ids
  std::mt19937_64 rng{1};    // seeds the callers of each round
};

// Starts a server with the table over `wire` and connects its client. TLS:
// certificates made by common/security in the bench's directory (the
// server's shard certificate, the client's worker certificate), as `recps
// local` makes them.
bool StartServer(const std::string& kind_name, const std::string& wire, Bench* b) {
  const std::string tables = b->dir.WriteFile("tables.textproto", R"(
tables { name: "t" dim: 64 optimizer { kind: )" + kind_name +
                                                         R"( learning_rate: 0.01 } }
)");
  std::vector<std::string> shard_flags = b->flags.shard_flags;
  shard_flags.push_back("--tables=" + tables);
  client::EmbeddingClientOptions options = b->flags.options;
  // Rows through the socket but for "shm", which is what it measures.
  options.same_host_rows = wire == "shm";
  if (wire == "tls" || wire == "shm") {
    const std::string certs = b->dir.path() + "/certs";
    if (!std::filesystem::exists(certs + "/ca.key")) {
      if (absl::Status s = security::InitCertDir(certs, security::CertOptions()); !s.ok()) {
        std::fprintf(stderr, "certificates: %s\n", s.ToString().c_str());
        return false;
      }
    }
    shard_flags.push_back("--tls_ca=" + certs + "/ca.crt");
    shard_flags.push_back("--tls_cert=" + certs + "/shard.crt");
    shard_flags.push_back("--tls_key=" + certs + "/shard.key");
    options.security = rpc::TransportSecurity::Tls(certs + "/ca.crt", certs + "/worker.crt",
                                                   certs + "/worker.key");
  } else {
    options.security = rpc::TransportSecurity::Insecure();
  }
  auto shard = testing::LocalShard::Start(b->flags.binary, shard_flags);
  if (!shard.ok()) {
    std::fprintf(stderr, "%s\n", shard.status().ToString().c_str());
    return false;
  }
  Target t;
  t.wire = wire;
  t.shard = *std::move(shard);
  auto client = client::EmbeddingClient::Create(
      {{"t", kDim}}, client::MakeServerShardMapSource({t.shard->address()}, options.security),
      options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return false;
  }
  t.client = *std::move(client);
  b->targets.push_back(std::move(t));
  return true;
}

// Create every row first so the timed lookups measure serving, not
// initialisation.
bool CreateRows(Bench* b, Target* t) {
  const int64_t id_space = b->flags.id_space;
  if (b->all.empty()) {
    b->all.resize(id_space);
    for (int64_t i = 0; i < id_space; ++i) b->all[i] = i * 0x9e3779b97f4a7c15LL;
  }
  std::vector<float> rows(65536 * kDim);
  for (int64_t lo = 0; lo < id_space; lo += 65536) {
    client::LookupSpec spec{0, absl::MakeConstSpan(b->all).subspan(lo, std::min<int64_t>(65536, id_space - lo)), rows.data()};
    if (absl::Status s = t->client->Lookup(0, {&spec, 1}); !s.ok()) {
      std::fprintf(stderr, "warm-up (%s): %s\n", t->wire.c_str(), s.ToString().c_str());
      return false;
    }
  }
  return true;
}

// The anchor, best of three (one transfer swings by 2x on a busy
// machine): once for the run, and again before each round of each case,
// which that round's ratio uses, so that both sides of a ratio see the
// machine in the same state (the anchor alone swung from 1.2 to 6.6 GB/s
// within an hour on the 2-core VM).
// Each transfer times 512 MiB after 64 MiB of warm-up (smaller or cold
// transfers read lower, which would flatter the ratios).
double Anchor() {
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    best = std::max(best, RawTcpBandwidth(size_t{512} << 20, size_t{64} << 20));
  }
  return best;
}

// One case (an op and a batch size): each caller's ids and rows, kept
// across rounds, and the figures gathered over the rounds.
struct Case {
  Target* target;
  const char* op;
  int64_t n;
  int num_callers;
  std::vector<std::vector<int64_t>> caller_ids;
  std::vector<std::vector<float>> caller_rows;
  std::vector<double> latencies;
  std::vector<double> anchors, ratios;
  double case_seconds = 0;
  double server_cpu = 0, client_cpu = 0;
};

// Two untimed calls per caller first: the first calls of a size fault
// in fresh buffers on both sides and grow the HTTP/2 windows (the first
// 64k-id pushes took 65-180 ms, the rest ~20; with this warm-up the
// case's p99 fell from 125-330 ms to 25-50 ms, though a single slow
// call right after an anchor still shows up now and then).
bool WarmUpCallers(Bench* b, Case* k) {
  Target* t = k->target;
  for (int c = 0; c < k->num_callers; ++c) {
    for (int w = 0; w < 2; ++w) {
      std::copy(b->all.begin(), b->all.begin() + k->n, k->caller_ids[c].begin());
      client::LookupSpec lookup{0, k->caller_ids[c], k->caller_rows[c].data()};
      client::PushSpec push{0, k->caller_ids[c], k->caller_rows[c].data()};
      const absl::Status s =
          k->op[0] == 'l' ? t->client->Lookup(t->step, {&lookup, 1})
                          : t->client->PushGradients(t->step++, {&push, 1});
      if (!s.ok()) {
        std::fprintf(stderr, "%s warm-up: %s\n", k->op, s.ToString().c_str());
        return false;
      }
    }
  }
  return true;
}

// One round of a case, right after its own anchor.
bool RunRound(Bench* b, Case* k) {
  const char* op = k->op;
  const int64_t n = k->n;
  const int64_t id_space = b->flags.id_space;
  Target* t = k->target;
  const double tcp = Anchor();
  const double server_cpu_start = ProcessCpuSeconds(t->shard->pid());
  const double client_cpu_start = SelfCpuSeconds();
  const double round_start = Now();
  const size_t calls_before = k->latencies.size();
  // `inflight` callers, each with its own ids and rows, one call at a
  // time each; pushes take step numbers from one counter.
  absl::Mutex mu;
  absl::Status failed;
  std::atomic<int64_t> next_step{t->step};
  auto caller = [&](int c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<int64_t>& ids = k->caller_ids[c];
    std::vector<float>& buf = k->caller_rows[c];
    std::vector<double> mine;
    while (Now() - round_start < b->flags.seconds_per_case / b->flags.rounds ||
           mine.size() < 3) {
      // Distinct random ids: a random window of the shuffled id space.
      const int64_t start = static_cast<int64_t>(rng() % (id_space - n));
      std::copy(b->all.begin() + start, b->all.begin() + start + n, ids.begin());
      const double t0 = Now();
      absl::Status s;
      if (op[0] == 'l') {
        client::LookupSpec spec{0, ids, buf.data()};
        s = t->client->Lookup(t->step, {&spec, 1});
      } else {
        client::PushSpec spec{0, ids, buf.data()};
        s = t->client->PushGradients(next_step++, {&spec, 1});
      }
      mine.push_back(Now() - t0);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        failed = s;
        return;
      }
    }
    absl::MutexLock lock(&mu);
    k->latencies.insert(k->latencies.end(), mine.begin(), mine.end());
  };
  std::vector<std::thread> callers;
  // A worker has one push in flight at a time (sync mode applies steps
  // in order); lookups overlap (the trainer's prefetch, other workers).
  for (int c = 0; c < k->num_callers; ++c) callers.emplace_back(caller, c, b->rng());
  for (std::thread& t : callers) t.join();
  const double wall = Now() - round_start;
  t->step = next_step;
  if (!failed.ok()) {
    std::fprintf(stderr, "%s: %s\n", op, failed.ToString().c_str());
    return false;
  }
  // The client's CPU includes copying the ids in the loop above.
  k->server_cpu += ProcessCpuSeconds(t->shard->pid()) - server_cpu_start;
  k->client_cpu += SelfCpuSeconds() - client_cpu_start;
  k->case_seconds += wall;
  const double round_bytes_per_s = static_cast<double>(
      k->latencies.size() - calls_before) * n * kDim * sizeof(float) / wall;
  k->anchors.push_back(tcp);
  k->ratios.push_back(round_bytes_per_s / tcp);
  return true;
}

// The case's row; a push case then times the fused update kernel alone.
void ReportCase(const Bench& b, const Case& k) {
  const double calls = k.latencies.size();
  const Result r = Summarise(k.latencies, k.n, k.case_seconds);
  std::printf(
      "%-7s %-5s %6ld %12.0f %9.3f %8.2f %8.2f %7.2f %7.2f %5.2f-%5.2f %10.2f "
      "%10.2f\n",
      k.op, k.target->wire.c_str(), static_cast<long>(k.n), r.ids_per_second,
      r.payload_bytes_per_second / 1e9, r.p50_ms, r.p99_ms,
      Median(k.anchors) / 1e9, Median(k.ratios),
      *std::min_element(k.ratios.begin(), k.ratios.end()),
      *std::max_element(k.ratios.begin(), k.ratios.end()),
      k.server_cpu / calls * 1e3, k.client_cpu / calls * 1e3);
  if (k.op[0] == 'p' && k.target == &b.targets.back()) {
    ThreadPool probe(b.store_threads);
    const double kernel = FusedUpdateBandwidth(b.params, b.flags.id_space, k.n,
                                               probe.num_threads(), 5);
    std::printf("        fused %s update kernel alone (%d threads): %.3f GB/s; "
                "push = %.2f x kernel\n",
                b.flags.optimizer.c_str(), probe.num_threads(), kernel / 1e9,
                r.payload_bytes_per_second / kernel);
  }
}

bool RunCase(Bench* b, Target* target, const char* op, int64_t n) {
  Case k;
  k.target = target;
  k.op = op;
  k.n = n;
  k.num_callers = op[0] == 'l' ? b->flags.inflight : 1;
  k.caller_ids.assign(k.num_callers, std::vector<int64_t>(n));
  k.caller_rows.assign(k.num_callers, std::vector<float>(n * kDim, 1e-4f));
  if (!WarmUpCallers(b, &k)) return false;
  for (int round = 0; round < b->flags.rounds; ++round) {
    if (!RunRound(b, &k)) return false;
  }
  ReportCase(*b, k);
  return true;
}

int Main(int argc, char** argv) {
  // As in the worker, the client's process.
  TuneDataPlaneProcess();
  Flags flags;
  ParseFlags(argc, argv, &flags);
  OptimizerParams params;
  std::string kind_name;
  if (!ParseOptimizer(flags.optimizer, &params, &kind_name)) return 2;
  // The server's store splits a push over --store_threads (default: one per
  // hardware thread); the kernel anchor uses as many.
  int store_threads = 0;
  for (const std::string& f : flags.shard_flags) {
    if (f.rfind("--store_threads=", 0) == 0) store_threads = std::stoi(f.substr(16));
  }
  if (flags.only_op == "move") {
    return shard_bench::RunMoveBench(flags.binary, argc, argv, flags.shard_flags);
  }
  if (flags.inflight < 1 || flags.rounds < 1) {
    std::fprintf(stderr, "--inflight and --rounds must be at least 1\n");
    return 2;
  }
  if (flags.id_space <= 65536) {
    std::fprintf(stderr, "--id_space must exceed the largest batch, 65536\n");
    return 2;
  }
  if (flags.wire != "plain" && flags.wire != "tls" && flags.wire != "shm" &&
      flags.wire != "both" && flags.wire != "all") {
    std::fprintf(stderr, "--wire must be all, both, plain, tls or shm\n");
    return 2;
  }
  Bench b(flags, params, store_threads);
  for (const char* wire : {"plain", "tls", "shm"}) {
    const bool wanted = flags.wire == wire || flags.wire == "all" ||
                        (flags.wire == "both" && std::string(wire) != "shm");
    if (!wanted) continue;
    if (!StartServer(kind_name, wire, &b) || !CreateRows(&b, &b.targets.back())) return 1;
  }

  std::printf("raw TCP loopback (1 warm connection, best of 3): %.2f GB/s\n",
              Anchor() / 1e9);
  std::printf("max_ids_per_lookup_request: %d, lookups in flight: %d, "
              "rounds per case: %d\n\n",
              flags.options.max_ids_per_lookup_request, flags.inflight, flags.rounds);
  std::printf("%-7s %-5s %6s %12s %9s %8s %8s %7s %7s %11s %10s %10s\n", "op",
              "wire", "ids", "ids/s", "GB/s", "p50 ms", "p99 ms", "tcp", "x_tcp",
              "x_tcp range", "srv cpu ms", "cli cpu ms");
  for (const char* op : {"lookup", "push"}) {
    if (!flags.only_op.empty() && flags.only_op != op) continue;
    for (int64_t n : {int64_t{4096}, int64_t{16384}, int64_t{65536}}) {
      if (flags.only_ids > 0 && n != flags.only_ids) continue;
      for (Target& t : b.targets) {
        if (!RunCase(&b, &t, op, n)) return 1;
      }
    }
  }
  std::printf("\n(payload = ids x %d floats; each case runs in rounds, each "
              "round right after its own raw TCP measurement (best of 3, warm "
              "connection); "
              "tcp: median of those, x_tcp: median of the rounds' ratios; "
              "wire: plaintext gRPC or mutual TLS, the anchor always plain TCP; "
              "goal: lookups and pushes over TLS >= 0.5 x raw TCP)\n", kDim);
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
