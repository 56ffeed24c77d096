// The per-call routing state of the embedding client: each table's distinct
// ids, where their rows go (lookup) or come from (push), and which server
// owns each in the current round.
//
// All buffers are kept across calls (the client pools RoutedBatch objects),
// so a steady training loop routes without allocating per id or per step.
#ifndef RECPS_CLIENT_ROUTED_BATCH_H_
#define RECPS_CLIENT_ROUTED_BATCH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "client/dedup.h"
#include "client/embedding_client.h"
#include "common/wire/shard_map.h"
#include "grpcpp/support/byte_buffer.h"
#include "recps/v1/shard.pb.h"

namespace recps::client::internal {

// One table of a call, or one column group of a table split column-wise
// (ShardMap::ColumnGroupsOf): then each group has a plan of its own, named
// by the group's table, that sends every id of the table to the group's
// owner and moves only the group's columns. Unique ids are named by their
// index u in dedup.unique of the table's first plan (`data`).
struct TablePlan {
  const std::string* name = nullptr;  // the table's or the group's
  uint64_t key = 0;  // StableNameKey(name)
  int dim = 0;       // columns sent and received
  int width = 0;     // floats per row in the caller's buffers
  int column_offset = 0;  // of the first column sent, in the caller's rows
  bool column_group = false;
  // Index of the plan that holds dedup, dst_begin, dst, grad_row and summed
  // for this table (itself, or its table's first group).
  int data = 0;
  Dedup dedup;  // over the ids of every spec of this table, in batch order

  // Lookup: the output rows (width floats; the plan writes its columns)
  // of unique id u are dst[dst_begin[u] .. dst_begin[u + 1]).
  std::vector<int32_t> dst_begin;
  std::vector<float*> dst;
  // Push: the gradient row (width floats) of unique id u, in the caller's
  // buffer or, when ids repeat, in `summed`.
  std::vector<const float*> grad_row;
  std::vector<float> summed;

  // Unique ids to send this round, and those to send again next round.
  std::vector<int32_t> pending;
  std::vector<int32_t> requeued;
  // This round: `pending` grouped by owning server; server s has
  // routed[server_begin[s] .. server_begin[s + 1]), routed_ids their ids.
  std::vector<int32_t> routed;
  std::vector<int64_t> routed_ids;
  std::vector<int32_t> server_begin;
  std::vector<int32_t> scratch;  // owners, CSR cursors

  int32_t count(int server) const {
    return server_begin[server + 1] - server_begin[server];
  }
};

struct RoutedBatch {
  // Dedups every table of `batch` and records where rows go; a table that
  // `map` splits column-wise gets a plan per column group. REQUIRES: the
  // specs were checked against `tables`, `map` passed
  // ShardMap::CheckWidth for every table, and `map` outlives this call's
  // use of the batch (group names point into it).
  void PrepareLookup(absl::Span<const LookupSpec> batch,
                     const std::vector<TableSchema>& tables,
                     const std::vector<uint64_t>& keys, const ShardMap& map);
  // Dedups every table of `batch`, summing the rows of repeated ids.
  void PreparePush(absl::Span<const PushSpec> batch,
                   const std::vector<TableSchema>& tables,
                   const std::vector<uint64_t>& keys, const ShardMap& map);

  // Groups the pending ids of every plan by their owner in `map`.
  // FAILED_PRECONDITION when `map` splits a table column-wise other than
  // the map the batch was prepared with (rows cannot follow mid-call).
  absl::Status Route(const ShardMap& map);
  // How many pending ids `server` (an index in the routed map) owns, over
  // all tables.
  int32_t CountFor(int server) const;

  // A part of a server's ids names positions [begin, end) of its ids of this
  // round, taken table after table in plan order (0 .. CountFor(server)); a
  // lookup part is one request.

  // Sends the ids of a part again in the next round.
  void Requeue(int server, int32_t begin, int32_t end);
  // Makes the requeued ids the pending ones.
  void NextRound();

  // Adds the tables of a part to a request whose header is already set.
  void BuildLookup(int server, int32_t begin, int32_t end,
                   v1::LookupRequest* request) const;
  // Adds all of `server`'s tables (pushes are never split). With `direct`
  // (an in-process server, InProcessShard::PushGradientsFrom), an fp32
  // table whose gradient rows lie contiguous in the caller's buffer gets
  // no grads bytes: direct receives, per table added, those rows or null.
  void BuildPush(int server, v1::RowEncoding encoding,
                 v1::PushGradientsRequest* request,
                 std::vector<const float*>* direct = nullptr);
  // The same request with `header`, serialized into `out` (cleared first):
  // the bytes BuildPush + SerializeToString give, but each table's gradient
  // rows are gathered once, straight into the serialized bytes, instead of
  // into the message and then again by its serializer (the gRPC push sends
  // `out` as it is).
  void SerializePush(int server, v1::RowEncoding encoding,
                     const v1::RequestHeader& header, std::string* out);
  // The same into `size` bytes at `out` (same-host rows), which must be
  // PushBytes(server, encoding, header) (INTERNAL when it is not).
  absl::Status SerializePush(int server, v1::RowEncoding encoding,
                             const v1::RequestHeader& header, char* out, size_t size);
  size_t PushBytes(int server, v1::RowEncoding encoding,
                   const v1::RequestHeader& header) const;
  // Bytes of n gradient rows of `plan` in `encoding`.
  static size_t GradBytes(const TablePlan& plan, int32_t n, v1::RowEncoding encoding);
  // At least the bytes of the serialized LookupResponse a server answers a
  // part with (same-host rows: the memory the server may write it to).
  size_t LookupResponseBound(int server, int32_t begin, int32_t end,
                             v1::RowEncoding encoding) const;
  // An in-process lookup part (InProcessShard::LookupInto): when the rows
  // of every table of the part go to one contiguous run of the caller's
  // buffer each (a worker's distinct ids into one buffer per table), sets
  // `rows` to those runs in request order and returns true.
  bool DirectLookupRows(int server, int32_t begin, int32_t end,
                        std::vector<float*>* rows) const;
  // Writes the rows of a part's ids from `response` (a serialized
  // LookupResponse, parsed here so that rows go from gRPC's buffers straight
  // to the caller's) to the caller's buffers. INTERNAL when the response is
  // malformed or does not match the request; the caller's rows may then be
  // partly written. Parts write disjoint bytes of the callers' buffers, so
  // the client consumes each response on the gRPC thread that received it,
  // several at once; Requeue may run meanwhile (it touches other fields).
  // `incarnation`, if set, receives LookupResponse.incarnation (0: none),
  // `applied_step` LookupResponse.applied_step (nullopt: none).
  absl::Status ConsumeLookup(int server, int32_t begin, int32_t end,
                             v1::RowEncoding encoding,
                             grpc::ByteBuffer* response,
                             uint64_t* incarnation = nullptr,
                             std::optional<int64_t>* applied_step = nullptr) const;

  std::vector<TablePlan> plans;  // only the first num_plans are in use
  int num_plans = 0;
  // Lookup: ask for LookupRequest.updated_only (set per call by the client).
  // The callers' buffers then already hold every row, and a response may
  // carry only some of them (TableRows.positions).
  bool updated_only = false;

 private:
  // Starts a plan per distinct table of the batch (first-seen order) and
  // dedups the ids; plan_of_spec_ names each spec's plan.
  template <typename Spec>
  void Dedupe(absl::Span<const Spec> batch,
              const std::vector<TableSchema>& tables,
              const std::vector<uint64_t>& keys, const ShardMap& map);

  std::vector<int> plan_of_table_;
  std::vector<int> plan_of_spec_;
  // Calls fn(plan, first, n) for each table's share of a part: the ids
  // plans[plan].routed[first .. first + n), n > 0, in plan order.
  template <typename Fn>
  void ForEachTableOf(int server, int32_t begin, int32_t end, Fn&& fn) const;

  // One table's share of a part: plans[plan].routed[first .. first + n).
  struct TableShare {
    int plan;
    int32_t first;
    int32_t n;
  };

  class ByteWriter;
  void WritePush(int server, v1::RowEncoding encoding, const v1::RequestHeader& header,
                 ByteWriter& out);
  // Bytes of one TableGradients of n ids of `plan`.
  static size_t PushTableBytes(const TablePlan& plan, int32_t n, v1::RowEncoding encoding);
  // Appends the gradient rows of routed[begin, begin + n) of `plan` to
  // `out` in `encoding` (one copy from the caller's rows).
  void AppendGrads(const TablePlan& plan, int32_t begin, int32_t n,
                   v1::RowEncoding encoding, ByteWriter& out);

  std::vector<int64_t> spec_pos_;  // per plan: next position while scattering
  std::vector<float> gather_;      // push: one server's rows of one plan
};

}  // namespace recps::client::internal

#endif  // RECPS_CLIENT_ROUTED_BATCH_H_
