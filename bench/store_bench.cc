// The host store's batched lookup against the memory system's floor.
//
// Fills a table of 1M rows of width 64 (256 MiB of weights, far beyond the
// L3 of these machines), then looks up batches of distinct random ids,
// on the calling thread and on a pool of all cores. Anchors measured in the
// same run: memcpy of the same bytes (sequential), and a bare gather of the
// same rows by row number with a software prefetch (no index, no locks):
// the best the store's probe loop could do. Prints ns per id, GB/s of rows
// and the ratios.
//
//   recps_store_bench [--seconds_per_case=1] [--rows=1048576]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/thread_pool.h"
#include "server/shard/embedding_store.h"

namespace recps {
namespace {

constexpr int kDim = 64;
constexpr size_t kRowBytes = kDim * sizeof(float);

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Median seconds of fn() over repeated calls for `seconds`; prepare() runs
// before each call, untimed.
template <typename Prepare, typename Fn>
double MedianSeconds(double seconds, Prepare&& prepare, Fn&& fn) {
  std::vector<double> times;
  const double start = Now();
  while (Now() - start < seconds || times.size() < 5) {
    prepare();
    const double t0 = Now();
    fn();
    times.push_back(Now() - t0);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

int Main(int argc, char** argv) {
  double seconds_per_case = 1.0;
  int64_t rows = int64_t{1} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--seconds_per_case=", 0) == 0) seconds_per_case = std::stod(a.substr(19));
    if (a.rfind("--rows=", 0) == 0) rows = std::stoll(a.substr(7));
  }
  ThreadPool pool;
  config::TableSpec spec;
  spec.name = "t";
  spec.dim = kDim;
  spec.optimizer.kind = kernels::OptimizerKind::kSgd;
  spec.optimizer.learning_rate = 0.01f;
  server::StoreOptions single;
  server::StoreOptions parallel;
  parallel.pool = &pool;
  auto store = server::CreateHostEmbeddingStore({spec}, single);
  auto pooled = server::CreateHostEmbeddingStore({spec}, parallel);
  if (!store.ok() || !pooled.ok()) {
    std::fprintf(stderr, "%s\n", (store.ok() ? pooled : store).status().ToString().c_str());
    return 1;
  }
  // Ids as the shard bench draws them: a shuffled id space, every row made.
  std::vector<int64_t> all(rows);
  for (int64_t i = 0; i < rows; ++i) all[i] = i * 0x9e3779b97f4a7c15LL;
  std::vector<float> out(size_t{65536} * kDim);
  for (int64_t lo = 0; lo < rows; lo += 65536) {
    const auto ids = absl::MakeConstSpan(all).subspan(lo, std::min<int64_t>(65536, rows - lo));
    if (!(*store)->Lookup(0, ids, out.data()).ok() ||
        !(*pooled)->Lookup(0, ids, out.data()).ok()) {
      std::fprintf(stderr, "fill failed\n");
      return 1;
    }
  }
  // The floor: the same number of random rows gathered from a plain array.
  absl::StatusOr<AlignedBuffer> plain =
      AlignedBuffer::Allocate(static_cast<size_t>(rows) * kRowBytes);
  if (!plain.ok()) {
    std::fprintf(stderr, "%s\n", plain.status().ToString().c_str());
    return 1;
  }
  float* base = plain->as<float>();
  std::fill(base, base + rows * kDim, 1.0f);

  std::printf("store lookup, %ld rows of %d floats (%.0f MiB), %d threads in the pool\n\n",
              static_cast<long>(rows), kDim, rows * kRowBytes / 1048576.0,
              pool.num_threads());
  std::printf("%6s %10s %10s %10s %10s %10s %12s %12s\n", "ids", "memcpy",
              "gather", "store 1t", "store pool", "1t/gather", "GB/s 1t",
              "GB/s pool");
  std::mt19937_64 rng(1);
  for (int64_t n : {int64_t{4096}, int64_t{16384}, int64_t{65536}}) {
    std::vector<int64_t> ids(n), rownums(n);
    auto draw = [&] {
      const int64_t start = static_cast<int64_t>(rng() % (rows - n));
      std::copy(all.begin() + start, all.begin() + start + n, ids.begin());
      for (int64_t k = 0; k < n; ++k) rownums[k] = static_cast<int64_t>(rng() % rows);
    };
    std::vector<float> src(n * kDim, 1.0f);
    const double memcpy_s = MedianSeconds(seconds_per_case, [] {}, [&] {
      std::memcpy(out.data(), src.data(), n * kRowBytes);
    });
    constexpr int kAhead = 16;
    const double gather_s = MedianSeconds(seconds_per_case, draw, [&] {
      for (int64_t k = 0; k < n; ++k) {
        if (k + kAhead < n) {
          const char* p = reinterpret_cast<const char*>(base + rownums[k + kAhead] * kDim);
          for (size_t o = 0; o < kRowBytes; o += 64) __builtin_prefetch(p + o);
        }
        std::memcpy(out.data() + k * kDim, base + rownums[k] * kDim, kRowBytes);
      }
    });
    const double one_s = MedianSeconds(seconds_per_case, draw, [&] {
      (void)(*store)->Lookup(0, ids, out.data());
    });
    const double pool_s = MedianSeconds(seconds_per_case, draw, [&] {
      (void)(*pooled)->Lookup(0, ids, out.data());
    });
    auto ns = [&](double s) { return s / n * 1e9; };
    std::printf("%6ld %8.1fns %8.1fns %8.1fns %8.1fns %10.2f %12.2f %12.2f\n",
                static_cast<long>(n), ns(memcpy_s), ns(gather_s), ns(one_s),
                ns(pool_s), one_s / gather_s, n * kRowBytes / one_s / 1e9,
                n * kRowBytes / pool_s / 1e9);
  }
  std::printf("\n(ns per id; median of repeated calls, ids drawn untimed)\n");
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
