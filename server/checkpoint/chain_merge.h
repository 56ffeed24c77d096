// Internal to the checkpoint format library: the entries of several row
// files merged in key order, the newest file's entry winning for a key
// that several hold (compaction, export).
#ifndef RECPS_SERVER_CHECKPOINT_CHAIN_MERGE_H_
#define RECPS_SERVER_CHECKPOINT_CHAIN_MERGE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/iterator.h"
#include "server/checkpoint/row_file.h"

namespace recps::server::checkpoint {

class ChainMerger {
 public:
  // `readers` in chain order (oldest first); they must outlive the merger.
  explicit ChainMerger(const std::vector<const RowFileReader*>& readers);

  // Positions every file at the first key >= `key` (default: the first row).
  void Seek(absl::string_view key);
  // The next merged entry; false at the end or on an error (see status()).
  // The views stay valid until the next call.
  bool Next(absl::string_view* key, absl::string_view* value);
  absl::Status status() const { return status_; }
  // Entries read so far from all files (overridden ones included).
  int64_t entries_read() const { return entries_read_; }

 private:
  // Heap order: smaller key first; for equal keys the newer file first.
  bool After(int a, int b) const;
  void PushIfValid(int i);
  void PopHeap();

  std::vector<const RowFileReader*> readers_;
  std::vector<std::unique_ptr<rocksdb::Iterator>> its_;
  std::vector<int> heap_;
  std::string key_;
  std::string value_;
  absl::Status status_;
  int64_t entries_read_ = 0;
};

}  // namespace recps::server::checkpoint

#endif  // RECPS_SERVER_CHECKPOINT_CHAIN_MERGE_H_
