#include "server/checkpoint/chain_merge.h"

#include <algorithm>

#include "server/checkpoint/file_util.h"

namespace recps::server::checkpoint {

ChainMerger::ChainMerger(const std::vector<const RowFileReader*>& readers)
    : readers_(readers) {
  for (const RowFileReader* r : readers_) its_.push_back(r->NewRowIterator());
  for (int i = 0; i < static_cast<int>(its_.size()); ++i) PushIfValid(i);
}

bool ChainMerger::After(int a, int b) const {
  const int c = its_[a]->key().compare(its_[b]->key());
  if (c != 0) return c > 0;
  return a < b;  // the older file comes after the newer
}

void ChainMerger::PushIfValid(int i) {
  if (!its_[i]->Valid()) {
    if (status_.ok() && !its_[i]->status().ok()) {
      status_ = FromRocksStatus(its_[i]->status(), "cannot read row file",
                                readers_[i]->path());
    }
    return;
  }
  heap_.push_back(i);
  std::push_heap(heap_.begin(), heap_.end(),
                 [this](int a, int b) { return After(a, b); });
}

void ChainMerger::PopHeap() {
  std::pop_heap(heap_.begin(), heap_.end(),
                [this](int a, int b) { return After(a, b); });
  heap_.pop_back();
}

void ChainMerger::Seek(absl::string_view key) {
  heap_.clear();
  for (int i = 0; i < static_cast<int>(its_.size()); ++i) {
    its_[i]->Seek(rocksdb::Slice(key.data(), key.size()));
    PushIfValid(i);
  }
}

bool ChainMerger::Next(absl::string_view* key, absl::string_view* value) {
  if (!status_.ok() || heap_.empty()) return false;
  const int top = heap_.front();
  PopHeap();
  key_.assign(its_[top]->key().data(), its_[top]->key().size());
  value_.assign(its_[top]->value().data(), its_[top]->value().size());
  ++entries_read_;
  // Older files' entries of the same key are overridden.
  while (!heap_.empty() && its_[heap_.front()]->key() == rocksdb::Slice(key_)) {
    const int older = heap_.front();
    PopHeap();
    ++entries_read_;
    its_[older]->Next();
    PushIfValid(older);
  }
  its_[top]->Next();
  PushIfValid(top);
  if (!status_.ok()) return false;
  *key = key_;
  *value = value_;
  return true;
}

}  // namespace recps::server::checkpoint
