// A deterministic toy job for shard-server process tests: two tables
// ("user", dynamic, Adagrad; "item", 1000 fixed rows, SGD), the ids each
// worker looks up and pushes at each step, and gradients that depend on
// the rows it read, so that any difference between runs shows in the rows.
#ifndef RECPS_TESTS_SERVER_SHARD_TOY_JOB_H_
#define RECPS_TESTS_SERVER_SHARD_TOY_JOB_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "client/embedding_client.h"
#include "common/hashing.h"
#include "gtest/gtest.h"

namespace recps::testing {

using client::EmbeddingClient;
using client::LookupSpec;
using client::PushSpec;

inline constexpr int kDim = 8;
inline constexpr uint32_t kSlots = 256;

inline constexpr char kTables[] = R"(
tables {
  name: "user"
  dim: 8
  optimizer { kind: ADAGRAD learning_rate: 0.1 }
}
tables {
  name: "item"
  dim: 8
  num_rows: 1000
  optimizer { kind: SGD learning_rate: 0.05 }
}
)";

// Ids of a deterministic toy job: step s, worker r.
inline std::vector<int64_t> UserIds(int step, int rank) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 40; ++i) {
    ids.push_back(static_cast<int64_t>(Mix64(step * 131 + rank * 17 + i) % 97) -
                  48 + (i % 3 == 0 ? (int64_t{1} << 40) : 0));
  }
  return ids;
}
inline std::vector<int64_t> ItemIds(int step, int rank) {
  std::vector<int64_t> ids;
  for (int i = 0; i < 25; ++i) ids.push_back((step * 7 + rank * 3 + i * 11) % 1000);
  return ids;
}

inline std::vector<int64_t> Unique(std::vector<int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// Points of a worker's step where a test may act (kill a server, hold a
// rank back); empty ones are skipped.
struct WorkerHooks {
  std::function<void(int step)> before_push;
  std::function<void(int step)> after_push;
};

// Runs `steps` steps of the toy job for worker `rank`: look up, push a
// gradient that depends on the rows it saw.
inline void RunWorker(EmbeddingClient& client, int rank, int steps,
                      const WorkerHooks& hooks = {}) {
  for (int step = 0; step < steps; ++step) {
    std::vector<int64_t> users = Unique(UserIds(step, rank));
    std::vector<int64_t> items = Unique(ItemIds(step, rank));
    std::vector<float> user_rows(users.size() * kDim), item_rows(items.size() * kDim);
    std::vector<LookupSpec> lookups = {{0, users, user_rows.data()},
                                       {1, items, item_rows.data()}};
    const absl::Status looked = client.Lookup(step, lookups);
    ASSERT_TRUE(looked.ok()) << looked;
    // Gradient = row * 0.5 + 0.01 * (rank + 1): deterministic in the rows.
    for (float& v : user_rows) v = v * 0.5f + 0.01f * (rank + 1);
    for (float& v : item_rows) v = v * -0.25f + 0.02f;
    std::vector<PushSpec> pushes = {{0, users, user_rows.data()},
                                    {1, items, item_rows.data()}};
    if (hooks.before_push) hooks.before_push(step);
    absl::Status s = client.PushGradients(step, pushes);
    ASSERT_TRUE(s.ok()) << s;
    if (hooks.after_push) hooks.after_push(step);
  }
}

// Every row the job touched, read at step `steps` (after the last step).
inline std::vector<float> ReadAll(EmbeddingClient& client, int world, int steps) {
  std::vector<int64_t> users, items;
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) {
      for (int64_t id : UserIds(s, r)) users.push_back(id);
      for (int64_t id : ItemIds(s, r)) items.push_back(id);
    }
  }
  users = Unique(users);
  items = Unique(items);
  std::vector<float> out((users.size() + items.size()) * kDim);
  std::vector<LookupSpec> lookups = {{0, users, out.data()},
                                     {1, items, out.data() + users.size() * kDim}};
  const absl::Status read = client.Lookup(steps, lookups);
  EXPECT_TRUE(read.ok()) << read;
  return out;
}

}  // namespace recps::testing

#endif  // RECPS_TESTS_SERVER_SHARD_TOY_JOB_H_
