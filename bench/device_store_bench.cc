// The device store's lookups and pushes against the GPU's physical anchor.
//
// Anchor (CUDA only): the store backend's row-gather kernel over batches of
// 64k random rows of a 1M x 64 table (16 disjoint batches per run, so the
// bytes touched outgrow L2), and the fused Adagrad update of those rows, vs
// a device-to-device cudaMemcpy of the gathered bytes, in the same run,
// one launch (one memcpy call) per batch as the store runs them (goals:
// gather >= 0.7 of memcpy, update >= 0.35); and all batches in one launch,
// which shows what a batch's launch costs both. Then the
// store itself (a fixed table of --rows rows of width 64, Adagrad): lookups
// and pushes of 4k, 16k and 64k distinct random ids through the
// EmbeddingStore interface (host ids in, host rows out: the copies to and
// from the GPU included), as ids/s and GB/s of rows.
//
//   recps_device_store_bench [--backend=cuda|cpu-twin] [--rows=1048576]
//       [--seconds_per_case=1] [--json=PATH]
// Without a GPU, --backend=cuda prints that it skips and exits 0 (1 when a
// GPU is installed but CUDA cannot initialise).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda_util.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/device_store/device_backend.h"
#include "server/store/device_store/device_store.h"
#include "server/store/embedding_store.h"

namespace recps {
namespace {

constexpr int kDim = 64;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

template <typename Fn>
double MedianSeconds(double seconds, Fn&& fn) {
  std::vector<double> times;
  const double start = Now();
  while (Now() - start < seconds || times.size() < 5) {
    const double t0 = Now();
    if (!fn()) return -1;
    times.push_back(Now() - t0);
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

bool Flag(const char* arg, const char* name, std::string* value) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *value = arg + n + 1;
  return true;
}

struct Flags {
  std::string backend = "cuda", json_path;
  int64_t rows = int64_t{1} << 20;
  double seconds = 1.0;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  std::string v;
  for (int i = 1; i < argc; ++i) {
    if (Flag(argv[i], "--backend", &v)) {
      f->backend = v;
    } else if (Flag(argv[i], "--rows", &v)) {
      f->rows = std::stoll(v);
    } else if (Flag(argv[i], "--seconds_per_case", &v)) {
      f->seconds = std::stod(v);
    } else if (Flag(argv[i], "--json", &v)) {
      f->json_path = v;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

#if defined(RECPS_HAVE_CUDA)
// The GPU's anchor: the backend's row gather and fused update against a
// device memcpy of the same bytes; prints it and adds its JSON fields.
bool MeasureAnchor(int64_t rows, std::vector<std::string>* json) {
  auto bw = server::device_store::MeasureGatherBandwidth(
      0, rows, kDim, std::min<int64_t>(65536, rows), 50);
  if (!bw.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", bw.status().ToString().c_str());
    return false;
  }
  std::printf("anchor (%lld batches of 64k rows, %.0f MiB moved per run, "
              "L2 %.0f MiB%s):\n",
              static_cast<long long>(bw->sets), bw->working_set_bytes / 1048576.0,
              bw->l2_bytes / 1048576.0,
              bw->working_set_bytes < 4 * bw->l2_bytes
                  ? "; NOT larger than the cache: raise --rows" : "");
  // The goals compare like with like: per 64k-row batch, one gather
  // launch (one update) against one memcpy call of the same bytes.
  std::printf("  per batch: gather %.1f GB/s, D2D memcpy %.1f GB/s, ratio "
              "%.2f (goal >= 0.70); fused Adagrad update %.1f GB/s, %.2f of "
              "memcpy (goal >= 0.35)\n",
              bw->gather_gbps, bw->memcpy_gbps,
              bw->gather_gbps / bw->memcpy_gbps, bw->update_gbps,
              bw->update_gbps / bw->memcpy_gbps);
  std::printf("  all %lld batches in one launch: gather %.1f GB/s, D2D memcpy "
              "in one call %.1f GB/s, ratio %.2f; a batch's launch costs the "
              "gather %.2f and the memcpy %.2f of its one-launch rate\n",
              static_cast<long long>(bw->sets), bw->one_launch_gather_gbps,
              bw->one_call_memcpy_gbps,
              bw->one_launch_gather_gbps / bw->one_call_memcpy_gbps,
              1 - bw->gather_gbps / bw->one_launch_gather_gbps,
              1 - bw->memcpy_gbps / bw->one_call_memcpy_gbps);
  json->push_back(absl::StrCat(
      "\"gather_gbps\": ", bw->gather_gbps, ", \"memcpy_gbps\": ",
      bw->memcpy_gbps, ", \"gather_vs_memcpy\": ",
      bw->gather_gbps / bw->memcpy_gbps, ", \"update_gbps\": ",
      bw->update_gbps, ", \"update_vs_memcpy\": ",
      bw->update_gbps / bw->memcpy_gbps,
      ", \"one_launch_gather_gbps\": ", bw->one_launch_gather_gbps,
      ", \"one_call_memcpy_gbps\": ", bw->one_call_memcpy_gbps,
      ", \"one_launch_gather_vs_memcpy\": ",
      bw->one_launch_gather_gbps / bw->one_call_memcpy_gbps,
      ", \"anchor_working_set_bytes\": ", bw->working_set_bytes,
      ", \"l2_bytes\": ", bw->l2_bytes));
  return true;
}
#endif

// The store under test: a fixed table of `rows` rows, Adagrad, every row
// created (lookups of the whole table). Null (said on stderr) on failure.
std::unique_ptr<server::EmbeddingStore> MakeFilledStore(const Flags& f, bool cuda) {
  config::TableSpec spec;
  spec.name = "t";
  spec.dim = kDim;
  spec.num_rows = f.rows;
  spec.optimizer.kind = OptimizerKind::kAdagrad;
  spec.optimizer.learning_rate = 0.01f;
  server::StoreOptions options;
  options.num_slots = 4096;
  options.device = cuda ? kernels::Device::kCuda : kernels::Device::kCpu;
  auto store = cuda ? server::CreateEmbeddingStore({spec}, options)
                    : server::CreateCpuTwinEmbeddingStore({spec}, options);
  if (!store.ok()) {
    std::fprintf(stderr, "FAIL: %s\n", store.status().ToString().c_str());
    return nullptr;
  }
  const int64_t batch = 65536;
  std::vector<int64_t> ids(batch);
  std::vector<float> out(batch * kDim);
  const double t0 = Now();
  for (int64_t lo = 0; lo < f.rows; lo += batch) {
    const int64_t n = std::min(batch, f.rows - lo);
    for (int64_t k = 0; k < n; ++k) ids[k] = lo + k;
    if (!(*store)->Lookup(0, absl::MakeSpan(ids.data(), n), out.data()).ok()) {
      std::fprintf(stderr, "FAIL: filling the table\n");
      return nullptr;
    }
  }
  std::printf("%s store: created %lld rows in %.2f s\n", f.backend.c_str(),
              static_cast<long long>(f.rows), Now() - t0);
  return *std::move(store);
}

// Lookups and pushes of `batch` distinct random ids (median seconds of
// each); prints the case and adds its JSON fields.
bool MeasureBatch(const Flags& f, server::EmbeddingStore& store, int64_t batch,
                  std::mt19937_64& rng, std::vector<std::string>* json) {
  // Distinct random ids.
  std::vector<int64_t> ids(f.rows);
  for (int64_t k = 0; k < f.rows; ++k) ids[k] = k;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(std::min(batch, f.rows));
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<float> out(n * kDim);
  std::vector<float> grads(n * kDim, 1e-3f);
  const double lookup = MedianSeconds(f.seconds, [&] {
    return store.Lookup(0, ids, out.data()).ok();
  });
  const double push = MedianSeconds(f.seconds, [&] {
    return store.ApplyGradients(0, ids, grads.data()).ok();
  });
  if (lookup < 0 || push < 0) {
    std::fprintf(stderr, "FAIL: a lookup or push failed\n");
    return false;
  }
  const double bytes = static_cast<double>(n) * kDim * sizeof(float);
  std::printf("%s store, %6lld ids: lookup %8.1f us (%6.1f M ids/s, "
              "%6.2f GB/s of rows), push %8.1f us (%6.1f M ids/s)\n",
              f.backend.c_str(), static_cast<long long>(n), lookup * 1e6,
              n / lookup / 1e6, bytes / lookup / 1e9, push * 1e6,
              n / push / 1e6);
  json->push_back(absl::StrCat(
      "\"lookup_", n, "_mids_per_s\": ", n / lookup / 1e6, ", \"lookup_", n,
      "_gbps\": ", bytes / lookup / 1e9, ", \"push_", n,
      "_mids_per_s\": ", n / push / 1e6));
  return true;
}

bool WriteJson(const Flags& f, const std::vector<std::string>& json) {
  std::ofstream out(f.json_path);
  out << "{\"backend\": \"" << f.backend << "\", \"rows\": " << f.rows << ", "
      << absl::StrJoin(json, ", ") << "}\n";
  if (!out) {
    std::fprintf(stderr, "FAIL: cannot write %s\n", f.json_path.c_str());
    return false;
  }
  return true;
}

int Main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) return 2;
  std::vector<std::string> json;
  const bool cuda = f.backend == "cuda";
  if (cuda) {
    const absl::StatusOr<int> gpus = kernels::CudaDeviceCount();
    if (!gpus.ok()) {
      std::fprintf(stderr, "FAIL: %s\n", gpus.status().ToString().c_str());
      return 1;
    }
    if (*gpus == 0) {
      std::printf("no CUDA GPU: skipping the device store benchmark\n");
      return 0;
    }
#if defined(RECPS_HAVE_CUDA)
    if (!MeasureAnchor(f.rows, &json)) return 1;
#endif
  } else if (f.backend != "cpu-twin") {
    std::fprintf(stderr, "--backend must be cuda or cpu-twin\n");
    return 2;
  }
  std::unique_ptr<server::EmbeddingStore> store = MakeFilledStore(f, cuda);
  if (store == nullptr) return 1;
  std::mt19937_64 rng(1);
  for (int64_t batch : {int64_t{4096}, int64_t{16384}, int64_t{65536}}) {
    if (!MeasureBatch(f, *store, batch, rng, &json)) return 1;
  }
  if (!f.json_path.empty() && !WriteJson(f, json)) return 1;
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
