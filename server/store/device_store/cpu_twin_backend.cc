// The CPU twin of the CUDA backend (device_backend.h): the same arena
// layout, the same hash index (entries, home, probing) and the same fused
// update kernel, in host memory, one id at a time where the GPU runs one
// thread per id. The arena and the index are reserved address space
// (AlignedBuffer), committed as they are touched, as the host store's.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/aligned_buffer.h"
#include "common/half.h"
#include "common/hashing.h"
#include "kernels/dispatch.h"
#include "kernels/embedding_optimizer.h"
#include "server/store/device_store/device_backend.h"

namespace recps::server::device_store {
namespace {

struct Entry {
  int64_t id;
  int64_t row_plus_one;  // 0: empty
};

class CpuTwinTable final : public DeviceTable {
 public:
  CpuTwinTable(const TableLayout& layout, AlignedBuffer arena,
               AlignedBuffer index)
      : layout_(layout),
        arena_(std::move(arena)),
        index_(std::move(index)),
        mask_(static_cast<uint64_t>(layout.index_capacity) - 1) {}

  absl::Status ProbeGather(absl::Span<const int64_t> ids, int64_t* rows,
                           float* out) const override {
    const int dim = layout_.dim;
    for (size_t p = 0; p < ids.size(); ++p) {
      const int64_t r = Find(ids[p]);
      rows[p] = r;
      if (out == nullptr) continue;
      if (r >= 0 && layout_.precision == RowPrecision::kFp32) {
        std::memcpy(out + p * dim, Row(r), sizeof(float) * dim);
      } else if (r >= 0) {
        const auto* w = reinterpret_cast<const uint16_t*>(Row(r));
        const bool fp16 = layout_.precision == RowPrecision::kFp16;
        for (int c = 0; c < dim; ++c) {
          out[p * dim + c] = fp16 ? HalfToFloat(w[c]) : Bf16ToFloat(w[c]);
        }
      } else {
        std::memset(out + p * dim, 0, sizeof(float) * dim);
      }
    }
    return absl::OkStatus();
  }

  absl::Status Insert(absl::Span<const int64_t> ids,
                      absl::Span<const int64_t> rows) override {
    for (size_t p = 0; p < ids.size(); ++p) Put(ids[p], rows[p]);
    return absl::OkStatus();
  }

  absl::Status RebuildIndex(absl::Span<const int64_t> old_ids,
                            absl::Span<const int64_t> new_ids) override {
    // Every occupied entry holds one of old_ids: zeroing theirs empties the
    // index without touching (committing) the rest of it. Found first, then
    // zeroed: an emptied entry would cut the probe chains of the others.
    std::vector<uint64_t> at;
    at.reserve(old_ids.size());
    Entry* e = entries();
    for (int64_t id : old_ids) {
      for (uint64_t i = Home(id); e[i].row_plus_one != 0;
           i = (i + 1) & mask_) {
        if (e[i].id == id) {
          at.push_back(i);
          break;
        }
      }
    }
    for (uint64_t i : at) e[i] = Entry{0, 0};
    for (size_t r = 0; r < new_ids.size(); ++r) {
      Put(new_ids[r], static_cast<int64_t>(r));
    }
    return absl::OkStatus();
  }

  absl::Status ReadRows(absl::Span<const int64_t> rows,
                        float* out) const override {
    for (size_t k = 0; k < rows.size(); ++k) {
      std::memcpy(out + k * layout_.stride, Row(rows[k]),
                  sizeof(float) * layout_.stride);
    }
    return absl::OkStatus();
  }

  absl::Status WriteRows(absl::Span<const int64_t> rows,
                         const float* data) override {
    for (size_t k = 0; k < rows.size(); ++k) {
      std::memcpy(Row(rows[k]), data + k * layout_.stride,
                  sizeof(float) * layout_.stride);
    }
    return absl::OkStatus();
  }

  absl::Status MoveRows(absl::Span<const int64_t> from,
                        absl::Span<const int64_t> to) override {
    for (size_t k = 0; k < from.size(); ++k) {
      std::memcpy(Row(to[k]), Row(from[k]), sizeof(float) * layout_.stride);
    }
    return absl::OkStatus();
  }

  absl::Status Update(absl::Span<const int64_t> rows, const float* grads,
                      const OptimizerParams& optimizer) override {
    if (rows.empty()) return absl::OkStatus();
    kernels::FusedUpdateArgs args;
    args.rows = arena_.as<float>();
    args.precision = layout_.precision;
    args.stochastic_rounding = layout_.stochastic_rounding;
    args.num_rows = layout_.capacity;
    args.row_stride = layout_.stride;
    args.dim = layout_.dim;
    args.row_indices = rows.data();
    args.num_updates = static_cast<int64_t>(rows.size());
    args.grads = grads;
    args.optimizer = optimizer;
    kernels::ExecContext ctx;  // CPU, calling thread
    return kernels::FusedOptimizerUpdate(args, ctx);
  }

 private:
  float* Row(int64_t r) const { return arena_.as<float>() + r * layout_.stride; }
  Entry* entries() const { return index_.as<Entry>(); }
  uint64_t Home(int64_t id) const {
    return Mix64(static_cast<uint64_t>(id)) & mask_;
  }
  int64_t Find(int64_t id) const {
    const Entry* e = entries();
    for (uint64_t i = Home(id);; i = (i + 1) & mask_) {
      if (e[i].row_plus_one == 0) return -1;
      if (e[i].id == id) return e[i].row_plus_one - 1;
    }
  }
  void Put(int64_t id, int64_t row) {
    Entry* e = entries();
    uint64_t i = Home(id);
    while (e[i].row_plus_one != 0) i = (i + 1) & mask_;
    e[i] = Entry{id, row + 1};
  }

  const TableLayout layout_;
  AlignedBuffer arena_;
  AlignedBuffer index_;
  const uint64_t mask_;
};

class CpuTwinBackend final : public DeviceBackend {
 public:
  std::string name() const override { return "cpu-twin"; }

  absl::StatusOr<std::unique_ptr<DeviceTable>> CreateTable(
      const TableLayout& layout) override {
    auto arena = AlignedBuffer::Allocate(static_cast<size_t>(layout.capacity) *
                                         layout.stride * sizeof(float));
    if (!arena.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cpu-twin: reserving ", layout.capacity,
          " rows: ", arena.status().message()));
    }
    auto index = AlignedBuffer::Allocate(
        static_cast<size_t>(layout.index_capacity) * sizeof(Entry));
    if (!index.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cpu-twin: reserving an index of ", layout.index_capacity,
          " entries: ", index.status().message()));
    }
    return std::unique_ptr<DeviceTable>(
        new CpuTwinTable(layout, *std::move(arena), *std::move(index)));
  }
};

}  // namespace

std::unique_ptr<DeviceBackend> CreateCpuTwinBackend() {
  return std::make_unique<CpuTwinBackend>();
}

}  // namespace recps::server::device_store
