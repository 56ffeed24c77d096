// Row files (server/checkpoint RowFileReader) whose CRC-32C matches but
// whose contents are hostile: an SST file holding a fuzzed RowFileHeader
// (raw bytes, or the real layout of the store with fields changed) and a
// few row entries of fuzzed keys and values. The reader opens it, checks it
// against a small host store (CheckStore) and imports every slot. Checks:
// no crash or sanitizer report (nothing is sized from the header before it
// matches the store), refusals with a code and a message.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/embedding_optimizer.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"
#include "server/checkpoint/crc32c.h"
#include "server/checkpoint/row_file.h"
#include "server/checkpoint/store_rows.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/request_checks.h"
#include "tests/fuzz/shard_fixture.h"

namespace recps::fuzz {
namespace {

const std::string kHeaderKey("\0recps.row_file", 15);

std::string Header(FuzzedDataProvider& in, const server::EmbeddingStore& store) {
  if (in.ConsumeBool()) return in.ConsumeRandomLengthString(256);
  v1::RowFileHeader h;
  h.set_format_version(in.ConsumeIntegralInRange<int>(0, 5) == 0
                           ? in.ConsumeIntegral<uint32_t>()
                           : server::checkpoint::kRowFileFormatVersion);
  h.set_num_slots(in.ConsumeIntegralInRange<int>(0, 5) == 0
                      ? in.ConsumeIntegral<uint32_t>() : kSlots);
  for (v1::CheckpointTable& t : server::checkpoint::StoreLayout(store)) {
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) continue;  // dropped
    switch (in.ConsumeIntegralInRange<int>(0, 10)) {
      case 0: t.set_dim(in.ConsumeIntegral<int32_t>()); break;
      case 1: t.set_row_stride(in.ConsumeIntegral<int64_t>()); break;
      case 2: t.set_optimizer_kind(in.ConsumeIntegral<int32_t>()); break;
      case 3: t.set_num_rows(in.ConsumeIntegral<int64_t>()); break;
      case 4: t.set_name(in.ConsumeRandomLengthString(12)); break;
      default: break;
    }
    *h.add_tables() = t;
  }
  return h.SerializeAsString();
}

}  // namespace
}  // namespace recps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recps;
  using namespace recps::fuzz;
  using namespace recps::server::checkpoint;
  FuzzedDataProvider in(data, size);
  auto store = server::CreateHostEmbeddingStore(FixtureTables(), FixtureStoreOptions());
  if (!store.ok()) Fail("store");
  std::map<std::string, std::string> entries;  // SST keys must be sorted
  if (in.ConsumeIntegralInRange<int>(0, 15) != 0) entries[kHeaderKey] = Header(in, **store);
  const int n = in.ConsumeIntegralInRange<int>(0, 12);
  std::string key;
  for (int i = 0; i < n && in.remaining_bytes() > 0; ++i) {
    const uint8_t pick = in.ConsumeIntegral<uint8_t>();
    const int table = pick % (*store)->num_tables();
    const std::string name = pick < 240 ? (*store)->spec(table).name
                                        : in.ConsumeRandomLengthString(8);
    const int64_t id = InterestingId(in.ConsumeIntegral<uint8_t>(),
                                     in.ConsumeIntegral<int64_t>());
    const uint32_t slot = in.ConsumeBool() ? SlotOf(StableNameKey(name), id, kSlots)
                                           : in.ConsumeIntegralInRange<uint32_t>(0, kSlots);
    EncodeRowKey(name, slot, id, &key);
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) key.pop_back();  // torn key
    const int64_t stride = FusedRowStride((*store)->spec(table).optimizer.kind,
                                                   (*store)->spec(table).dim);
    std::vector<float> row(stride, 0.125f);
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) row[0] = -1.0f / 0.0f;
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) row.back() = -2.0f;
    std::string value(reinterpret_cast<const char*>(row.data()), row.size() * sizeof(float));
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) value.resize(value.size() / 2);
    entries[key] = value;
  }
  const std::string path = ScratchDir() + "/rows.sst";
  {
    rocksdb::Options options;
    options.compression = rocksdb::kNoCompression;
    rocksdb::SstFileWriter writer(rocksdb::EnvOptions(), options);
    if (!writer.Open(path).ok()) Fail("open sst");
    for (const auto& [k, v] : entries) {
      if (!writer.Put(k, v).ok()) Fail("put sst");
    }
    if (entries.empty()) {
      unlink(path.c_str());
    } else if (!writer.Finish().ok()) {
      Fail("finish sst");
    }
  }
  if (entries.empty()) return 0;
  const absl::StatusOr<FileCrc> crc = ChecksumFile(path);
  if (!crc.ok()) Fail("crc");
  absl::StatusOr<std::unique_ptr<RowFileReader>> reader =
      RowFileReader::Open(path, crc->size_bytes, crc->crc32c);
  Report("RowFileReader::Open", reader.status());
  if (!reader.ok()) {
    CheckRefusal(reader.status(), "RowFileReader::Open", true);
    return 0;
  }
  const absl::Status checked = server::checkpoint::CheckRowFileStore(**reader, **store);
  if (!checked.ok()) {
    CheckRefusal(checked, "CheckStore", true);
    return 0;
  }
  std::vector<uint32_t> slots;
  for (uint32_t s = 0; s < kSlots; ++s) slots.push_back(s);
  const absl::StatusOr<int64_t> imported =
      server::checkpoint::ImportRowFile(**reader, **store, slots);
  Report("Import", imported.status());
  if (!imported.ok()) CheckRefusal(imported.status(), "Import", true);
  return 0;
}
