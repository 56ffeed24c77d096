// Calls of an in-process ShardServer for its tests: request builders
// (epoch 3 by default) and synchronous Lookup / PushGradients.
#ifndef RECPS_TESTS_SERVER_SHARD_SHARD_SERVER_CALLS_H_
#define RECPS_TESTS_SERVER_SHARD_SHARD_SERVER_CALLS_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "common/wire/wire_format.h"
#include "recps/v1/shard.pb.h"
#include "server/shard/lookup_response.h"
#include "server/shard/shard_server.h"

namespace recps::server::shard_calls {

inline constexpr char kSelf[] = "127.0.0.1:1";

inline v1::RequestHeader Header(int64_t step = 0, int rank = 0, uint64_t epoch = 3) {
  v1::RequestHeader h;
  h.set_shard_map_epoch(epoch);
  h.set_step(step);
  h.set_worker_rank(rank);
  return h;
}

inline std::string Ids(std::vector<int64_t> ids) {
  std::string s;
  EncodeIds(ids, &s);
  return s;
}

inline std::string Floats(std::vector<float> v) {
  std::string s;
  EncodeRows(v.data(), v.size(), v1::ROW_ENCODING_FLOAT32, &s);
  return s;
}

// Also checks that the hand-serialized response parses as a
// v1::LookupResponse.
inline absl::Status LookupSync(ShardServer& server, const v1::LookupRequest& req,
                        v1::LookupResponse* resp) {
  absl::Notification done;
  absl::Status status;
  SerializedLookupResponse serialized;
  server.Lookup(&req, &serialized, [&](absl::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  if (status.ok() && !resp->ParseFromString(serialized.ToString())) {
    return absl::InternalError("the lookup response does not parse");
  }
  return status;
}

inline absl::Status PushSync(ShardServer& server, const v1::PushGradientsRequest& req) {
  absl::Notification done;
  absl::Status status;
  v1::PushGradientsResponse resp;
  server.PushGradients(&req, &resp, [&](absl::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

inline v1::LookupRequest Lookup(const std::string& table, std::vector<int64_t> ids,
                         int64_t step = 0) {
  v1::LookupRequest req;
  *req.mutable_header() = Header(step);
  auto* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Ids(ids));
  return req;
}

inline v1::PushGradientsRequest Push(const std::string& table, std::vector<int64_t> ids,
                              std::vector<float> grads, int64_t step = 0) {
  v1::PushGradientsRequest req;
  *req.mutable_header() = Header(step);
  auto* t = req.add_tables();
  t->set_table(table);
  t->set_ids(Ids(ids));
  t->set_grads(Floats(grads));
  return req;
}

inline std::vector<float> RowsOf(const v1::LookupResponse& resp, int i = 0) {
  const std::string& b = resp.tables(i).rows();
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

}  // namespace recps::server::shard_calls

#endif  // RECPS_TESTS_SERVER_SHARD_SHARD_SERVER_CALLS_H_
