// Kernel throughput against the machine's own memory bandwidth.
//
// Measures, in one run: memcpy over a 1 GiB buffer (the physical anchor), the
// embedding-bag forward gathering random rows from a 1 GiB table, and the
// fused optimizer update of random rows of a 1 GiB table; each with 1 thread
// and all threads. Every result carries its ratio to memcpy with the same
// thread count, and a summary at the end checks the targets:
//   forward (width 64, all threads) >= 0.4 x memcpy
//   fused Adagrad >= 0.5 x forward (same width and threads)
// and, as the compute anchor, a square sgemm's GFLOP/s next to the GEMMs of
// one step of issue 17's DLRM (dense 13 -> 512-256-64, top 512-256-1): the
// time no fp32 trainer of that model can go below on this machine.
//
//   recps_kernels_bench [--benchmark_filter=...] [--table_gib=N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "common/aligned_buffer.h"
#include "common/thread_pool.h"
#include "kernels/embedding_bag.h"
#include "kernels/embedding_optimizer.h"
#include "kernels/gemm.h"

namespace recps::kernels {
namespace {

size_t g_table_bytes = size_t{1} << 30;
constexpr int64_t kIdsPerBatch = 1 << 16;
// Enough random ids that batches do not repeat within a benchmark.
constexpr int64_t kIdStream = int64_t{1} << 24;

// Bytes per second measured so far, by benchmark name (for ratios).
std::map<std::string, double>& Results() {
  static auto* results = new std::map<std::string, double>;
  return *results;
}

AlignedBuffer MustAllocate(size_t bytes) {
  absl::StatusOr<AlignedBuffer> buf = AlignedBuffer::Allocate(bytes);
  if (!buf.ok()) {
    std::fprintf(stderr, "%s\n", buf.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(buf);
}

// Fills a buffer with non-zero data on every page (faults the pages in).
void Fill(const AlignedBuffer& buf, ThreadPool& pool) {
  float* f = buf.as<float>();
  const int64_t n = buf.size() / sizeof(float);
  pool.ParallelFor(n, 1 << 20, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) f[i] = static_cast<float>(i % 1021) * 1e-3f;
  });
}

ThreadPool& Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>>* pools =
      new std::map<int, std::unique_ptr<ThreadPool>>;
  auto& p = (*pools)[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// The 1 GiB table shared by every benchmark, filled once.
const AlignedBuffer& Table() {
  static AlignedBuffer* table = [] {
    auto* t = new AlignedBuffer(MustAllocate(g_table_bytes));
    Fill(*t, Pool(ThreadPool::HardwareThreads()));
    return t;
  }();
  return *table;
}

const std::vector<uint64_t>& RandomStream() {
  static std::vector<uint64_t>* ids = [] {
    auto* v = new std::vector<uint64_t>(kIdStream);
    std::mt19937_64 rng(42);
    for (uint64_t& x : *v) x = rng();
    return v;
  }();
  return *ids;
}

void Record(benchmark::State& state, const std::string& key, double bytes,
            double seconds, const std::string& anchor_key) {
  const double rate = bytes / seconds;
  Results()[key] = rate;
  state.counters["GB/s"] = rate / 1e9;
  auto it = Results().find(anchor_key);
  if (it != Results().end()) state.counters["x_memcpy"] = rate / it->second;
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

std::string MemcpyKey(int threads) { return absl::StrFormat("memcpy/t%d", threads); }

void BM_Memcpy(benchmark::State& state, int threads) {
  static AlignedBuffer* src = nullptr;
  static AlignedBuffer* dst = nullptr;
  if (src == nullptr) {
    src = new AlignedBuffer(MustAllocate(g_table_bytes));
    dst = new AlignedBuffer(MustAllocate(g_table_bytes));
    Fill(*src, Pool(ThreadPool::HardwareThreads()));
    Fill(*dst, Pool(ThreadPool::HardwareThreads()));
  }
  ThreadPool& pool = Pool(threads);
  const int64_t chunk = 8 << 20;
  const int64_t n = src->size();
  double bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    pool.ParallelFor(n, chunk, [&](int64_t lo, int64_t hi) {
      std::memcpy(dst->as<char>() + lo, src->as<char>() + lo, hi - lo);
    });
    benchmark::ClobberMemory();
    bytes += n;
  }
  Record(state, MemcpyKey(threads), bytes, Seconds(start), "");
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

std::string ForwardKey(int dim, int pooling, bool f16, int threads) {
  return absl::StrFormat("forward/%s/dim%d/pool%d/t%d", f16 ? "f16" : "f32",
                         dim, pooling, threads);
}

void BM_EmbeddingBagForward(benchmark::State& state, int dim, int pooling,
                            bool f16, int threads) {
  const AlignedBuffer& table = Table();
  const int64_t elem = f16 ? 2 : 4;
  const int64_t num_rows = table.size() / (dim * elem);
  const int64_t num_bags = kIdsPerBatch / pooling;
  std::vector<int64_t> offsets(num_bags + 1);
  for (int64_t b = 0; b <= num_bags; ++b) offsets[b] = b * pooling;
  std::vector<int64_t> indices(kIdsPerBatch);
  std::vector<float> out(num_bags * dim);
  const std::vector<uint64_t>& stream = RandomStream();

  EmbeddingBagForwardArgs a;
  a.rows = table.data();
  a.dtype = f16 ? RowDType::kFloat16 : RowDType::kFloat32;
  a.num_rows = num_rows;
  a.row_stride = dim;
  a.dim = dim;
  a.indices = indices.data();
  a.num_indices = kIdsPerBatch;
  a.offsets = offsets.data();
  a.num_bags = num_bags;
  a.output = out.data();
  ExecContext ctx;
  ctx.pool = &Pool(threads);

  int64_t cursor = 0;
  double bytes = 0, seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();  // new random ids for every batch, untimed
    for (int64_t& i : indices) {
      i = static_cast<int64_t>(stream[cursor++ % kIdStream] % num_rows);
    }
    state.ResumeTiming();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = EmbeddingBagForwardCpu(a, ctx);
    seconds += Seconds(start);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    bytes += static_cast<double>(kIdsPerBatch) * dim * elem;
  }
  Record(state, ForwardKey(dim, pooling, f16, threads), bytes, seconds,
         MemcpyKey(threads));
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

// The worker's embedding step for one batch (pool every feature, then its
// backward into per-unique-id gradient rows), F features of one table each,
// B bags of `pooling` ids, dim 64, rows already gathered per unique id.
// "copy": the trainer before issue 17 (each feature pooled into a B x D
// scratch and interleaved into B x F x D; gradients zeroed, copied out per
// feature, pooled back into scratch and added). "strided": straight into and
// out of B x F x D (output_stride / grad_output_stride), first feature
// writing every row. Bytes counted: the forward's gathered rows.
std::string TrainerKey(bool strided, int features, int pooling, int threads) {
  return absl::StrFormat("trainer/%s/F%d/pool%d/t%d", strided ? "strided" : "copy",
                         features, pooling, threads);
}

void BM_TrainerEmbeddingStep(benchmark::State& state, bool strided, int features,
                             int pooling, int threads) {
  constexpr int kDim = 64;
  constexpr int64_t kBags = 4096;
  const int64_t num_indices = kBags * pooling;
  const int64_t num_rows = std::min<int64_t>(num_indices, 100000);
  std::vector<int64_t> offsets(kBags + 1);
  for (int64_t b = 0; b <= kBags; ++b) offsets[b] = b * pooling;
  std::vector<std::vector<int64_t>> indices(features, std::vector<int64_t>(num_indices));
  std::mt19937_64 rng(features * 131 + pooling);
  for (auto& f : indices) {
    for (int64_t& i : f) i = static_cast<int64_t>(rng() % num_rows);
  }
  std::vector<std::vector<float>> rows(features, std::vector<float>(num_rows * kDim, 0.25f));
  std::vector<std::vector<float>> grad_rows(features);
  std::vector<float> pooled(kBags * features * kDim);
  std::vector<float> grad_pooled(pooled.size(), 0.5f);
  std::vector<float> scratch(std::max<int64_t>(kBags, num_rows) * kDim);
  std::vector<float> feature_grad(kBags * kDim);
  ExecContext ctx;
  ctx.pool = &Pool(threads);

  double bytes = 0, seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int f = 0; f < features; ++f) {
      EmbeddingBagForwardArgs a;
      a.rows = rows[f].data();
      a.num_rows = num_rows;
      a.row_stride = kDim;
      a.dim = kDim;
      a.indices = indices[f].data();
      a.num_indices = num_indices;
      a.offsets = offsets.data();
      a.num_bags = kBags;
      if (strided) {
        a.output = pooled.data() + f * kDim;
        a.output_stride = static_cast<int64_t>(features) * kDim;
        (void)EmbeddingBagForwardCpu(a, ctx);
      } else {
        a.output = scratch.data();
        (void)EmbeddingBagForwardCpu(a, ctx);
        for (int64_t i = 0; i < kBags; ++i) {
          std::memcpy(&pooled[(i * features + f) * kDim], &scratch[i * kDim],
                      sizeof(float) * kDim);
        }
      }
    }
    for (int f = 0; f < features; ++f) {
      EmbeddingBagBackwardArgs g;
      g.dim = kDim;
      g.indices = indices[f].data();
      g.num_indices = num_indices;
      g.offsets = offsets.data();
      g.num_bags = kBags;
      g.num_rows = num_rows;
      if (strided) {
        grad_rows[f].resize(num_rows * kDim);
        g.grad_output = grad_pooled.data() + f * kDim;
        g.grad_output_stride = static_cast<int64_t>(features) * kDim;
        g.grad_rows = grad_rows[f].data();
        (void)EmbeddingBagBackwardCpu(g, ctx);
      } else {
        grad_rows[f].assign(num_rows * kDim, 0.0f);
        for (int64_t i = 0; i < kBags; ++i) {
          std::memcpy(&feature_grad[i * kDim], &grad_pooled[(i * features + f) * kDim],
                      sizeof(float) * kDim);
        }
        g.grad_output = feature_grad.data();
        g.grad_rows = scratch.data();
        (void)EmbeddingBagBackwardCpu(g, ctx);
        float* out = grad_rows[f].data();
        for (int64_t k = 0; k < num_rows * kDim; ++k) out[k] += scratch[k];
      }
    }
    seconds += Seconds(start);
    bytes += static_cast<double>(features) * num_indices * kDim * sizeof(float);
  }
  Record(state, TrainerKey(strided, features, pooling, threads), bytes, seconds,
         MemcpyKey(threads));
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

std::string UpdateKey(OptimizerKind kind, int dim, int threads) {
  return absl::StrFormat("update/%s/dim%d/t%d", OptimizerName(kind), dim,
                         threads);
}

void BM_FusedUpdate(benchmark::State& state, OptimizerKind kind, int dim,
                    int threads) {
  const AlignedBuffer& table = Table();
  const int64_t stride = FusedRowStride(kind, dim);
  int64_t num_rows = table.size() / (stride * sizeof(float));
  // Distinct scattered rows per batch: i -> (a * i + b) mod 2^k is a
  // permutation for odd a.
  int64_t pow2 = 1;
  while (pow2 * 2 <= num_rows) pow2 *= 2;
  std::vector<int64_t> rows(kIdsPerBatch);
  std::vector<float> grads(kIdsPerBatch * dim, 1e-3f);
  const std::vector<uint64_t>& stream = RandomStream();

  FusedUpdateArgs a;
  a.rows = table.as<float>();
  a.num_rows = num_rows;
  a.row_stride = stride;
  a.dim = dim;
  a.row_indices = rows.data();
  a.num_updates = kIdsPerBatch;
  a.grads = grads.data();
  a.optimizer.kind = kind;
  a.optimizer.learning_rate = 1e-6f;  // keeps the shared table's values sane
  ExecContext ctx;
  ctx.pool = &Pool(threads);

  const double row_bytes = (dim + FusedRowStateWidth(kind, dim)) * 4.0;
  int64_t cursor = 0;
  double bytes = 0, seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const uint64_t mul = stream[cursor++ % kIdStream] | 1;
    const uint64_t add = stream[cursor++ % kIdStream];
    for (int64_t i = 0; i < kIdsPerBatch; ++i) {
      rows[i] = static_cast<int64_t>((mul * i + add) & (pow2 - 1));
    }
    state.ResumeTiming();
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = FusedOptimizerUpdateCpu(a, ctx);
    seconds += Seconds(start);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    bytes += 2.0 * row_bytes * kIdsPerBatch;  // each row read and written
  }
  Record(state, UpdateKey(kind, dim, threads), bytes, seconds,
         MemcpyKey(threads));
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

// GFLOP/s of GemmCpu, by benchmark name (for the MLP's ratio to the square
// product).
std::map<std::string, double>& Flops() {
  static auto* flops = new std::map<std::string, double>;
  return *flops;
}

std::string SquareGemmKey(int threads) { return absl::StrFormat("gemm/square1024/t%d", threads); }
std::string MlpGemmKey(int features, int batch, int threads) {
  return absl::StrFormat("gemm/dlrm_step/F%d/B%d/t%d", features, batch, threads);
}

struct GemmShape {
  bool trans_a, trans_b;
  int64_t m, n, k;
};

// Runs `shapes` through GemmCpu on `threads` and records GFLOP/s.
void RunGemms(benchmark::State& state, const std::vector<GemmShape>& shapes, int threads,
              const std::string& key) {
  int64_t largest = 0;
  double flops_per_round = 0;
  for (const GemmShape& g : shapes) {
    largest = std::max({largest, g.m * g.k, g.k * g.n, g.m * g.n});
    flops_per_round += 2.0 * g.m * g.n * g.k;
  }
  std::vector<float> a(largest, 0.01f), b(largest, 0.02f), c(largest);
  ExecContext ctx;
  ctx.pool = &Pool(threads);
  double flops = 0, seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (const GemmShape& g : shapes) {
      GemmArgs args;
      args.trans_a = g.trans_a;
      args.trans_b = g.trans_b;
      args.m = g.m;
      args.n = g.n;
      args.k = g.k;
      args.a = a.data();
      args.lda = g.trans_a ? g.m : g.k;
      args.b = b.data();
      args.ldb = g.trans_b ? g.k : g.n;
      args.c = c.data();
      args.ldc = g.n;
      if (absl::Status st = GemmCpu(args, ctx); !st.ok()) {
        state.SkipWithError(st.ToString().c_str());
        return;
      }
    }
    seconds += Seconds(start);
    flops += flops_per_round;
  }
  Flops()[key] = flops / seconds;
  state.counters["GFLOP/s"] = flops / seconds / 1e9;
  state.counters["ms/round"] = 1e3 * seconds / state.iterations();
}

// Every GEMM of one training step of issue 17's DLRM with `features` tables
// of dim 64 and `batch` samples: forward y = x W^T per layer; backward
// dW = dy^T x per layer and dx = dy W for all but the first.
std::vector<GemmShape> DlrmStepGemms(int features, int batch) {
  const int64_t vectors = features + 1;
  const int64_t top_in = 64 + vectors * (vectors - 1) / 2;
  const std::vector<std::pair<int64_t, int64_t>> layers = {
      {13, 512}, {512, 256}, {256, 64}, {top_in, 512}, {512, 256}, {256, 1}};
  std::vector<GemmShape> shapes;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto [in, out] = layers[l];
    shapes.push_back({false, true, batch, out, in});   // forward
    shapes.push_back({true, false, out, in, batch});   // dW
    if (l != 0) shapes.push_back({false, false, batch, in, out});  // dx
  }
  return shapes;
}

void RegisterAll() {
  const int all = ThreadPool::HardwareThreads();
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  auto reg = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)
        ->UseRealTime()
        ->MinTime(0.5)
        ->Unit(benchmark::kMicrosecond);
  };
  for (int t : thread_counts) {
    reg(MemcpyKey(t), [t](benchmark::State& s) { BM_Memcpy(s, t); });
  }
  for (int t : thread_counts) {
    for (int dim : {32, 64, 128}) {
      for (int pooling : {1, 32}) {
        reg(ForwardKey(dim, pooling, false, t), [=](benchmark::State& s) {
          BM_EmbeddingBagForward(s, dim, pooling, false, t);
        });
      }
    }
    reg(ForwardKey(64, 32, true, t), [=](benchmark::State& s) {
      BM_EmbeddingBagForward(s, 64, 32, true, t);
    });
    // Interleaved copy / strided pairs, issue 17's S-p1, S-p20 and M-p1
    // shapes (per worker of one: F=8 and 26, 2048-4096 bags).
    for (auto [features, pooling] : {std::pair{8, 1}, std::pair{8, 20}, std::pair{26, 1}}) {
      for (bool strided : {false, true}) {
        reg(TrainerKey(strided, features, pooling, t), [=](benchmark::State& s) {
          BM_TrainerEmbeddingStep(s, strided, features, pooling, t);
        });
      }
    }
    reg(SquareGemmKey(t), [t](benchmark::State& s) {
      RunGemms(s, {{false, false, 1024, 1024, 1024}}, t, SquareGemmKey(t));
    });
    for (auto [features, batch] : {std::pair{8, 2048}, std::pair{8, 1024}, std::pair{26, 4096},
                                   std::pair{26, 2048}}) {
      reg(MlpGemmKey(features, batch, t), [=](benchmark::State& s) {
        RunGemms(s, DlrmStepGemms(features, batch), t, MlpGemmKey(features, batch, t));
      });
    }
    for (OptimizerKind kind :
         {OptimizerKind::kSgd, OptimizerKind::kAdagrad,
          OptimizerKind::kRowWiseAdagrad, OptimizerKind::kAdam,
          OptimizerKind::kAdamW}) {
      reg(UpdateKey(kind, 64, t), [=](benchmark::State& s) {
        BM_FusedUpdate(s, kind, 64, t);
      });
    }
  }
}

// Prints the ratios the targets are stated in, for what this run measured.
void PrintSummary() {
  const auto& r = Results();
  auto get = [&](const std::string& k) {
    auto it = r.find(k);
    return it == r.end() ? 0.0 : it->second;
  };
  const int all = ThreadPool::HardwareThreads();
  std::printf("\nSummary (%d hardware threads, %s vector path, table %.2f GiB)\n",
              all, CpuIsaName(BestCpuIsa()),
              static_cast<double>(g_table_bytes) / (1 << 30));
  for (int t : {1, all}) {
    const double mem = get(MemcpyKey(t));
    if (mem == 0) continue;
    std::printf("  memcpy t%d: %.2f GB/s\n", t, mem / 1e9);
    for (int pooling : {1, 32}) {
      const double fwd = get(ForwardKey(64, pooling, false, t));
      if (fwd > 0) {
        std::printf("  forward dim64 pool%-2d t%d: %6.2f GB/s = %.2f x memcpy%s\n",
                    pooling, t, fwd / 1e9, fwd / mem,
                    t == all ? (fwd / mem >= 0.4 ? "  [target 0.4: met]"
                                                 : "  [target 0.4: MISSED]")
                             : "");
      }
    }
    for (auto [features, pooling] : {std::pair{8, 1}, std::pair{8, 20}, std::pair{26, 1}}) {
      const double copy = get(TrainerKey(false, features, pooling, t));
      const double strided = get(TrainerKey(true, features, pooling, t));
      if (copy > 0 && strided > 0) {
        std::printf("  trainer embedding step F%d pool%d t%d: copy %.2f x memcpy, "
                    "strided %.2f x memcpy (%.2fx faster)\n",
                    features, pooling, t, copy / mem, strided / mem, strided / copy);
      }
    }
    if (const double square = Flops().count(SquareGemmKey(t)) ? Flops().at(SquareGemmKey(t)) : 0;
        square > 0) {
      std::printf("  sgemm 1024^3 t%d: %.1f GFLOP/s\n", t, square / 1e9);
      for (auto [features, batch] : {std::pair{8, 2048}, std::pair{8, 1024},
                                     std::pair{26, 4096}, std::pair{26, 2048}}) {
        const auto it = Flops().find(MlpGemmKey(features, batch, t));
        if (it == Flops().end()) continue;
        const double step_flops = [&] {
          double f = 0;
          for (const GemmShape& g : DlrmStepGemms(features, batch)) f += 2.0 * g.m * g.n * g.k;
          return f;
        }();
        std::printf("  DLRM step GEMMs F%d B%d t%d: %.1f GFLOP/s = %.2f x sgemm 1024^3, "
                    "%.1f ms per step = at most %.0f samples/s\n",
                    features, batch, t, it->second / 1e9, it->second / square,
                    1e3 * step_flops / it->second, batch * it->second / step_flops);
      }
    }
    const double fwd = get(ForwardKey(64, 32, false, t));
    const double ada = get(UpdateKey(OptimizerKind::kAdagrad, 64, t));
    if (fwd > 0 && ada > 0) {
      std::printf("  adagrad update dim64 t%d: %6.2f GB/s = %.2f x forward%s\n",
                  t, ada / 1e9, ada / fwd,
                  ada / fwd >= 0.5 ? "  [target 0.5: met]"
                                   : "  [target 0.5: MISSED]");
    }
  }
}

}  // namespace
}  // namespace recps::kernels

int main(int argc, char** argv) {
  // OpenBLAS's fastest kernels for this CPU, as recps-worker runs them
  // (BLAS_KERNELS=env: OpenBLAS's own choice).
  const char* blas_kernels = std::getenv("BLAS_KERNELS");
  if (absl::Status s = recps::kernels::UseFastestBlasKernels(
          blas_kernels != nullptr ? blas_kernels : "auto", argv);
      !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  benchmark::AddCustomContext("openblas_kernels", recps::kernels::BlasKernelsDescription());
  // Our own flag, removed before Google Benchmark parses the rest.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    const char* prefix = "--table_gib=";
    if (std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) {
      recps::kernels::g_table_bytes = static_cast<size_t>(
          std::atof(argv[i] + std::strlen(prefix)) * (1 << 30));
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  recps::kernels::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  recps::kernels::PrintSummary();
  return 0;
}
