// Checkpoint row files against the disk's floor.
//
// Fills a host store with `rows` rows of width 64 (SGD: 256 bytes a row,
// 1 GiB at the default 4M rows), writes them all to one row file
// (RowFileWriter: export, SST encoding, fsync, CRC pass) and compares with a
// plain sequential write of the same number of bytes followed by fdatasync
// on the same filesystem. Then drops both files from the page cache
// (posix_fadvise DONTNEED after the sync) and compares the restore
// (RowFileReader: CRC pass over the file, then the import into a fresh store,
// on one thread and on a pool of all cores)
// with a plain sequential read of the anchor file. Prints seconds, GB/s and
// the ratios (1.0 = as fast as the disk allows), and the stages alone
// (export, the file's iteration, the store's import) to see where the time
// goes.
//
//   recps_checkpoint_bench [--rows=4194304] [--dir=./checkpoint_bench.tmp]
//                          [--repeats=3]
#include <sys/resource.h>

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "common/malloc_tuning.h"
#include "common/thread_pool.h"
#include "server/checkpoint/row_file.h"
#include "server/checkpoint/store_rows.h"
#include "server/store/embedding_store.h"

namespace recps {
namespace {

constexpr int kDim = 64;
constexpr uint32_t kSlots = 4096;

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void DropCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

// Sequential write of `bytes` in 4 MiB writes, then fdatasync.
bool WriteAnchor(const std::string& path, uint64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  std::vector<char> buf(size_t{4} << 20, 'x');
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), bytes - done));
    const ssize_t put = write(fd, buf.data(), n);
    if (put <= 0) {
      close(fd);
      return false;
    }
    done += static_cast<uint64_t>(put);
  }
  const bool ok = fdatasync(fd) == 0;
  close(fd);
  return ok;
}

// Sequential read in 4 MiB reads; returns bytes read.
uint64_t ReadAnchor(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  std::vector<char> buf(size_t{4} << 20);
  uint64_t total = 0;
  ssize_t got;
  while ((got = read(fd, buf.data(), buf.size())) > 0) total += got;
  close(fd);
  return total;
}

// What the steps share: the flags, the filled source store and the files.
struct Bench {
  int64_t rows = int64_t{1} << 22;
  std::string dir = "checkpoint_bench.tmp";
  int repeats = 3;
  // --only_stall: only the snapshot stall (the push latency during a write).
  bool only_stall = false;
  config::TableSpec spec;
  server::StoreOptions options;
  std::unique_ptr<server::EmbeddingStore> source;
  std::vector<uint32_t> slots;
  std::string row_file, anchor;
  ThreadPool* pool = nullptr;  // made after the fill, as the steps use it
  absl::StatusOr<server::checkpoint::RowFileInfo> info;  // the last write's
};

// Each case's fastest run over the repeats, in seconds: other processes on
// the machine only ever make a run slower.
struct Times {
  double write_s = 1e30, anchor_write_s = 1e30, verify_s = 1e30,
         restore_s = 1e30, restore_pool_s = 1e30, anchor_read_s = 1e30,
         beside_s = 1e30, beside_pool_s = 1e30,
         import_mem_s = 1e30, import_mem_pool_s = 1e30, read_rows_s = 1e30,
         read_rows_pool_s = 1e30, export_s = 1e30, verify_pool_s = 1e30;
};

void ParseFlags(int argc, char** argv, Bench* b) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--rows=", 0) == 0) b->rows = std::stoll(a.substr(7));
    if (a.rfind("--dir=", 0) == 0) b->dir = a.substr(6);
    if (a.rfind("--repeats=", 0) == 0) b->repeats = std::max(1, std::stoi(a.substr(10)));
    if (a == "--only_stall") b->only_stall = true;
  }
}

// An empty store of the bench's table; exits on failure.
std::unique_ptr<server::EmbeddingStore> MakeStore(const Bench& b) {
  auto store = server::CreateHostEmbeddingStore({b.spec}, b.options);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(store);
}

// The table's spec and a source store holding `rows` rows (lookups create
// them), and the slot list every write and restore covers.
bool SetUp(Bench* b) {
  b->spec.name = "t";
  b->spec.dim = kDim;
  b->spec.optimizer.kind = OptimizerKind::kSgd;
  b->spec.optimizer.learning_rate = 0.01f;
  b->options.num_slots = kSlots;
  b->options.max_rows_per_table = b->rows + 1;
  b->source = MakeStore(*b);
  std::vector<int64_t> ids(65536);
  std::vector<float> out(ids.size() * kDim);
  for (int64_t lo = 0; lo < b->rows; lo += static_cast<int64_t>(ids.size())) {
    const int64_t n = std::min<int64_t>(ids.size(), b->rows - lo);
    for (int64_t i = 0; i < n; ++i) ids[i] = (lo + i) * 0x9e3779b97f4a7c15LL;
    if (!b->source->Lookup(0, absl::MakeConstSpan(ids).first(n), out.data()).ok()) {
      std::fprintf(stderr, "fill failed\n");
      return false;
    }
  }
  b->slots.resize(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) b->slots[s] = s;
  b->row_file = b->dir + "/shard-00000.sst";
  b->anchor = b->dir + "/anchor.bin";
  return true;
}

// One restore from disk (pages dropped) into a fresh store on pool `p`
// (null: one thread). `beside`: as RestoreChain does it, the CRC pass on a
// thread of its own beside the import (ImportRowFilesVerified); otherwise
// the CRC pass first (its seconds go into `*verify`, min), then the import.
double Restore(const Bench& b, ThreadPool* p, bool beside, double* verify) {
  using server::checkpoint::RowFileReader;
  std::unique_ptr<server::EmbeddingStore> target = MakeStore(b);
  DropCache(b.row_file);
  const double r0 = Now();
  auto reader = RowFileReader::Open(
      b.row_file, b.info->size_bytes, b.info->crc32c, p,
      beside ? RowFileReader::Verify::kLater : RowFileReader::Verify::kBeforeOpen);
  if (!beside) *verify = std::min(*verify, Now() - r0);
  server::checkpoint::ImportOptions import_options;
  import_options.pool = p;
  absl::StatusOr<int64_t> imported = absl::InternalError("not imported");
  if (!reader.ok()) {
    imported = reader.status();
  } else if (beside) {
    const RowFileReader* chain[] = {reader->get()};
    const std::vector<std::vector<uint32_t>> by_table(1, b.slots);
    imported = server::checkpoint::ImportRowFilesVerified(chain, *target, by_table,
                                                          import_options);
  } else {
    imported = server::checkpoint::ImportRowFile(**reader, *target, b.slots, import_options);
  }
  const double s = Now() - r0;
  if (!imported.ok() || *imported != b.rows) {
    std::fprintf(stderr, "restore failed: %s\n",
                 imported.ok() ? "row count" : imported.status().ToString().c_str());
    std::exit(1);
  }
  return s;
}

// Write: the row file (export, SST encoding, CRC, fsync) vs a plain
// sequential write of its size + fdatasync, on the same filesystem.
bool MeasureWrite(Bench* b, Times* t) {
  const double w0 = Now();
  b->info = server::checkpoint::RowFileWriter().Write(*b->source, b->slots, b->row_file);
  t->write_s = std::min(t->write_s, Now() - w0);
  if (!b->info.ok()) {
    std::fprintf(stderr, "%s\n", b->info.status().ToString().c_str());
    return false;
  }
  DropCache(b->row_file);
  const double a0 = Now();
  if (!WriteAnchor(b->anchor, b->info->size_bytes)) {
    std::fprintf(stderr, "anchor write to %s failed: %s\n", b->anchor.c_str(),
                 std::strerror(errno));
    return false;
  }
  t->anchor_write_s = std::min(t->anchor_write_s, Now() - a0);
  DropCache(b->anchor);
  std::error_code ec;
  std::filesystem::remove(b->anchor, ec);
  return true;
}

// Restore from disk (pages dropped): CRC pass + import into a fresh
// store, one thread and the pool; the anchor is a sequential read of the
// same file after its pages were dropped again.
void MeasureRestore(const Bench& b, Times* t) {
  t->restore_pool_s = std::min(t->restore_pool_s, Restore(b, b.pool, false, &t->verify_pool_s));
  t->restore_s = std::min(t->restore_s, Restore(b, nullptr, false, &t->verify_s));
  double unused = 0;
  t->beside_pool_s = std::min(t->beside_pool_s, Restore(b, b.pool, true, &unused));
  t->beside_s = std::min(t->beside_s, Restore(b, nullptr, true, &unused));
  DropCache(b.row_file);
  const double s0 = Now();
  ReadAnchor(b.row_file);
  t->anchor_read_s = std::min(t->anchor_read_s, Now() - s0);
}

// The store's own cost: the same rows exported and imported from memory
// into a fresh store (ImportRows creating every row), one thread.
bool MeasureImportFromMemory(const Bench& b, server::SlotChunk* chunk, Times* t) {
  std::unique_ptr<server::EmbeddingStore> target = MakeStore(b);
  double import_s = 0;
  for (uint32_t slot : b.slots) {
    server::SlotCursor cursor;
    while (!cursor.done) {
      if (!b.source->ExportSlot(0, slot, &cursor, 4096, chunk).ok()) return false;
      const double t0 = Now();
      if (!target->ImportRows(0, slot, chunk->ids, chunk->rows.data()).ok()) return false;
      import_s += Now() - t0;
    }
  }
  t->import_mem_s = std::min(t->import_mem_s, import_s);
  // Freed first, so the pool's import below gets memory of the same kind
  // (recently used; fresh guest memory costs far more to fault in on a VM).
  target.reset();
  return true;
}

// Export alone: every chunk of every slot copied out of the store.
bool MeasureExport(const Bench& b, server::SlotChunk* chunk, Times* t) {
  const double e0 = Now();
  for (uint32_t slot : b.slots) {
    server::SlotCursor cursor;
    while (!cursor.done) {
      if (!b.source->ExportSlot(0, slot, &cursor, 4096, chunk).ok()) return false;
    }
  }
  t->export_s = std::min(t->export_s, Now() - e0);
  return true;
}

// The row file's iteration alone (page cache, no store), 1t and pool.
bool MeasureReadRows(const Bench& b, Times* t) {
  auto reader = server::checkpoint::RowFileReader::Open(
      b.row_file, b.info->size_bytes, b.info->crc32c);
  if (!reader.ok()) return false;
  const v1::CheckpointTable& table = (*reader)->header().tables(0);
  std::atomic<int64_t> seen{0};
  auto count = [&](uint32_t, absl::Span<const int64_t> ids, const float*) {
    seen.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
    return absl::OkStatus();
  };
  const double q0 = Now();
  if (!(*reader)->ReadSlots(table, b.slots, 4096, count).ok()) return false;
  t->read_rows_s = std::min(t->read_rows_s, Now() - q0);
  const double q1 = Now();
  ThreadPool& pool = *b.pool;
  const int64_t per = (kSlots + pool.num_threads() - 1) / pool.num_threads();
  pool.ParallelFor(kSlots, per, [&](int64_t lo, int64_t hi) {
    (*reader)->ReadSlots(table, absl::MakeConstSpan(b.slots).subspan(lo, hi - lo),
                         4096, count).IgnoreError();
  });
  t->read_rows_pool_s = std::min(t->read_rows_pool_s, Now() - q1);
  return true;
}

// The store's import from memory on the pool (slot ranges in parallel).
bool MeasureImportPool(const Bench& b, Times* t) {
  std::unique_ptr<server::EmbeddingStore> fresh = MakeStore(b);
  std::vector<server::SlotChunk> chunks(kSlots);
  for (uint32_t slot : b.slots) {
    server::SlotCursor cursor;
    if (!b.source->ExportSlot(0, slot, &cursor, int64_t{1} << 30, &chunks[slot]).ok()) return false;
  }
  // One contiguous run of slots per thread, as ImportRowFile splits them.
  const double i0 = Now();
  ThreadPool& pool = *b.pool;
  const int64_t per = (kSlots + pool.num_threads() - 1) / pool.num_threads();
  pool.ParallelFor(kSlots, per, [&](int64_t lo, int64_t hi) {
    for (int64_t s = lo; s < hi; ++s) {
      fresh->ImportRows(0, static_cast<uint32_t>(s), chunks[s].ids,
                        chunks[s].rows.data()).IgnoreError();
    }
  });
  t->import_mem_pool_s = std::min(t->import_mem_pool_s, Now() - i0);
  return true;
}

// One repeat of every case, in the original order (the cases interleave
// across repeats, so the machine's drift touches each alike).
bool RunRepeat(Bench* b, Times* t) {
  if (!MeasureWrite(b, t)) return false;
  MeasureRestore(*b, t);
  // One chunk for the repeat: the export stage reuses the buffers that the
  // import grew, so it times the copy, not their allocation.
  server::SlotChunk chunk;
  if (!MeasureImportFromMemory(*b, &chunk, t)) return false;
  // Stages, to see where the time goes (compare within one run: the
  // machine's load moves every figure between runs).
  return MeasureExport(*b, &chunk, t) && MeasureReadRows(*b, t) &&
         MeasureImportPool(*b, t);
}

void PrintReport(const Bench& b, const Times& t) {
  const double payload = static_cast<double>(b.rows) * kDim * sizeof(float);
  const double file = static_cast<double>(b.info->size_bytes);
  std::printf("checkpoint row file, %ld rows of %d floats (%.0f MiB of rows, "
              "file %.0f MiB) in %s, pool of %d threads, best of %d\n\n",
              static_cast<long>(b.rows), kDim, payload / 1048576.0,
              file / 1048576.0, b.dir.c_str(), b.pool->num_threads(), b.repeats);
  std::printf("%-40s %8s %10s\n", "case", "seconds", "GB/s file");
  auto row = [&](const char* name, double s) {
    std::printf("%-40s %8.3f %10.2f\n", name, s, file / s / 1e9);
  };
  row("write: RowFileWriter (fsync, CRC)", t.write_s);
  row("write: sequential + fdatasync", t.anchor_write_s);
  row("restore 1t: CRC pass (from disk)", t.verify_s);
  row("restore 1t: CRC, then import", t.restore_s);
  row("restore 1t: CRC beside the import", t.beside_s);
  row("restore pool: CRC pass (from disk)", t.verify_pool_s);
  row("restore pool: CRC, then import", t.restore_pool_s);
  row("restore pool: CRC beside the import", t.beside_pool_s);
  row("read: sequential (from disk)", t.anchor_read_s);
  row("store floor: ImportRows from memory, 1t", t.import_mem_s);
  row("store floor: ImportRows from memory, pool", t.import_mem_pool_s);
  row("stage: ExportSlot only, 1t", t.export_s);
  row("stage: ReadSlots only (page cache), 1t", t.read_rows_s);
  row("stage: ReadSlots only (page cache), pool", t.read_rows_pool_s);
  std::printf("\nwrite ratio (sequential write / RowFileWriter): %.2f\n",
              t.anchor_write_s / t.write_s);
  std::printf("restore ratio, 1 thread (sequential read / restore): %.2f; "
              "CRC beside the import: %.2f\n",
              t.anchor_read_s / t.restore_s, t.anchor_read_s / t.beside_s);
  std::printf("restore ratio, pool (sequential read / restore): %.2f; "
              "CRC beside the import (the servers' restore): %.2f\n",
              t.anchor_read_s / t.restore_pool_s, t.anchor_read_s / t.beside_pool_s);
  std::printf("restore 1t vs its floor (read + store import, serial): %.2f\n",
              (t.anchor_read_s + t.import_mem_s) / t.restore_s);
}

// Snapshot stall: push latency (ApplyGradients of 4096 random existing
// rows, as one sync step of a worker) outside a checkpoint, then while a
// snapshot's row file is written in the background (copy-on-write).
double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min<size_t>(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

bool MeasureSnapshotStall(const Bench& b) {
  server::EmbeddingStore* source = b.source.get();
  std::vector<int64_t> push_ids(4096);
  std::vector<float> grads(push_ids.size() * kDim, 0.001f);
  uint64_t x = 12345;
  long last_push_faults = 0;  // minor page faults of the latest push
  auto one_push = [&]() {
    for (int64_t& id : push_ids) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      id = static_cast<int64_t>((x >> 17) % static_cast<uint64_t>(b.rows)) *
           0x9e3779b97f4a7c15LL;
    }
    // Ids must be distinct: collisions are rare, remove them.
    std::sort(push_ids.begin(), push_ids.end());
    push_ids.erase(std::unique(push_ids.begin(), push_ids.end()), push_ids.end());
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    const double t0 = Now();
    if (!source->ApplyGradients(0, push_ids, grads.data()).ok()) std::exit(1);
    const double took = Now() - t0;
    getrusage(RUSAGE_THREAD, &r1);
    last_push_faults = r1.ru_minflt - r0.ru_minflt;
    push_ids.resize(4096);
    return took;
  };
  auto stats = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return std::make_pair(v[v.size() / 2], v.back());
  };
  std::vector<double> outside;
  for (int i = 0; i < 200; ++i) outside.push_back(one_push());
  const double s0 = Now();
  if (!source->BeginSnapshot(1).ok()) return false;
  const double stall = Now() - s0;
  std::atomic<bool> writing{true};
  double snapshot_write_s = 0;
  std::thread writer([&] {
    const double w0 = Now();
    auto w = server::checkpoint::RowFileWriter().WriteSnapshot(
        *source, /*since_generation=*/0, b.slots, b.row_file);
    snapshot_write_s = Now() - w0;
    if (!w.ok()) std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    writing = false;
  });
  std::vector<double> during;
  double worst = 0, worst_at = 0;  // the slowest push, and when it began
  long worst_faults = 0;
  while (writing.load()) {
    const double at = Now() - s0;
    during.push_back(one_push());
    if (during.back() > worst) {
      std::tie(worst, worst_at) = std::make_pair(during.back(), at);
      worst_faults = last_push_faults;
    }
  }
  writer.join();
  const int64_t pre_bytes = source->SnapshotBytes();
  source->EndSnapshot();
  const auto [p50_out, max_out] = stats(outside);
  const auto [p50_in, max_in] = stats(during);
  std::printf("\nsnapshot stall (BeginSnapshot: the pre-image index committed, then every "
              "stripe held for the cut): %.3f ms\n",
              stall * 1e3);
  std::printf("push of 4096 rows, outside a checkpoint: p50 %.3f ms, max %.3f ms (%zu pushes)\n",
              p50_out * 1e3, max_out * 1e3, outside.size());
  std::printf("push of 4096 rows, during the snapshot write (%.2f s): p50 %.3f ms, max %.3f ms (%zu pushes); rows copied aside: %.0f MiB\n",
              snapshot_write_s, p50_in * 1e3, max_in * 1e3, during.size(),
              pre_bytes / 1048576.0);
  std::printf("slowest push began %.2f s into the write (%ld minor page faults in it); "
              "p99 during: %.3f ms\n",
              worst_at, worst_faults, Percentile(during, 0.99) * 1e3);
  std::printf("max push during / p50 outside: %.2f (goal <= 2)\n", max_in / p50_out);
  return true;
}

int Main(int argc, char** argv) {
  // As the shard server that will restore runs (server/shard/shard_main.cc).
  TuneDataPlaneProcess();
  Bench b;
  ParseFlags(argc, argv, &b);
  std::error_code ec;
  std::filesystem::create_directories(b.dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", b.dir.c_str(), ec.message().c_str());
    return 1;
  }
  if (!SetUp(&b)) return 1;
  ThreadPool pool;
  b.pool = &pool;
  Times t;
  for (int rep = 0; rep < b.repeats && !b.only_stall; ++rep) {
    if (!RunRepeat(&b, &t)) return 1;
  }
  if (!b.only_stall) PrintReport(b, t);
  if (!MeasureSnapshotStall(b)) return 1;
  std::filesystem::remove(b.row_file, ec);
  std::filesystem::remove(b.anchor, ec);
  std::filesystem::remove(b.dir, ec);
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
