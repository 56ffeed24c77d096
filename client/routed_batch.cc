#include "client/routed_batch.h"

#include "client/lookup_response_reader.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "common/half.h"
#include "common/status_macros.h"
#include "common/wire/wire_format.h"

namespace recps::client::internal {

// Where a serialized push goes: a string that grows, or memory of a size
// known in advance (same-host rows).
class RoutedBatch::ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : string_(out) {}
  ByteWriter(char* out, size_t size) : at_(out), end_(out + size) {}
  void reserve(size_t n) {
    if (string_ != nullptr) string_->reserve(string_->size() + n);
  }
  void append(const char* bytes, size_t n) {
    if (string_ != nullptr) {
      string_->append(bytes, n);
      return;
    }
    if (char* to = Take(n)) std::memcpy(to, bytes, n);
  }
  // n bytes to be written by the caller; null past the end of fixed memory
  // (then nothing more is written and filled() is false).
  char* Take(size_t n) {
    if (string_ != nullptr) {
      const size_t at = string_->size();
      string_->resize(at + n);
      return string_->data() + at;
    }
    if (overflow_ || n > static_cast<size_t>(end_ - at_)) {
      overflow_ = true;
      return nullptr;
    }
    char* p = at_;
    at_ += n;
    return p;
  }
  // Fixed memory: written exactly to its end.
  bool filled() const { return !overflow_ && at_ == end_; }

 private:
  std::string* string_ = nullptr;
  char* at_ = nullptr;
  char* end_ = nullptr;
  bool overflow_ = false;
};


template <typename Spec>
void RoutedBatch::Dedupe(absl::Span<const Spec> batch,
                         const std::vector<TableSchema>& tables,
                         const std::vector<uint64_t>& keys,
                         const ShardMap& map) {
  plan_of_table_.assign(tables.size(), -1);
  plan_of_spec_.resize(batch.size());
  num_plans = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Spec& spec = batch[i];
    int& p = plan_of_table_[spec.table];
    if (p < 0) {
      // One plan, or one per column group.
      const absl::Span<const ColumnGroup> groups =
          map.ColumnGroupsOf(keys[spec.table]);
      const int n = groups.empty() ? 1 : static_cast<int>(groups.size());
      p = num_plans;
      num_plans += n;
      if (static_cast<int>(plans.size()) < num_plans) plans.resize(num_plans);
      for (int g = 0; g < n; ++g) {
        TablePlan& plan = plans[p + g];
        plan.data = p;
        plan.width = tables[spec.table].dim;
        plan.column_group = !groups.empty();
        if (groups.empty()) {
          plan.name = &tables[spec.table].name;
          plan.key = keys[spec.table];
          plan.dim = plan.width;
          plan.column_offset = 0;
        } else {
          plan.name = &groups[g].table;
          plan.key = groups[g].key;
          plan.dim = groups[g].end - groups[g].begin;
          plan.column_offset = groups[g].begin;
        }
      }
      if (spec.distinct) {
        AssignDistinct(spec.ids, &plans[p].dedup);  // hashed once, upstream
      } else {
        Deduplicate(spec.ids, &plans[p].dedup);
      }
    } else {
      DeduplicateAppend(spec.ids, &plans[p].dedup);
    }
    plan_of_spec_[i] = p;
  }
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    plan.pending.resize(plans[plan.data].dedup.unique.size());
    std::iota(plan.pending.begin(), plan.pending.end(), 0);
    plan.requeued.clear();
  }
  spec_pos_.assign(num_plans, 0);
}

void RoutedBatch::PrepareLookup(absl::Span<const LookupSpec> batch,
                                const std::vector<TableSchema>& tables,
                                const std::vector<uint64_t>& keys,
                                const ShardMap& map) {
  Dedupe(batch, tables, keys, map);
  // Group output positions by unique id (a counting sort on the inverse
  // map), so a returned row is written to all its positions at once.
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    if (plan.data != p) continue;  // a later column group: shares plans[data]
    plan.dst_begin.assign(plan.dedup.unique.size() + 1, 0);
    for (const int32_t u : plan.dedup.inverse) ++plan.dst_begin[u + 1];
    std::partial_sum(plan.dst_begin.begin(), plan.dst_begin.end(),
                     plan.dst_begin.begin());
    plan.dst.resize(plan.dedup.inverse.size());
    plan.scratch.assign(plan.dst_begin.begin(), plan.dst_begin.end() - 1);
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const int p = plan_of_spec_[i];
    TablePlan& plan = plans[p];
    const int32_t* inverse = plan.dedup.inverse.data() + spec_pos_[p];
    for (size_t j = 0; j < batch[i].ids.size(); ++j) {
      plan.dst[plan.scratch[inverse[j]]++] = batch[i].out + j * plan.width;
    }
    spec_pos_[p] += batch[i].ids.size();
  }
}

void RoutedBatch::PreparePush(absl::Span<const PushSpec> batch,
                              const std::vector<TableSchema>& tables,
                              const std::vector<uint64_t>& keys,
                              const ShardMap& map) {
  Dedupe(batch, tables, keys, map);
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    if (plan.data != p) continue;
    plan.grad_row.resize(plan.dedup.unique.size());
    plan.summed.clear();
    if (plan.dedup.unique.size() < plan.dedup.inverse.size()) {
      plan.summed.assign(plan.dedup.unique.size() * plan.width, 0.0f);
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const int p = plan_of_spec_[i];
    TablePlan& plan = plans[p];
    const int32_t* inverse = plan.dedup.inverse.data() + spec_pos_[p];
    for (size_t j = 0; j < batch[i].ids.size(); ++j) {
      const float* row = batch[i].grads + j * plan.width;
      if (plan.summed.empty()) {
        // Distinct ids (the documented case): send the caller's rows.
        plan.grad_row[inverse[j]] = row;
      } else {
        float* sum = plan.summed.data() + inverse[j] * plan.width;
        for (int c = 0; c < plan.width; ++c) sum[c] += row[c];
      }
    }
    spec_pos_[p] += batch[i].ids.size();
  }
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    if (plan.data != p || plan.summed.empty()) continue;
    for (size_t u = 0; u < plan.grad_row.size(); ++u) {
      plan.grad_row[u] = plan.summed.data() + u * plan.width;
    }
  }
}

absl::Status RoutedBatch::Route(const ShardMap& map) {
  const int num_servers = map.num_servers();
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    const size_t n = plan.pending.size();
    const int64_t* unique = plans[plan.data].dedup.unique.data();
    const TableRoute route = map.RouteOf(plan.key);
    // A group's name names its columns: the same name routed as a group
    // means the same columns.
    if (plan.column_group ? !route.column_group() : route.column_split()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "table ", *plan.name, ": shard map epoch ", map.epoch(),
          " splits it into column groups other than the map this call "
          "started with; its rows cannot follow a new column split"));
    }
    plan.server_begin.assign(num_servers + 1, 0);
    plan.routed.resize(n);
    plan.routed_ids.resize(n);
    if (num_servers == 1) {
      // One owner: no hashing, no sort.
      plan.server_begin[1] = static_cast<int32_t>(n);
      for (size_t k = 0; k < n; ++k) {
        plan.routed[k] = plan.pending[k];
        plan.routed_ids[k] = unique[plan.pending[k]];
      }
      continue;
    }
    // Counting sort of the pending ids by owner; owners go to scratch.
    plan.scratch.resize(n + num_servers);
    int32_t* owner = plan.scratch.data();
    for (size_t k = 0; k < n; ++k) {
      owner[k] = route.OwnerOf(unique[plan.pending[k]]);
      ++plan.server_begin[owner[k] + 1];
    }
    std::partial_sum(plan.server_begin.begin(), plan.server_begin.end(),
                     plan.server_begin.begin());
    int32_t* cursor = owner + n;
    std::copy(plan.server_begin.begin(), plan.server_begin.end() - 1, cursor);
    for (size_t k = 0; k < n; ++k) {
      const int32_t at = cursor[owner[k]]++;
      plan.routed[at] = plan.pending[k];
      plan.routed_ids[at] = unique[plan.pending[k]];
    }
  }
  return absl::OkStatus();
}

int32_t RoutedBatch::CountFor(int server) const {
  int32_t n = 0;
  for (int p = 0; p < num_plans; ++p) n += plans[p].count(server);
  return n;
}

template <typename Fn>
void RoutedBatch::ForEachTableOf(int server, int32_t begin, int32_t end,
                                 Fn&& fn) const {
  int32_t offset = 0;  // of plan p's ids among the server's
  for (int p = 0; p < num_plans && offset < end; ++p) {
    const TablePlan& plan = plans[p];
    const int32_t count = plan.count(server);
    const int32_t lo = std::max(begin, offset);
    const int32_t hi = std::min(end, offset + count);
    if (lo < hi) fn(p, plan.server_begin[server] + (lo - offset), hi - lo);
    offset += count;
  }
}

void RoutedBatch::Requeue(int server, int32_t begin, int32_t end) {
  ForEachTableOf(server, begin, end, [&](int p, int32_t first, int32_t n) {
    TablePlan& plan = plans[p];
    plan.requeued.insert(plan.requeued.end(), plan.routed.begin() + first,
                         plan.routed.begin() + first + n);
  });
}

void RoutedBatch::NextRound() {
  for (int p = 0; p < num_plans; ++p) {
    plans[p].pending.swap(plans[p].requeued);
    plans[p].requeued.clear();
  }
}

void RoutedBatch::BuildLookup(int server, int32_t begin, int32_t end,
                              v1::LookupRequest* request) const {
  if (updated_only) request->set_updated_only(true);
  ForEachTableOf(server, begin, end, [&](int p, int32_t first, int32_t n) {
    const TablePlan& plan = plans[p];
    v1::TableIds* table = request->add_tables();
    table->set_table(*plan.name);
    EncodeIds(absl::MakeConstSpan(plan.routed_ids.data() + first, n),
              table->mutable_ids());
  });
}

namespace {

// The start of rows[routed[first .. first + n)] when they follow each other
// in memory, rows of `dim` floats; null otherwise.
template <typename Row, typename RowOf>
Row ContiguousRows(const TablePlan& plan, int32_t first, int32_t n, RowOf row_of) {
  if (plan.column_offset != 0 || plan.width != plan.dim || n == 0) return nullptr;
  const Row base = row_of(plan.routed[first]);
  if (base == nullptr) return nullptr;
  for (int32_t k = 1; k < n; ++k) {
    if (row_of(plan.routed[first + k]) != base + static_cast<size_t>(k) * plan.dim) {
      return nullptr;
    }
  }
  return base;
}

}  // namespace

bool RoutedBatch::DirectLookupRows(int server, int32_t begin, int32_t end,
                                   std::vector<float*>* rows) const {
  rows->clear();
  bool direct = !updated_only;
  ForEachTableOf(server, begin, end, [&](int p, int32_t first, int32_t n) {
    if (!direct) return;
    const TablePlan& plan = plans[p];
    const TablePlan& data = plans[plan.data];
    float* base = ContiguousRows<float*>(plan, first, n, [&](int32_t u) -> float* {
      // One destination per id: a repeated id's row goes to several.
      return data.dst_begin[u + 1] - data.dst_begin[u] == 1 ? data.dst[data.dst_begin[u]]
                                                            : nullptr;
    });
    if (base == nullptr) direct = false;
    rows->push_back(base);
  });
  if (!direct) rows->clear();
  return direct;
}

void RoutedBatch::BuildPush(int server, v1::RowEncoding encoding,
                            v1::PushGradientsRequest* request,
                            std::vector<const float*>* direct) {
  if (direct != nullptr) direct->clear();
  for (int p = 0; p < num_plans; ++p) {
    const TablePlan& plan = plans[p];
    const int32_t n = plan.count(server);
    if (n == 0) continue;
    const int32_t begin = plan.server_begin[server];
    v1::TableGradients* table = request->add_tables();
    table->set_table(*plan.name);
    table->set_encoding(encoding);
    EncodeIds(absl::MakeConstSpan(plan.routed_ids.data() + begin, n),
              table->mutable_ids());
    const std::vector<const float*>& grad_row = plans[plan.data].grad_row;
    if (direct != nullptr) {
      const float* rows =
          encoding == v1::ROW_ENCODING_FLOAT32
              ? ContiguousRows<const float*>(plan, begin, n,
                                             [&](int32_t u) { return grad_row[u]; })
              : nullptr;
      direct->push_back(rows);
      if (rows != nullptr) continue;  // read in place by the server
    }
    std::string* grads = table->mutable_grads();
    grads->clear();
    ByteWriter writer(grads);
    AppendGrads(plan, begin, n, encoding, writer);
  }
}

size_t RoutedBatch::GradBytes(const TablePlan& plan, int32_t n, v1::RowEncoding encoding) {
  return static_cast<size_t>(n) * plan.dim * BytesPerElement(encoding);
}

void RoutedBatch::AppendGrads(const TablePlan& plan, int32_t begin, int32_t n,
                              v1::RowEncoding encoding, ByteWriter& out) {
  const std::vector<const float*>& grad_row = plans[plan.data].grad_row;
  const size_t values = static_cast<size_t>(n) * plan.dim;
  const size_t row_bytes = sizeof(float) * plan.dim;
  if (encoding == v1::ROW_ENCODING_FLOAT32) {
    // Appended row by row: a resize() first would zero the whole buffer
    // (the largest of the call) only to overwrite it, 40% of the gather's
    // time.
    out.reserve(values * sizeof(float));
    for (int32_t k = 0; k < n; ++k) {
      out.append(reinterpret_cast<const char*>(grad_row[plan.routed[begin + k]] +
                                               plan.column_offset),
                 row_bytes);
    }
    return;
  }
  // 16-bit rows through gather_, then narrowed.
  char* const to = out.Take(GradBytes(plan, n, encoding));
  if (to == nullptr) return;
  gather_.resize(values);
  char* const rows = reinterpret_cast<char*>(gather_.data());
  for (int32_t k = 0; k < n; ++k) {
    std::memcpy(rows + k * row_bytes, grad_row[plan.routed[begin + k]] + plan.column_offset,
                row_bytes);
  }
  EncodeRows(gather_.data(), values, encoding, to);
}

namespace {

using google::protobuf::internal::WireFormatLite;

using google::protobuf::io::CodedOutputStream;

template <typename Out>
void AppendVarint(uint64_t v, Out& out) {
  uint8_t bytes[10];
  const uint8_t* end = CodedOutputStream::WriteVarint64ToArray(v, bytes);
  out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(end - bytes));
}

size_t VarintSize(uint64_t v) { return CodedOutputStream::VarintSize64(v); }

// A length-delimited field's tag and length (its bytes follow).
template <typename Out>
void AppendFieldStart(int field, size_t length, Out& out) {
  AppendVarint(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED), out);
  AppendVarint(length, out);
}

size_t FieldSize(int field, size_t length) {
  return VarintSize(WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) +
         VarintSize(length) + length;
}

// Field numbers of PushGradientsRequest and TableGradients.
constexpr int kPushHeaderField = 1, kPushTablesField = 2;
constexpr int kTableNameField = 1, kTableIdsField = 2, kTableGradsField = 3,
              kTableEncodingField = 4;

}  // namespace

size_t RoutedBatch::PushBytes(int server, v1::RowEncoding encoding,
                              const v1::RequestHeader& header) const {
  size_t total = FieldSize(kPushHeaderField, header.ByteSizeLong());
  for (int p = 0; p < num_plans; ++p) {
    const int32_t n = plans[p].count(server);
    if (n > 0) total += FieldSize(kPushTablesField, PushTableBytes(plans[p], n, encoding));
  }
  return total;
}

size_t RoutedBatch::PushTableBytes(const TablePlan& plan, int32_t n, v1::RowEncoding encoding) {
  size_t size = FieldSize(kTableNameField, plan.name->size()) +
                FieldSize(kTableIdsField, static_cast<size_t>(n) * sizeof(int64_t)) +
                FieldSize(kTableGradsField, GradBytes(plan, n, encoding));
  if (encoding != 0) {
    size += VarintSize(WireFormatLite::MakeTag(kTableEncodingField,
                                               WireFormatLite::WIRETYPE_VARINT)) +
            VarintSize(encoding);
  }
  return size;
}

void RoutedBatch::SerializePush(int server, v1::RowEncoding encoding,
                                const v1::RequestHeader& header, std::string* out) {
  out->clear();
  out->reserve(PushBytes(server, encoding, header));
  ByteWriter writer(out);
  WritePush(server, encoding, header, writer);
}

absl::Status RoutedBatch::SerializePush(int server, v1::RowEncoding encoding,
                                        const v1::RequestHeader& header, char* out,
                                        size_t size) {
  ByteWriter writer(out, size);
  WritePush(server, encoding, header, writer);
  if (!writer.filled()) {
    return absl::InternalError(
        absl::StrCat("a serialized push does not fill the ", size, " bytes PushBytes gave"));
  }
  return absl::OkStatus();
}

void RoutedBatch::WritePush(int server, v1::RowEncoding encoding,
                            const v1::RequestHeader& header, ByteWriter& out) {
  const std::string head = header.SerializeAsString();
  AppendFieldStart(kPushHeaderField, head.size(), out);
  out.append(head.data(), head.size());
  for (int p = 0; p < num_plans; ++p) {
    const TablePlan& plan = plans[p];
    const int32_t n = plan.count(server);
    if (n == 0) continue;
    const int32_t begin = plan.server_begin[server];
    AppendFieldStart(kPushTablesField, PushTableBytes(plan, n, encoding), out);
    AppendFieldStart(kTableNameField, plan.name->size(), out);
    out.append(plan.name->data(), plan.name->size());
    AppendFieldStart(kTableIdsField, static_cast<size_t>(n) * sizeof(int64_t), out);
    out.append(reinterpret_cast<const char*>(plan.routed_ids.data() + begin),
               static_cast<size_t>(n) * sizeof(int64_t));
    AppendFieldStart(kTableGradsField, GradBytes(plan, n, encoding), out);
    AppendGrads(plan, begin, n, encoding, out);
    // In field order, as protobuf's own serializer writes them.
    if (encoding != 0) {
      AppendVarint(WireFormatLite::MakeTag(kTableEncodingField, WireFormatLite::WIRETYPE_VARINT),
                   out);
      AppendVarint(encoding, out);
    }
  }
}

size_t RoutedBatch::LookupResponseBound(int server, int32_t begin, int32_t end,
                                        v1::RowEncoding encoding) const {
  // incarnation, applied_step, shared_length and room for a field to come.
  size_t total = 64;
  ForEachTableOf(server, begin, end, [&](int p, int32_t, int32_t n) {
    const TablePlan& plan = plans[p];
    // TableRows: its tag and length, the name, dim, updated_only, and
    // with updated_only at most every position.
    total += 32 + FieldSize(kTableNameField, plan.name->size()) +
             FieldSize(3, GradBytes(plan, n, encoding)) +
             (updated_only ? FieldSize(4, static_cast<size_t>(n) * sizeof(int32_t)) : 0);
  });
  return total;
}


using lookup_wire::kAppliedStepTag;
using lookup_wire::kIncarnationTag;
using lookup_wire::kTablesTag;
using lookup_wire::Malformed;

absl::Status RoutedBatch::ConsumeLookup(int server, int32_t begin, int32_t end,
                                        v1::RowEncoding encoding,
                                        grpc::ByteBuffer* response,
                                        uint64_t* incarnation,
                                        std::optional<int64_t>* applied_step) const {
  if (incarnation != nullptr) *incarnation = 0;
  if (applied_step != nullptr) applied_step->reset();
  grpc::ProtoBufferReader reader(response);
  if (!reader.status().ok()) return Malformed("unreadable buffer");
  google::protobuf::io::CodedInputStream in(&reader);
  absl::InlinedVector<TableShare, 4> shares;  // the part's tables, in order
  ForEachTableOf(server, begin, end, [&](int p, int32_t first, int32_t n) {
    shares.push_back({p, first, n});
  });
  const int expected = static_cast<int>(shares.size());
  TableRowsReader tables(&in, encoding, updated_only);

  int j = 0;  // response table, in request order
  for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
    if (tag == kIncarnationTag) {
      uint64_t v;
      if (!in.ReadLittleEndian64(&v)) return Malformed("bad incarnation");
      if (incarnation != nullptr) *incarnation = v;
      continue;
    }
    if (tag == kAppliedStepTag) {
      uint64_t v;
      if (!in.ReadVarint64(&v)) return Malformed("bad applied step");
      if (applied_step != nullptr) *applied_step = static_cast<int64_t>(v);
      continue;
    }
    if (tag != kTablesTag) {
      if (!WireFormatLite::SkipField(&in, tag)) return Malformed("bad field");
      continue;
    }
    if (j == expected) {
      return absl::InternalError(absl::StrCat(
          "response has more tables than the request's ", expected));
    }
    const TablePlan& plan = plans[shares[j].plan];
    RETURN_IF_ERROR(tables.Read({plan, plans[plan.data],
                                 plan.routed.data() + shares[j].first,
                                 shares[j].n, j}));
    ++j;
  }
  if (!in.ConsumedEntireMessage()) return Malformed("bad message");
  if (j != expected) {
    return absl::InternalError(absl::StrCat("response has ", j,
                                            " tables, fewer than the "
                                            "request's ",
                                            expected));
  }
  return absl::OkStatus();
}

}  // namespace recps::client::internal
