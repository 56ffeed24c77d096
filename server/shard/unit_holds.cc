#include "server/shard/unit_holds.h"

#include <algorithm>
#include <vector>

#include "absl/types/span.h"
#include "common/hashing.h"
#include "common/wire/wire_format.h"

namespace recps::server {

void UnitHolds::NoteRequestStep(int64_t step) {
  int64_t seen = max_request_step_.load();
  while (step > seen && !max_request_step_.compare_exchange_weak(seen, step)) {
  }
}

int64_t UnitHolds::Add(const std::shared_ptr<Hold>& hold, bool async) {
  absl::MutexLock lock(&mu_);
  active_.fetch_add(1);
  const int64_t last_step = max_request_step_.load();
  hold->from_step = async ? 0 : last_step + 1;
  holds_.push_back(hold);
  return last_step;
}

bool UnitHolds::ParkIfHeld(
    const v1::RequestHeader& header,
    const google::protobuf::RepeatedPtrField<v1::TableIds>* lookup,
    const GradientPush* push,
    absl::FunctionRef<absl::AnyInvocable<void() &&>()> make_resume) {
  const uint32_t num_slots = num_slots_;
  std::vector<int64_t> scratch;
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<Hold>& hold : holds_) {
    if (header.step() < hold->from_step) continue;
    auto touches = [&](int table, absl::Span<const int64_t> ids) {
      if (table < 0 || table >= static_cast<int>(hold->held.size()) ||
          hold->held[table].empty()) {
        return false;
      }
      const uint64_t key = StableNameKey(store_->spec(table).name);
      for (int64_t id : ids) {
        if (hold->held[table][SlotOf(key, id, num_slots)]) return true;
      }
      return false;
    };
    bool held = false;
    if (lookup != nullptr) {
      for (const v1::TableIds& t : *lookup) {
        const absl::StatusOr<int> table = store_->FindTable(t.table());
        absl::Span<const int64_t> ids;
        if (!table.ok() || !DecodeIds(t.ids(), "ids", &scratch, &ids).ok()) continue;
        if (touches(*table, ids)) {
          held = true;
          break;
        }
      }
    }
    if (push != nullptr && hold->all_pushes) held = true;
    if (push != nullptr && !held) {
      for (const TableGradients& tg : *push) {
        if (touches(tg.table, tg.ids)) {
          held = true;
          break;
        }
      }
    }
    if (held) {
      hold->parked.push_back(make_resume());
      return true;
    }
  }
  return false;
}

void UnitHolds::Release(const std::shared_ptr<Hold>& hold) {
  std::vector<absl::AnyInvocable<void() &&>> parked;
  {
    absl::MutexLock lock(&mu_);
    holds_.erase(std::find(holds_.begin(), holds_.end(), hold));
    active_.fetch_sub(1);
    parked.swap(hold->parked);
  }
  for (auto& p : parked) work_->Schedule(std::move(p));
}

}  // namespace recps::server
