// The host store's batched lookup against the memory system's floor.
//
// Fills a table of 1M rows of width 64 (256 MiB of weights, far beyond the
// L3 of these machines), then looks up batches of distinct random ids,
// on the calling thread and on a pool of all cores. Anchors measured in the
// same run: memcpy of the same bytes (sequential), and a bare gather of the
// same rows by row number with a software prefetch (no index, no locks):
// the best the store's probe loop could do. Prints ns per id, GB/s of rows
// and the ratios. Then the slot transfer of the same table (4096 slots):
// exporting every slot in chunks, importing them into a fresh store, and
// dropping half the slots (compaction and memory returned).
//
//   recps_store_bench [--seconds_per_case=1] [--rows=1048576]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "common/aligned_buffer.h"
#include "common/thread_pool.h"
#include "server/store/embedding_store.h"

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

int Transfer(server::EmbeddingStore& store, const config::TableSpec& spec,
             const server::StoreOptions& options, int64_t rows);

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
  spec.optimizer.kind = OptimizerKind::kSgd;
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
  const double fill_start = Now();
  for (int64_t lo = 0; lo < rows; lo += 65536) {
    const auto ids = absl::MakeConstSpan(all).subspan(lo, std::min<int64_t>(65536, rows - lo));
    if (!(*store)->Lookup(0, ids, out.data()).ok() ||
        !(*pooled)->Lookup(0, ids, out.data()).ok()) {
      std::fprintf(stderr, "fill failed\n");
      return 1;
    }
  }
  // Both stores filled: the creation cost per row, twice.
  const double fill_s = Now() - fill_start;
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
  std::printf("fill (rows created by lookups): %.1f ns per row\n\n",
              fill_s / (2.0 * rows) * 1e9);
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

  // A push as the shard server runs it once the request is decoded
  // (validate, then apply on the pool), with no RPC: the in-process bound
  // that recps_shard_bench's push over loopback compares with (same table,
  // optimizer, id space and draw).
  std::printf("\nin-process push (ValidateGradients + ApplyGradients, pool), "
              "SGD dim %d\n%6s %10s %12s\n", kDim, "ids", "ms", "GB/s grads");
  for (int64_t n : {int64_t{4096}, int64_t{16384}, int64_t{65536}}) {
    std::vector<int64_t> ids(n);
    std::vector<float> grads(n * kDim, 1e-4f);
    auto draw = [&] {
      const int64_t start = static_cast<int64_t>(rng() % (rows - n));
      std::copy(all.begin() + start, all.begin() + start + n, ids.begin());
    };
    const double push_s = MedianSeconds(seconds_per_case, draw, [&] {
      if ((*pooled)->ValidateGradients(0, ids, grads.data()).ok()) {
        (void)(*pooled)->ApplyGradients(0, ids, grads.data());
      }
    });
    std::printf("%6ld %10.2f %12.2f\n", static_cast<long>(n), push_s * 1e3,
                n * kRowBytes / push_s / 1e9);
  }
  return Transfer(**store, spec, single, rows);
}

int64_t ResidentBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  const int n = std::fscanf(f, "%ld %ld", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

// Slot transfer of the filled table: export all slots, import them into a
// fresh store, drop every other slot of the copy.
int Transfer(server::EmbeddingStore& store, const config::TableSpec& spec,
             const server::StoreOptions& options, int64_t rows) {
  auto copy = server::CreateHostEmbeddingStore({spec}, options);
  if (!copy.ok()) {
    std::fprintf(stderr, "%s\n", copy.status().ToString().c_str());
    return 1;
  }
  const double mib = rows * kRowBytes / 1048576.0;
  std::printf("\nslot transfer, %u slots, chunks of 4096 rows\n",
              options.num_slots);
  // Twice: the first import creates the rows (index growth, first touch of
  // the arena's pages), the second overwrites them.
  for (const char* what : {"creates", "overwrites"}) {
    double export_s = 0, import_s = 0;
    int64_t moved = 0;
    server::SlotChunk chunk;
    for (uint32_t slot = 0; slot < options.num_slots; ++slot) {
      server::SlotCursor cursor;
      while (!cursor.done) {
        double t0 = Now();
        absl::Status s = store.ExportSlot(0, slot, &cursor, 4096, &chunk);
        export_s += Now() - t0;
        t0 = Now();
        if (s.ok()) {
          s = (*copy)->ImportRows(0, slot, chunk.ids, chunk.rows.data());
        }
        import_s += Now() - t0;
        if (!s.ok()) {
          std::fprintf(stderr, "slot %u: %s\n", slot, s.ToString().c_str());
          return 1;
        }
        moved += static_cast<int64_t>(chunk.ids.size());
      }
    }
    std::printf("export %ld rows: %.1f ms (%.2f GB/s); import (%s): %.1f ms "
                "(%.2f GB/s)\n",
                static_cast<long>(moved), export_s * 1e3,
                moved * kRowBytes / export_s / 1e9, what, import_s * 1e3,
                moved * kRowBytes / import_s / 1e9);
  }
  const int64_t rss_before = ResidentBytes();
  double drop_s = 0, worst_s = 0;
  int64_t dropped = 0;
  for (uint32_t slot = 0; slot < options.num_slots; slot += 2) {
    const double t0 = Now();
    absl::StatusOr<int64_t> n = (*copy)->DropSlot(0, slot);
    const double took = Now() - t0;
    if (!n.ok()) {
      std::fprintf(stderr, "drop %u: %s\n", slot,
                   n.status().ToString().c_str());
      return 1;
    }
    drop_s += took;
    worst_s = std::max(worst_s, took);
    dropped += *n;
  }
  const int64_t rss_after = ResidentBytes();
  std::printf("drop every other slot (%ld rows, %.0f of %.0f MiB): %.1f ms in "
              "all, %.2f ms the longest (the table blocked); RSS %.0f -> "
              "%.0f MiB\n",
              static_cast<long>(dropped), dropped * kRowBytes / 1048576.0, mib,
              drop_s * 1e3, worst_s * 1e3, rss_before / 1048576.0,
              rss_after / 1048576.0);
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
