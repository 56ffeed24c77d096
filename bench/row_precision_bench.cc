// The host store's lookups and pushes with fp16 / bf16 rows against fp32
// rows, in one run (the ratio is what to read on a loaded machine): one
// table per precision, same ids, same gradients, interleaved cases.
//
//   recps_row_precision_bench [--rows=1048576] [--dim=64] [--ids=16384]
//       [--seconds_per_case=1] [--optimizer=sgd|rowwise_adagrad|adagrad|adam]
//       [--stochastic_rounding] (the 16-bit tables round stochastically)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/embedding_store.h"

namespace recps {
namespace {

using ::recps::RowPrecision;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median seconds of fn(); draw() runs before each call, untimed.
template <typename Draw, typename Fn>
double MedianSeconds(double seconds, Draw&& draw, Fn&& fn) {
  std::vector<double> times;
  const double start = Now();
  while (Now() - start < seconds || times.size() < 5) {
    draw();
    const double t0 = Now();
    fn();
    times.push_back(Now() - t0);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

int Main(int argc, char** argv) {
  int64_t rows = int64_t{1} << 20;
  int dim = 64;
  int64_t n = 16384;
  double seconds = 1.0;
  std::string optimizer = "sgd";
  bool stochastic = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const std::string f = std::string(flag) + "=";
      return a.rfind(f, 0) == 0 ? argv[i] + f.size() : nullptr;
    };
    if (const char* v = value("--rows")) rows = std::stoll(v);
    else if (const char* v = value("--dim")) dim = std::stoi(v);
    else if (const char* v = value("--ids")) n = std::stoll(v);
    else if (const char* v = value("--seconds_per_case")) seconds = std::stod(v);
    else if (const char* v = value("--optimizer")) optimizer = v;
    else if (a == "--stochastic_rounding") stochastic = true;
    else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  OptimizerKind kind = OptimizerKind::kSgd;
  if (optimizer == "rowwise_adagrad") kind = OptimizerKind::kRowWiseAdagrad;
  else if (optimizer == "adagrad") kind = OptimizerKind::kAdagrad;
  else if (optimizer == "adam") kind = OptimizerKind::kAdam;
  else if (optimizer != "sgd") {
    std::fprintf(stderr, "--optimizer: unknown %s\n", optimizer.c_str());
    return 2;
  }
  ThreadPool pool;
  server::StoreOptions options;
  options.pool = &pool;
  const RowPrecision precisions[] = {RowPrecision::kFp32, RowPrecision::kFp16,
                                     RowPrecision::kBf16};
  std::vector<std::unique_ptr<server::EmbeddingStore>> stores;
  for (RowPrecision p : precisions) {
    config::TableSpec spec;
    spec.name = "t";
    spec.dim = dim;
    spec.optimizer.kind = kind;
    spec.optimizer.learning_rate = 0.01f;
    spec.precision = p;
    spec.stochastic_rounding = stochastic && p != RowPrecision::kFp32;
    auto store = server::CreateHostEmbeddingStore({spec}, options);
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
      return 1;
    }
    stores.push_back(*std::move(store));
  }
  std::vector<int64_t> all(rows);
  for (int64_t i = 0; i < rows; ++i) all[i] = i * 0x9e3779b97f4a7c15LL;
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(n, 65536)) * dim);
  for (auto& store : stores) {
    for (int64_t lo = 0; lo < rows; lo += 65536) {
      const auto ids =
          absl::MakeConstSpan(all).subspan(lo, std::min<int64_t>(65536, rows - lo));
      if (!store->Lookup(0, ids, out.data()).ok()) return 1;
    }
  }
  std::printf("host store, %ld rows of dim %d, %s, batches of %ld distinct ids, "
              "%d threads%s\n\n",
              static_cast<long>(rows), dim, optimizer.c_str(), static_cast<long>(n),
              pool.num_threads(),
              stochastic ? ", 16-bit tables round stochastically" : "");
  std::printf("%6s %10s %12s %12s %12s %12s\n", "rows", "row bytes",
              "lookup ns/id", "vs fp32", "push ns/id", "vs fp32");
  std::mt19937_64 rng(1);
  std::vector<int64_t> ids(n);
  std::vector<float> grads(n * dim, 1e-3f);
  auto draw = [&] {
    const int64_t start = static_cast<int64_t>(rng() % (rows - n));
    std::copy(all.begin() + start, all.begin() + start + n, ids.begin());
  };
  // Three rounds of all precisions interleaved; the best round of each.
  double lookup[3] = {1e9, 1e9, 1e9}, push[3] = {1e9, 1e9, 1e9};
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 3; ++k) {
      server::EmbeddingStore& s = *stores[k];
      lookup[k] = std::min(lookup[k], MedianSeconds(seconds / 3, draw, [&] {
                             (void)s.Lookup(0, ids, out.data());
                           }));
      push[k] = std::min(push[k], MedianSeconds(seconds / 3, draw, [&] {
                           if (s.ValidateGradients(0, ids, grads.data()).ok()) {
                             (void)s.ApplyGradients(0, ids, grads.data());
                           }
                         }));
    }
  }
  for (int k = 0; k < 3; ++k) {
    std::printf("%6s %10ld %12.1f %12.2f %12.1f %12.2f\n",
                RowPrecisionName(precisions[k]),
                static_cast<long>(stores[k]->Info(0).row_bytes),
                lookup[k] / n * 1e9, lookup[k] / lookup[0], push[k] / n * 1e9,
                push[k] / push[0]);
  }
  std::printf("\n(best of 3 interleaved rounds of the median call; vs fp32 < 1 "
              "is faster)\n");
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
