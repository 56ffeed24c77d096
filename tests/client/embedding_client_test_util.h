// Shared by the embedding client's tests: the schema the fake servers
// serve and small helpers.
#ifndef RECPS_TESTS_CLIENT_EMBEDDING_CLIENT_TEST_UTIL_H_
#define RECPS_TESTS_CLIENT_EMBEDDING_CLIENT_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/client/fake_shard_server.h"

namespace recps::client::testing {

// The worker rank the tests call as.
inline constexpr int kRank = 3;
inline constexpr uint32_t kSlots = 64;
inline constexpr int kUser = 0;  // table indices in the client's schema
inline constexpr int kItem = 1;
inline const std::map<std::string, int> kTables = {{"user", 8}, {"item", 4}};

inline std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

// out (ids.size() x dim) holds the fake's rows, within rel_tol.
inline void ExpectFakeRows(const std::string& table,
                           const std::vector<int64_t>& ids,
                           const std::vector<float>& out, int dim,
                           float rel_tol = 0) {
  ASSERT_EQ(out.size(), ids.size() * dim);
  for (size_t i = 0; i < ids.size(); ++i) {
    for (int c = 0; c < dim; ++c) {
      const float want = FakeRowValue(table, ids[i], c);
      ASSERT_NEAR(out[i * dim + c], want, rel_tol * std::fabs(want))
          << table << " id " << ids[i] << " col " << c;
    }
  }
}

}  // namespace recps::client::testing

#endif  // RECPS_TESTS_CLIENT_EMBEDDING_CLIENT_TEST_UTIL_H_
