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

int Main(int argc, char** argv) {
  // As the shard server that will restore runs (server/shard/shard_main.cc).
  TuneDataPlaneProcess();
  int64_t rows = int64_t{1} << 22;
  std::string dir = "checkpoint_bench.tmp";
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--rows=", 0) == 0) rows = std::stoll(a.substr(7));
    if (a.rfind("--dir=", 0) == 0) dir = a.substr(6);
    if (a.rfind("--repeats=", 0) == 0) repeats = std::max(1, std::stoi(a.substr(10)));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }
  config::TableSpec spec;
  spec.name = "t";
  spec.dim = kDim;
  spec.optimizer.kind = kernels::OptimizerKind::kSgd;
  spec.optimizer.learning_rate = 0.01f;
  server::StoreOptions options;
  options.num_slots = kSlots;
  options.max_rows_per_table = rows + 1;
  auto make_store = [&]() -> std::unique_ptr<server::EmbeddingStore> {
    auto store = server::CreateHostEmbeddingStore({spec}, options);
    if (!store.ok()) {
      std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
      std::exit(1);
    }
    return *std::move(store);
  };
  std::unique_ptr<server::EmbeddingStore> source = make_store();
  std::vector<int64_t> ids(65536);
  std::vector<float> out(ids.size() * kDim);
  for (int64_t lo = 0; lo < rows; lo += static_cast<int64_t>(ids.size())) {
    const int64_t n = std::min<int64_t>(ids.size(), rows - lo);
    for (int64_t i = 0; i < n; ++i) ids[i] = (lo + i) * 0x9e3779b97f4a7c15LL;
    if (!source->Lookup(0, absl::MakeConstSpan(ids).first(n), out.data()).ok()) {
      std::fprintf(stderr, "fill failed\n");
      return 1;
    }
  }
  std::vector<uint32_t> slots(kSlots);
  for (uint32_t s = 0; s < kSlots; ++s) slots[s] = s;
  const std::string row_file = dir + "/shard-00000.sst";
  const std::string anchor = dir + "/anchor.bin";
  const double payload = static_cast<double>(rows) * kDim * sizeof(float);
  ThreadPool pool;

  // Each case runs `repeats` times, interleaved, and its fastest run counts:
  // other processes on the machine only ever make a run slower.
  double write_s = 1e30, anchor_write_s = 1e30, verify_s = 1e30,
         restore_s = 1e30, restore_pool_s = 1e30, anchor_read_s = 1e30,
         import_mem_s = 1e30, import_mem_pool_s = 1e30, read_rows_s = 1e30,
         read_rows_pool_s = 1e30, export_s = 1e30, verify_pool_s = 1e30;
  absl::StatusOr<server::checkpoint::RowFileInfo> info;
  auto restore = [&](ThreadPool* p, double* verify) {
    std::unique_ptr<server::EmbeddingStore> target = make_store();
    DropCache(row_file);
    const double r0 = Now();
    auto reader = server::checkpoint::RowFileReader::Open(
        row_file, info->size_bytes, info->crc32c, p);
    *verify = std::min(*verify, Now() - r0);
    server::checkpoint::ImportOptions import_options;
    import_options.pool = p;
    absl::StatusOr<int64_t> imported =
        reader.ok() ? server::checkpoint::ImportRowFile(**reader, *target, slots, import_options)
                    : reader.status();
    const double s = Now() - r0;
    if (!imported.ok() || *imported != rows) {
      std::fprintf(stderr, "restore failed: %s\n",
                   imported.ok() ? "row count" : imported.status().ToString().c_str());
      std::exit(1);
    }
    return s;
  };
  for (int rep = 0; rep < repeats; ++rep) {
    // Write: the row file (export, SST encoding, CRC, fsync) vs a plain
    // sequential write of its size + fdatasync, on the same filesystem.
    const double w0 = Now();
    info = server::checkpoint::RowFileWriter().Write(*source, slots, row_file);
    write_s = std::min(write_s, Now() - w0);
    if (!info.ok()) {
      std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
      return 1;
    }
    DropCache(row_file);
    const double a0 = Now();
    if (!WriteAnchor(anchor, info->size_bytes)) {
      std::fprintf(stderr, "anchor write to %s failed: %s\n", anchor.c_str(),
                   std::strerror(errno));
      return 1;
    }
    anchor_write_s = std::min(anchor_write_s, Now() - a0);
    DropCache(anchor);
    std::filesystem::remove(anchor, ec);

    // Restore from disk (pages dropped): CRC pass + import into a fresh
    // store, one thread and the pool; the anchor is a sequential read of the
    // same file after its pages were dropped again.
    restore_pool_s = std::min(restore_pool_s, restore(&pool, &verify_pool_s));
    restore_s = std::min(restore_s, restore(nullptr, &verify_s));
    DropCache(row_file);
    const double s0 = Now();
    ReadAnchor(row_file);
    anchor_read_s = std::min(anchor_read_s, Now() - s0);

    // The store's own cost: the same rows exported and imported from memory
    // into a fresh store (ImportRows creating every row), one thread.
    std::unique_ptr<server::EmbeddingStore> target = make_store();
    server::SlotChunk chunk;
    double import_s = 0;
    for (uint32_t slot : slots) {
      server::SlotCursor cursor;
      while (!cursor.done) {
        if (!source->ExportSlot(0, slot, &cursor, 4096, &chunk).ok()) return 1;
        const double t0 = Now();
        if (!target->ImportRows(0, slot, chunk.ids, chunk.rows.data()).ok()) return 1;
        import_s += Now() - t0;
      }
    }
    import_mem_s = std::min(import_mem_s, import_s);
    // Freed first, so the pool's import below gets memory of the same kind
    // (recently used; fresh guest memory costs far more to fault in on a VM).
    target.reset();

    // Stages, to see where the time goes (compare within one run: the
    // machine's load moves every figure between runs).
    // Export alone: every chunk of every slot copied out of the store.
    {
      const double e0 = Now();
      for (uint32_t slot : slots) {
        server::SlotCursor cursor;
        while (!cursor.done) {
          if (!source->ExportSlot(0, slot, &cursor, 4096, &chunk).ok()) return 1;
        }
      }
      export_s = std::min(export_s, Now() - e0);
    }
    // The row file's iteration alone (page cache, no store), 1t and pool.
    {
      auto reader = server::checkpoint::RowFileReader::Open(
          row_file, info->size_bytes, info->crc32c);
      if (!reader.ok()) return 1;
      const v1::CheckpointTable& table = (*reader)->header().tables(0);
      std::atomic<int64_t> seen{0};
      auto count = [&](uint32_t, absl::Span<const int64_t> ids, const float*) {
        seen.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
        return absl::OkStatus();
      };
      const double q0 = Now();
      if (!(*reader)->ReadSlots(table, slots, 4096, count).ok()) return 1;
      read_rows_s = std::min(read_rows_s, Now() - q0);
      const double q1 = Now();
      const int64_t per = (kSlots + pool.num_threads() - 1) / pool.num_threads();
      pool.ParallelFor(kSlots, per, [&](int64_t b, int64_t e) {
        (*reader)->ReadSlots(table, absl::MakeConstSpan(slots).subspan(b, e - b),
                             4096, count).IgnoreError();
      });
      read_rows_pool_s = std::min(read_rows_pool_s, Now() - q1);
    }
    // The store's import from memory on the pool (slot ranges in parallel).
    {
      std::unique_ptr<server::EmbeddingStore> fresh = make_store();
      std::vector<server::SlotChunk> chunks(kSlots);
      for (uint32_t slot : slots) {
        server::SlotCursor cursor;
        if (!source->ExportSlot(0, slot, &cursor, int64_t{1} << 30, &chunks[slot]).ok()) return 1;
      }
      // One contiguous run of slots per thread, as ImportRowFile splits them.
      const double i0 = Now();
      const int64_t per = (kSlots + pool.num_threads() - 1) / pool.num_threads();
      pool.ParallelFor(kSlots, per, [&](int64_t b, int64_t e) {
        for (int64_t s = b; s < e; ++s) {
          fresh->ImportRows(0, static_cast<uint32_t>(s), chunks[s].ids,
                            chunks[s].rows.data()).IgnoreError();
        }
      });
      import_mem_pool_s = std::min(import_mem_pool_s, Now() - i0);
    }
  }

  const double file = static_cast<double>(info->size_bytes);
  std::printf("checkpoint row file, %ld rows of %d floats (%.0f MiB of rows, "
              "file %.0f MiB) in %s, pool of %d threads, best of %d\n\n",
              static_cast<long>(rows), kDim, payload / 1048576.0,
              file / 1048576.0, dir.c_str(), pool.num_threads(), repeats);
  std::printf("%-40s %8s %10s\n", "case", "seconds", "GB/s file");
  auto row = [&](const char* name, double s) {
    std::printf("%-40s %8.3f %10.2f\n", name, s, file / s / 1e9);
  };
  row("write: RowFileWriter (fsync, CRC)", write_s);
  row("write: sequential + fdatasync", anchor_write_s);
  row("restore 1t: CRC pass (from disk)", verify_s);
  row("restore 1t: CRC + import", restore_s);
  row("restore pool: CRC pass (from disk)", verify_pool_s);
  row("restore pool: CRC + import", restore_pool_s);
  row("read: sequential (from disk)", anchor_read_s);
  row("store floor: ImportRows from memory, 1t", import_mem_s);
  row("store floor: ImportRows from memory, pool", import_mem_pool_s);
  row("stage: ExportSlot only, 1t", export_s);
  row("stage: ReadSlots only (page cache), 1t", read_rows_s);
  row("stage: ReadSlots only (page cache), pool", read_rows_pool_s);
  std::printf("\nwrite ratio (sequential write / RowFileWriter): %.2f\n",
              anchor_write_s / write_s);
  std::printf("restore ratio, 1 thread (sequential read / restore): %.2f\n",
              anchor_read_s / restore_s);
  std::printf("restore ratio, pool (sequential read / restore): %.2f\n",
              anchor_read_s / restore_pool_s);
  std::printf("restore 1t vs its floor (read + store import, serial): %.2f\n",
              (anchor_read_s + import_mem_s) / restore_s);

  // Snapshot stall: push latency (ApplyGradients of 4096 random existing
  // rows, as one sync step of a worker) outside a checkpoint, then while a
  // snapshot's row file is written in the background (copy-on-write).
  {
    std::vector<int64_t> push_ids(4096);
    std::vector<float> grads(push_ids.size() * kDim, 0.001f);
    uint64_t x = 12345;
    auto one_push = [&]() {
      for (int64_t& id : push_ids) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        id = static_cast<int64_t>((x >> 17) % static_cast<uint64_t>(rows)) *
             0x9e3779b97f4a7c15LL;
      }
      // Ids must be distinct: collisions are rare, remove them.
      std::sort(push_ids.begin(), push_ids.end());
      push_ids.erase(std::unique(push_ids.begin(), push_ids.end()), push_ids.end());
      const double t0 = Now();
      if (!source->ApplyGradients(0, push_ids, grads.data()).ok()) std::exit(1);
      push_ids.resize(4096);
      return Now() - t0;
    };
    auto stats = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return std::make_pair(v[v.size() / 2], v.back());
    };
    std::vector<double> outside;
    for (int i = 0; i < 200; ++i) outside.push_back(one_push());
    const double s0 = Now();
    if (!source->BeginSnapshot(1).ok()) return 1;
    const double stall = Now() - s0;
    std::atomic<bool> writing{true};
    double snapshot_write_s = 0;
    std::thread writer([&] {
      const double w0 = Now();
      auto w = server::checkpoint::RowFileWriter().WriteSnapshot(
          *source, /*since_generation=*/0, slots, row_file);
      snapshot_write_s = Now() - w0;
      if (!w.ok()) std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
      writing = false;
    });
    std::vector<double> during;
    while (writing.load()) during.push_back(one_push());
    writer.join();
    const int64_t pre_bytes = source->SnapshotBytes();
    source->EndSnapshot();
    const auto [p50_out, max_out] = stats(outside);
    const auto [p50_in, max_in] = stats(during);
    std::printf("\nsnapshot stall (BeginSnapshot, every stripe held): %.3f ms\n",
                stall * 1e3);
    std::printf("push of 4096 rows, outside a checkpoint: p50 %.3f ms, max %.3f ms (%zu pushes)\n",
                p50_out * 1e3, max_out * 1e3, outside.size());
    std::printf("push of 4096 rows, during the snapshot write (%.2f s): p50 %.3f ms, max %.3f ms (%zu pushes); rows copied aside: %.0f MiB\n",
                snapshot_write_s, p50_in * 1e3, max_in * 1e3, during.size(),
                pre_bytes / 1048576.0);
    std::printf("max push during / p50 outside: %.2f (goal <= 2)\n", max_in / p50_out);
  }
  std::filesystem::remove(row_file, ec);
  std::filesystem::remove(anchor, ec);
  std::filesystem::remove(dir, ec);
  return 0;
}

}  // namespace
}  // namespace recps

int main(int argc, char** argv) { return recps::Main(argc, argv); }
