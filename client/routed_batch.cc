#include "client/routed_batch.h"

#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/half.h"
#include "common/wire_format.h"

namespace recps::client::internal {
namespace {

// One row from the wire into `out`. REQUIRES: encoding is FLOAT32, FLOAT16 or
// BFLOAT16 (the client normalises UNSPECIFIED).
void DecodeRow(const char* src, int dim, v1::RowEncoding encoding, float* out) {
  if (encoding == v1::ROW_ENCODING_FLOAT32) {
    std::memcpy(out, src, sizeof(float) * dim);
    return;
  }
  const bool fp16 = encoding == v1::ROW_ENCODING_FLOAT16;
  for (int c = 0; c < dim; ++c) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * c, 2);
    out[c] = fp16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
  }
}

}  // namespace

template <typename Spec>
void RoutedBatch::Dedupe(absl::Span<const Spec> batch,
                         const std::vector<TableSchema>& tables,
                         const std::vector<uint64_t>& keys) {
  plan_of_table_.assign(tables.size(), -1);
  plan_of_spec_.resize(batch.size());
  num_plans = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Spec& spec = batch[i];
    int& p = plan_of_table_[spec.table];
    if (p < 0) {
      p = num_plans++;
      if (static_cast<int>(plans.size()) < num_plans) plans.emplace_back();
      TablePlan& plan = plans[p];
      plan.name = &tables[spec.table].name;
      plan.key = keys[spec.table];
      plan.dim = tables[spec.table].dim;
      Deduplicate(spec.ids, &plan.dedup);
    } else {
      DeduplicateAppend(spec.ids, &plans[p].dedup);
    }
    plan_of_spec_[i] = p;
  }
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    plan.pending.resize(plan.dedup.unique.size());
    std::iota(plan.pending.begin(), plan.pending.end(), 0);
    plan.requeued.clear();
  }
  spec_pos_.assign(num_plans, 0);
}

void RoutedBatch::PrepareLookup(absl::Span<const LookupSpec> batch,
                                const std::vector<TableSchema>& tables,
                                const std::vector<uint64_t>& keys) {
  Dedupe(batch, tables, keys);
  // Group output positions by unique id (a counting sort on the inverse
  // map), so a returned row is written to all its positions at once.
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
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
      plan.dst[plan.scratch[inverse[j]]++] = batch[i].out + j * plan.dim;
    }
    spec_pos_[p] += batch[i].ids.size();
  }
}

void RoutedBatch::PreparePush(absl::Span<const PushSpec> batch,
                              const std::vector<TableSchema>& tables,
                              const std::vector<uint64_t>& keys) {
  Dedupe(batch, tables, keys);
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    plan.grad_row.resize(plan.dedup.unique.size());
    plan.summed.clear();
    if (plan.dedup.unique.size() < plan.dedup.inverse.size()) {
      plan.summed.assign(plan.dedup.unique.size() * plan.dim, 0.0f);
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    const int p = plan_of_spec_[i];
    TablePlan& plan = plans[p];
    const int32_t* inverse = plan.dedup.inverse.data() + spec_pos_[p];
    for (size_t j = 0; j < batch[i].ids.size(); ++j) {
      const float* row = batch[i].grads + j * plan.dim;
      if (plan.summed.empty()) {
        // Distinct ids (the documented case): send the caller's rows.
        plan.grad_row[inverse[j]] = row;
      } else {
        float* sum = plan.summed.data() + inverse[j] * plan.dim;
        for (int c = 0; c < plan.dim; ++c) sum[c] += row[c];
      }
    }
    spec_pos_[p] += batch[i].ids.size();
  }
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    if (plan.summed.empty()) continue;
    for (size_t u = 0; u < plan.grad_row.size(); ++u) {
      plan.grad_row[u] = plan.summed.data() + u * plan.dim;
    }
  }
}

void RoutedBatch::Route(const ShardMap& map) {
  const int num_servers = map.num_servers();
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    const size_t n = plan.pending.size();
    const int64_t* unique = plan.dedup.unique.data();
    // Counting sort of the pending ids by owner; owners go to scratch.
    plan.server_begin.assign(num_servers + 1, 0);
    plan.scratch.resize(n + num_servers);
    int32_t* owner = plan.scratch.data();
    for (size_t k = 0; k < n; ++k) {
      owner[k] = map.OwnerOf(plan.key, unique[plan.pending[k]]);
      ++plan.server_begin[owner[k] + 1];
    }
    std::partial_sum(plan.server_begin.begin(), plan.server_begin.end(),
                     plan.server_begin.begin());
    int32_t* cursor = owner + n;
    std::copy(plan.server_begin.begin(), plan.server_begin.end() - 1, cursor);
    plan.routed.resize(n);
    plan.routed_ids.resize(n);
    for (size_t k = 0; k < n; ++k) {
      const int32_t at = cursor[owner[k]]++;
      plan.routed[at] = plan.pending[k];
      plan.routed_ids[at] = unique[plan.pending[k]];
    }
  }
}

bool RoutedBatch::HasIds(int server) const {
  for (int p = 0; p < num_plans; ++p) {
    if (plans[p].count(server) > 0) return true;
  }
  return false;
}

void RoutedBatch::Requeue(int server) {
  for (int p = 0; p < num_plans; ++p) {
    TablePlan& plan = plans[p];
    plan.requeued.insert(plan.requeued.end(),
                         plan.routed.begin() + plan.server_begin[server],
                         plan.routed.begin() + plan.server_begin[server + 1]);
  }
}

void RoutedBatch::NextRound() {
  for (int p = 0; p < num_plans; ++p) {
    plans[p].pending.swap(plans[p].requeued);
    plans[p].requeued.clear();
  }
}

void RoutedBatch::BuildLookup(int server, v1::LookupRequest* request) const {
  for (int p = 0; p < num_plans; ++p) {
    const TablePlan& plan = plans[p];
    const int32_t n = plan.count(server);
    if (n == 0) continue;
    v1::TableIds* table = request->add_tables();
    table->set_table(*plan.name);
    EncodeIds(absl::MakeConstSpan(
                  plan.routed_ids.data() + plan.server_begin[server], n),
              table->mutable_ids());
  }
}

void RoutedBatch::BuildPush(int server, v1::RowEncoding encoding,
                            v1::PushGradientsRequest* request) {
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
    gather_.resize(static_cast<size_t>(n) * plan.dim);
    for (int32_t k = 0; k < n; ++k) {
      std::memcpy(gather_.data() + static_cast<size_t>(k) * plan.dim,
                  plan.grad_row[plan.routed[begin + k]],
                  sizeof(float) * plan.dim);
    }
    EncodeRows(gather_.data(), gather_.size(), encoding,
               table->mutable_grads());
  }
}

absl::Status RoutedBatch::ConsumeLookup(
    int server, v1::RowEncoding encoding,
    const v1::LookupResponse& response) const {
  int j = 0;  // response table, in request order
  for (int p = 0; p < num_plans; ++p) {
    const TablePlan& plan = plans[p];
    const int32_t n = plan.count(server);
    if (n == 0) continue;
    if (j == response.tables_size()) {
      return absl::InternalError(absl::StrCat("response has ",
                                              response.tables_size(),
                                              " tables, fewer than "
                                              "the request"));
    }
    const v1::TableRows& rows = response.tables(j++);
    if (rows.table() != *plan.name || rows.dim() != plan.dim) {
      return absl::InternalError(absl::StrCat(
          "response table ", j - 1, " is '", rows.table(), "' of dim ",
          rows.dim(), ", expected '", *plan.name, "' of dim ", plan.dim));
    }
    const size_t row_bytes =
        static_cast<size_t>(plan.dim) * BytesPerElement(encoding);
    if (rows.rows().size() != row_bytes * n) {
      return absl::InternalError(absl::StrCat(
          "table '", *plan.name, "': ", rows.rows().size(),
          " bytes of rows for ", n, " ids of ", row_bytes, " bytes"));
    }
    const int32_t* routed = plan.routed.data() + plan.server_begin[server];
    for (int32_t k = 0; k < n; ++k) {
      const char* src = rows.rows().data() + k * row_bytes;
      const int32_t u = routed[k];
      // Every unique id has at least one position; repeats copy the first.
      float* first = plan.dst[plan.dst_begin[u]];
      DecodeRow(src, plan.dim, encoding, first);
      for (int32_t d = plan.dst_begin[u] + 1; d < plan.dst_begin[u + 1]; ++d) {
        std::memcpy(plan.dst[d], first, sizeof(float) * plan.dim);
      }
    }
  }
  if (j != response.tables_size()) {
    return absl::InternalError(absl::StrCat("response has ",
                                            response.tables_size(),
                                            " tables, more than the request"));
  }
  return absl::OkStatus();
}

}  // namespace recps::client::internal
