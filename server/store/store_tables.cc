#include "server/store/store_tables.h"

#include <atomic>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/hashing.h"
#include "common/row_init.h"
#include "common/status_macros.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/stored_row.h"
#include "server/store/table_checks.h"

namespace recps::server {
namespace {

// Pushes of fewer ids check their gradients on the calling thread.
constexpr int64_t kParallelCheckMinIds = 4096;

constexpr int kMaxDim = 4096;
constexpr size_t kMaxNameLength = 64;

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxNameLength) return false;
  for (unsigned char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateTableSpec(const config::TableSpec& s, int index) {
  if (!ValidName(s.name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", index, ": name '", s.name,
        "' must be 1 to 64 characters of [A-Za-z0-9_.-]"));
  }
  const std::string t = absl::StrCat("table '", s.name, "': ");
  if (s.dim < 1 || s.dim > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(t, "dim is ", s.dim, "; it must be in 1..", kMaxDim));
  }
  if (s.num_rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        t, "num_rows is ", s.num_rows, "; it must be >= 0 (0: dynamic)"));
  }
  if (absl::Status st = ValidateOptimizerParams(s.optimizer);
      !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(t, "optimizer: ", st.message()));
  }
  if (s.precision != RowPrecision::kFp32 &&
      s.precision != RowPrecision::kFp16 &&
      s.precision != RowPrecision::kBf16) {
    return absl::InvalidArgumentError(absl::StrCat(
        t, "precision ", static_cast<int>(s.precision),
        " is unknown; it must be fp32, fp16 or bf16"));
  }
  const RowInit& in = s.init;
  const bool finite = std::isfinite(in.a) && std::isfinite(in.b);
  switch (in.distribution) {
    case RowInit::Distribution::kUniform:
      if (!finite || !(in.a < in.b)) {
        return absl::InvalidArgumentError(absl::StrCat(
            t, "init: uniform bounds [", in.a, ", ", in.b,
            ") must be finite with low < high"));
      }
      break;
    case RowInit::Distribution::kNormal:
      if (!finite || !(in.b > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            t, "init: normal mean ", in.a, " and stddev ", in.b,
            " must be finite with stddev > 0"));
      }
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          t, "init: unknown distribution ",
          static_cast<int>(in.distribution)));
  }
  return absl::OkStatus();
}

absl::Status ValidateStoreTables(const std::vector<config::TableSpec>& tables,
                                 const StoreOptions& options) {
  if (options.num_slots == 0) {
    return absl::InvalidArgumentError("store: num_slots must be > 0");
  }
  if (options.max_rows_per_table < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "store: max_rows_per_table is ", options.max_rows_per_table,
        "; it must be >= 1"));
  }
  absl::flat_hash_map<std::string, int> names;
  for (size_t i = 0; i < tables.size(); ++i) {
    RETURN_IF_ERROR(ValidateTableSpec(tables[i], static_cast<int>(i)));
    auto [it, inserted] = names.try_emplace(tables[i].name, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table name '", tables[i].name, "' is used by tables ", it->second,
          " and ", i));
    }
  }
  return absl::OkStatus();
}

std::optional<std::pair<size_t, size_t>> FindRepeatedId(
    absl::Span<const int64_t> ids) {
  size_t size = 16;
  while (size < 2 * ids.size()) size *= 2;
  std::vector<size_t> table(size, 0);  // position + 1; 0: empty
  const size_t mask = size - 1;
  for (size_t p = 0; p < ids.size(); ++p) {
    size_t i = Mix64(static_cast<uint64_t>(ids[p])) & mask;
    for (; table[i] != 0; i = (i + 1) & mask) {
      const size_t q = table[i] - 1;
      if (ids[q] == ids[p]) return std::make_pair(q, p);
    }
    table[i] = p + 1;
  }
  return std::nullopt;
}

absl::Status CheckNoRepeatedId(const std::string& table,
                               absl::Span<const int64_t> ids,
                               absl::string_view what) {
  const auto twice = FindRepeatedId(ids);
  if (!twice.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "table '", table, "': id ", ids[twice->second], " appears twice in ",
      what, " (positions ", twice->first, " and ", twice->second, ")"));
}

absl::Status CheckFiniteGradients(const std::string& table,
                                  absl::Span<const int64_t> ids,
                                  const float* grads, int dim, int64_t from) {
  for (size_t p = from; p < ids.size(); ++p) {
    const float* g = grads + p * dim;
    for (int j = 0; j < dim; ++j) {
      if (!std::isfinite(g[j])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "table '", table, "': gradient of id ", ids[p], " (position ", p,
            ") is ", g[j], " at column ", j));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckGradientPush(const config::TableSpec& spec,
                               absl::Span<const int64_t> ids,
                               const float* grads, ThreadPool* pool) {
  RETURN_IF_ERROR(CheckIdsInRange(spec, ids));
  RETURN_IF_ERROR(CheckDataGiven(spec.name, ids, grads, "gradients"));
  const int dim = spec.dim;
  const auto n = static_cast<int64_t>(ids.size());
  std::atomic<int64_t> first_bad{n};
  if (n < kParallelCheckMinIds) pool = nullptr;
  const int64_t parts = pool == nullptr ? 1 : pool->num_threads();
  ParallelForOrInline(pool, n, (n + parts - 1) / parts, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const float* g = grads + p * dim;
      // Branch-free exponent test per row (vectorises).
      uint32_t bad = 0;
      for (int j = 0; j < dim; ++j) {
        uint32_t bits;
        std::memcpy(&bits, &g[j], sizeof(bits));
        bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
      }
      if (bad == 0) continue;
      int64_t seen = first_bad.load(std::memory_order_relaxed);
      while (p < seen && !first_bad.compare_exchange_weak(seen, p)) {
      }
      return;
    }
  });
  if (const int64_t p = first_bad.load(); p < n) {
    RETURN_IF_ERROR(CheckFiniteGradients(spec.name, ids, grads, dim, p));
  }
  return CheckNoRepeatedId(spec.name, ids, "one gradient push");
}

absl::Status CheckImport(const config::TableSpec& spec, uint32_t slot,
                         absl::Span<const int64_t> ids, const float* rows,
                         int64_t stride,
                         absl::FunctionRef<uint32_t(int64_t)> slot_of) {
  RETURN_IF_ERROR(CheckDataGiven(spec.name, ids, rows, "rows"));
  RETURN_IF_ERROR(CheckIdsInRange(spec, ids));
  for (size_t p = 0; p < ids.size(); ++p) {
    const uint32_t s = slot_of(ids[p]);
    if (s != slot) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", spec.name, "': id ", ids[p], " (position ", p,
          ") belongs to slot ", s, ", not to slot ", slot));
    }
    RETURN_IF_ERROR(ValidateImportedRow(spec, rows + p * stride, ids[p], p));
  }
  return CheckNoRepeatedId(spec.name, ids, "one import");
}

absl::Status ImportFullError(const config::TableSpec& spec, int64_t capacity,
                             int64_t fresh, int64_t free, uint32_t slot) {
  return absl::ResourceExhaustedError(absl::StrCat(
      TableFullError(spec, capacity).message(), "; importing ", fresh,
      " new rows into slot ", slot, " needs ", fresh - free, " more"));
}

absl::Status CheckSlot(uint32_t slot, uint32_t num_slots) {
  if (slot < num_slots) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "slot ", slot, " is outside [0, ", num_slots,
      ") (StoreOptions.num_slots)"));
}

absl::Status CheckExportArgs(absl::string_view what, const SlotCursor* cursor,
                             const SlotChunk* out, int64_t max_rows) {
  if (cursor == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": cursor or out is null"));
  }
  if (max_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": max_rows is ", max_rows, "; it must be >= 1"));
  }
  return absl::OkStatus();
}

absl::Status NoRowError(const std::string& table, int64_t id) {
  return absl::NotFoundError(
      absl::StrCat("table '", table, "' has no row for id ", id));
}

absl::Status CheckDataGiven(const std::string& table,
                            absl::Span<const int64_t> ids, const void* data,
                            absl::string_view what) {
  if (ids.empty() || data != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "table '", table, "': no ", what, " for ", ids.size(), " ids"));
}

absl::Status NoTableIndexError(int table, size_t num_tables) {
  return absl::NotFoundError(absl::StrCat("no table with index ", table,
                                          " (the store has ", num_tables,
                                          " tables)"));
}

absl::Status UnknownTableError(absl::string_view name,
                               const std::vector<absl::string_view>& names) {
  return absl::NotFoundError(
      absl::StrCat("unknown table '", name, "'; this store has ",
                   names.empty() ? "no tables" : absl::StrJoin(names, ", ")));
}

absl::Status SnapshotCuts::Begin(uint64_t cut,
                                 absl::FunctionRef<void()> apply) {
  absl::MutexLock lock(&mu_);
  if (open_cut_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "a snapshot (cut ", open_cut_, ") is open; end it before cut ", cut));
  }
  if (cut == 0 || cut <= last_cut_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "snapshot cut ", cut, " must be above the last cut ", last_cut_,
        " (and above 0)"));
  }
  apply();
  open_cut_ = cut;
  last_cut_ = cut;
  return absl::OkStatus();
}

absl::Status SnapshotCuts::Mark(uint64_t mark,
                                absl::FunctionRef<void()> apply) {
  absl::MutexLock lock(&mu_);
  if (mark == 0 || mark <= last_cut_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "generation mark ", mark, " must be above the last cut or mark ",
        last_cut_, " (and above 0)"));
  }
  apply();
  last_cut_ = mark;
  return absl::OkStatus();
}

void SnapshotCuts::End(absl::FunctionRef<void()> apply) {
  absl::MutexLock lock(&mu_);
  if (open_cut_ == 0) return;
  apply();
  open_cut_ = 0;
}

}  // namespace recps::server
