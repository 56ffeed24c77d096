#include "server/shard/lookup_response.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "recps/v1/shard.pb.h"

namespace recps::server {
namespace {

// Fills a response laid out for `tables` with recognisable rows and checks
// it against what the generated code serializes for the same content.
void ExpectSameAsGenerated(std::vector<SerializedLookupResponse::Table> tables) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  SerializedLookupResponse response;
  ASSERT_TRUE(response.Init(*pool, tables).ok());
  v1::LookupResponse expected;
  for (size_t i = 0; i < tables.size(); ++i) {
    std::string rows(tables[i].rows_bytes, '\0');
    for (size_t b = 0; b < rows.size(); ++b) rows[b] = static_cast<char>(b * 7 + i);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(response.rows(i)) % 64, 0u);
    if (!rows.empty()) std::memcpy(response.rows(i), rows.data(), rows.size());
    v1::TableRows* t = expected.add_tables();
    t->set_table(std::string(tables[i].name));
    t->set_dim(tables[i].dim);
    t->set_rows(rows);
  }
  EXPECT_EQ(response.ToString(), expected.SerializeAsString());
}

TEST(SerializedLookupResponseTest, MatchesGeneratedCode) {
  ExpectSameAsGenerated({{"t", 64, 64 * 4 * 3}});
  // Several tables, rows of one and of 200 bytes (one- and two-byte length
  // varints), a name over 127 characters, an empty table.
  ExpectSameAsGenerated({{"user", 1, 4}, {"item", 50, 200}, {"none", 8, 0}});
  ExpectSameAsGenerated({{std::string(130, 'n'), 300, 300 * 4 * 1000}});
}

TEST(SerializedLookupResponseTest, NoTables) { ExpectSameAsGenerated({}); }

// The incarnation and the applied step come after the tables, in field
// order, as the generated code writes them; -1 (none applied yet) takes a
// ten-byte varint, 0 is written too (the field has presence).
TEST(SerializedLookupResponseTest, IncarnationAndAppliedStepMatchGeneratedCode) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  for (const int64_t step : {int64_t{-1}, int64_t{0}, int64_t{300}}) {
    SerializedLookupResponse response;
    ASSERT_TRUE(response.Init(*pool, {{"t", 1, 4}}, 0x1234, step).ok());
    std::memset(response.rows(0), 7, 4);
    v1::LookupResponse expected;
    v1::TableRows* t = expected.add_tables();
    t->set_table("t");
    t->set_dim(1);
    t->set_rows(std::string(4, '\7'));
    expected.set_incarnation(0x1234);
    expected.set_applied_step(step);
    EXPECT_EQ(response.ToString(), expected.SerializeAsString()) << step;
  }
  // Without one (the default), no field: an older server's answer.
  SerializedLookupResponse response;
  ASSERT_TRUE(response.Init(*pool, {}).ok());
  v1::LookupResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(response.ToString()));
  EXPECT_FALSE(parsed.has_applied_step());
}

// An updated_only answer: the generated code reads the flag, the positions
// and the rows, and positions come before rows (the client places rows as
// they arrive).
TEST(SerializedLookupResponseTest, UpdatedOnlyAnswerWritesPositionsBeforeRows) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  const std::vector<int32_t> positions = {0, 5};
  SerializedLookupResponse::Table t{"t", 4, 2 * 4 * 4};
  t.updated_only = true;
  t.positions = absl::string_view(reinterpret_cast<const char*>(positions.data()),
                                  positions.size() * sizeof(int32_t));
  SerializedLookupResponse response;
  ASSERT_TRUE(response.Init(*pool, {t}).ok());
  std::memset(response.rows(0), 0x3f, t.rows_bytes);
  const std::string bytes = response.ToString();
  v1::LookupResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.tables_size(), 1);
  EXPECT_TRUE(parsed.tables(0).updated_only());
  EXPECT_EQ(parsed.tables(0).positions(), std::string(t.positions));
  EXPECT_EQ(parsed.tables(0).rows(), std::string(t.rows_bytes, '\x3f'));
  EXPECT_LT(bytes.find(std::string(t.positions)), bytes.find(std::string(8, '\x3f')));
}

TEST(SerializedLookupResponseTest, ReusesBuffersAcrossResponses) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  const char* first = nullptr;
  {
    SerializedLookupResponse response;
    ASSERT_TRUE(response.Init(*pool, {{{"t", 64, 1 << 20}}}).ok());
    first = response.data();
  }
  SerializedLookupResponse response;
  ASSERT_TRUE(response.Init(*pool, {{{"t", 64, 1 << 16}}}).ok());
  EXPECT_EQ(response.data(), first);
}

// Same-host rows: written into the caller's memory as one run, the message
// is the same bytes; memory too small for it is left alone.
TEST(SerializedLookupResponseTest, WritesIntoCallerMemoryAsOneRun) {
  auto pool = BufferPool::Create(size_t{64} << 20);
  const std::vector<SerializedLookupResponse::Table> tables = {
      {"user", 3, 3 * 4 * 5, false, {}}, {"item", 50, 50 * 4 * 7, false, {}}};
  auto fill = [&](SerializedLookupResponse& r) {
    for (size_t i = 0; i < tables.size(); ++i) {
      for (size_t b = 0; b < tables[i].rows_bytes; ++b) {
        r.rows(static_cast<int>(i))[b] = static_cast<char>(b * 3 + i);
      }
    }
  };
  SerializedLookupResponse pooled;
  ASSERT_TRUE(pooled.Init(*pool, tables, 0x42, 9).ok());
  fill(pooled);
  EXPECT_FALSE(pooled.in_external_memory());

  std::vector<char> memory(4096, '\x7f');
  SerializedLookupResponse shared;
  shared.WriteInto(memory.data(), memory.size());
  ASSERT_TRUE(shared.Init(*pool, tables, 0x42, 9).ok());
  fill(shared);
  ASSERT_TRUE(shared.in_external_memory());
  const std::string expected = pooled.ToString();
  ASSERT_EQ(shared.message_bytes(), expected.size());
  EXPECT_EQ(std::string(memory.data(), shared.message_bytes()), expected);
  EXPECT_EQ(memory[shared.message_bytes()], '\x7f');  // nothing written past it

  std::vector<char> small(expected.size() - 1, '\x7f');
  SerializedLookupResponse too_small;
  too_small.WriteInto(small.data(), small.size());
  ASSERT_TRUE(too_small.Init(*pool, tables, 0x42, 9).ok());
  fill(too_small);
  EXPECT_FALSE(too_small.in_external_memory());
  EXPECT_EQ(too_small.ToString(), expected);
  EXPECT_EQ(small, std::vector<char>(expected.size() - 1, '\x7f'));
}

TEST(SerializedLookupResponseTest, RefusesMessagesOverTwoGigabytes) {
  auto pool = BufferPool::Create(0);
  SerializedLookupResponse response;
  const absl::Status s =
      response.Init(*pool, {{{"t", 64, size_t{1} << 31}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

}  // namespace
}  // namespace recps::server
