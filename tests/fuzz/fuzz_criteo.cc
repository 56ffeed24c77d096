// The Criteo TSV reader (worker/data/criteo) on untrusted files: the first
// four bytes pick the feature counts, hashing, the rank split and the batch
// size; the rest is the file. Every batch must be well formed (labels 0 or
// 1, size x num_dense finite dense values, offsets that start at 0, never
// decrease and end at the ids' count, hashed ids inside their buckets),
// malformed lines are counted, never fatal.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/request_checks.h"
#include "worker/data/criteo.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  if (size < 4) return 0;
  worker::CriteoConfig config;
  config.num_dense = data[0] % 4 == 3 ? 13 : data[0] % 4;
  config.num_categorical = data[0] / 4 % 4 == 3 ? 26 : data[0] / 4 % 4;
  const bool hashed = data[0] & 0x10;
  if (hashed) config.hash_buckets.assign(config.num_categorical, 1 + data[1] % 7);
  const int world = 1 + data[2] % 3;
  const int rank = data[2] / 3 % world;
  const int64_t batch_size = 1 + data[3] % 5;
  config.paths = {ScratchDir() + "/criteo.tsv"};
  WriteFile(config.paths[0], data + 4, size - 4);
  auto source = worker::CriteoSource::Create(config, rank, world, batch_size);
  if (!source.ok()) Fail("criteo Create: " + source.status().ToString());
  worker::Batch batch;
  int64_t samples = 0;
  while (true) {
    absl::StatusOr<bool> more = (*source)->Next(&batch);
    if (!more.ok()) Fail("criteo Next: " + more.status().ToString());
    if (!*more) break;
    if (batch.size < 1 || batch.size > batch_size) Fail("batch size");
    samples += batch.size;
    if (batch.labels.size() != static_cast<size_t>(batch.size)) Fail("labels");
    for (float l : batch.labels) {
      if (l != 0.0f && l != 1.0f) Fail("label value");
    }
    if (batch.dense.size() != static_cast<size_t>(batch.size * config.num_dense)) {
      Fail("dense size");
    }
    for (float x : batch.dense) {
      if (!std::isfinite(x) || x < 0) Fail("dense value " + std::to_string(x));
    }
    if (batch.num_sparse() != config.num_categorical) Fail("sparse count");
    for (int f = 0; f < batch.num_sparse(); ++f) {
      const std::vector<int64_t>& off = batch.offsets[f];
      if (off.size() != static_cast<size_t>(batch.size + 1) || off[0] != 0 ||
          off.back() != static_cast<int64_t>(batch.ids[f].size())) {
        Fail("offsets shape");
      }
      for (size_t i = 1; i < off.size(); ++i) {
        if (off[i] < off[i - 1]) Fail("offsets decrease");
      }
      if (hashed) {
        for (int64_t id : batch.ids[f]) {
          if (id < 0 || id >= config.hash_buckets[f]) Fail("hashed id out of buckets");
        }
      }
    }
  }
  const worker::CriteoStats stats = (*source)->stats();
  if (stats.lines - stats.bad_lines != samples) Fail("stats do not add up");
  return 0;
}
