// The checkpoint manifest reader and the checks a restore makes before it
// reads any row (server/checkpoint ReadManifest, RestoreCheckpoint) on an
// untrusted MANIFEST file. Mode bit 0 wraps the bytes in the manifest's
// magic and CRC-32C, so that the fuzzer reaches the parse and the layout
// checks; otherwise the file is the bytes as they are. The restore target
// is a small host store; the manifest's row files do not exist, so a
// restore that passes every check ends in NOT_FOUND. Checks: no crash or
// sanitizer report, refusals with a code and a message, no row imported.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/checkpoint/checkpoint.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/manifest.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/request_checks.h"
#include "tests/fuzz/shard_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  using namespace recps::server::checkpoint;
  if (size < 1) return 0;
  std::string bytes;
  if (data[0] & 1) {
    const std::string payload(reinterpret_cast<const char*>(data + 1), size - 1);
    bytes = "RECPSCK1" + payload;
    const uint32_t crc = Crc32cExtend(0, payload.data(), payload.size());
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>(crc >> (8 * i)));
  } else {
    bytes.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  }
  const std::string dir = ScratchDir() + "/step-000000000001";
  static const bool made = [&] { return mkdir(dir.c_str(), 0700) == 0; }();
  if (!made) Fail("cannot make " + dir);
  WriteFile(dir + "/" + kManifestName, bytes.data(), bytes.size());

  const absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(dir);
  if (!manifest.ok()) CheckRefusal(manifest.status(), "ReadManifest", true);

  auto store = server::CreateHostEmbeddingStore(FixtureTables(), FixtureStoreOptions());
  if (!store.ok()) Fail("store");
  std::vector<uint32_t> slots;
  for (uint32_t s = 0; s < kSlots + (data[0] & 2 ? 1 : 0); ++s) slots.push_back(s);
  const absl::StatusOr<RestoreStats> restored = RestoreCheckpoint(
      dir, data[0] & 4 ? "" : "0123456789abcdef", **store, slots);
  Report("RestoreCheckpoint", restored.status());
  if (restored.ok()) {
    if (restored->rows != 0) Fail("rows imported from no row file");
  } else {
    CheckRefusal(restored.status(), "RestoreCheckpoint", true);
  }
  for (int t = 0; t < (*store)->num_tables(); ++t) {
    if ((*store)->Info(t).rows != 0) Fail("a refused restore imported rows");
  }
  return 0;
}
