// Parsing Lookup responses straight from gRPC slices into the callers'
// buffers (RoutedBatch::ConsumeLookup).
#include "client/routed_batch.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/wire/wire_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "tests/client/embedding_client_test_util.h"
#include "tests/client/fake_shard_server.h"

namespace recps::client {
namespace {

using ::recps::client::testing::ExpectFakeRows;
using ::recps::client::testing::FakeRowValue;
using ::testing::HasSubstr;

class ConsumeLookupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    map_ = ShardMap::Uniform(1, 16, {"only:1"});
    batch_.PrepareLookup(
        std::vector<LookupSpec>{{0, users_, out_u_.data()},
                                {1, items_, out_i_.data()}},
        tables_, keys_, map_);
    ASSERT_TRUE(batch_.Route(map_).ok());
    ASSERT_EQ(batch_.CountFor(0), 5);  // users 10 11 12, then items 20 21
  }

  // Wire bytes of a TableRows.
  static std::string TableRows(const std::string& table, int dim,
                               const std::string& rows, bool reorder = false,
                               bool unknown = false) {
    std::string out;
    {
      google::protobuf::io::StringOutputStream stream(&out);
      google::protobuf::io::CodedOutputStream o(&stream);
      auto name = [&] {
        o.WriteTag(WFL::MakeTag(1, WFL::WIRETYPE_LENGTH_DELIMITED));
        o.WriteVarint32(table.size());
        o.WriteString(table);
      };
      auto dims = [&] {
        o.WriteTag(WFL::MakeTag(2, WFL::WIRETYPE_VARINT));
        o.WriteVarint32(dim);
      };
      auto data = [&] {
        o.WriteTag(WFL::MakeTag(3, WFL::WIRETYPE_LENGTH_DELIMITED));
        o.WriteVarint32(rows.size());
        o.WriteString(rows);
      };
      if (unknown) {
        o.WriteTag(WFL::MakeTag(9, WFL::WIRETYPE_FIXED32));
        o.WriteLittleEndian32(77);
      }
      if (reorder) {
        data();
        dims();
        name();
      } else {
        name();
        dims();
        data();
      }
    }
    return out;
  }

  // Wire bytes of a LookupResponse with these TableRows.
  static std::string Response(const std::vector<std::string>& tables,
                              bool unknown = false) {
    std::string out;
    {
      google::protobuf::io::StringOutputStream stream(&out);
      google::protobuf::io::CodedOutputStream o(&stream);
      if (unknown) {
        o.WriteTag(WFL::MakeTag(7, WFL::WIRETYPE_VARINT));
        o.WriteVarint64(123456789);
      }
      for (const std::string& t : tables) {
        o.WriteTag(WFL::MakeTag(1, WFL::WIRETYPE_LENGTH_DELIMITED));
        o.WriteVarint32(t.size());
        o.WriteString(t);
      }
    }
    return out;
  }

  // The fake's rows of `ids`, encoded.
  static std::string Rows(const std::string& table, int dim,
                          const std::vector<int64_t>& ids,
                          v1::RowEncoding encoding) {
    std::vector<float> values;
    for (int64_t id : ids) {
      for (int c = 0; c < dim; ++c) values.push_back(FakeRowValue(table, id, c));
    }
    std::string out;
    EncodeRows(values.data(), values.size(), encoding, &out);
    return out;
  }

  absl::Status Consume(int32_t begin, int32_t end, const std::string& wire,
                       v1::RowEncoding encoding = v1::ROW_ENCODING_FLOAT32,
                       size_t slice = 7) {
    std::vector<grpc::Slice> slices;
    for (size_t at = 0; at < wire.size(); at += slice) {
      slices.emplace_back(wire.data() + at, std::min(slice, wire.size() - at));
    }
    grpc::ByteBuffer buffer(slices.data(), slices.size());
    return batch_.ConsumeLookup(0, begin, end, encoding, &buffer);
  }

  using WFL = google::protobuf::internal::WireFormatLite;
  const std::vector<TableSchema> tables_ = {{"user", 8}, {"item", 4}};
  const std::vector<uint64_t> keys_ = {StableNameKey("user"),
                                       StableNameKey("item")};
  const std::vector<int64_t> users_ = {10, 11, 12, 10};
  const std::vector<int64_t> items_ = {20, 21};
  std::vector<float> out_u_ = std::vector<float>(4 * 8, -1.0f);
  std::vector<float> out_i_ = std::vector<float>(2 * 4, -1.0f);
  ShardMap map_;
  internal::RoutedBatch batch_;
};

TEST_F(ConsumeLookupTest, WholeServerAcrossSlices) {
  const auto f32 = v1::ROW_ENCODING_FLOAT32;
  ASSERT_TRUE(
      Consume(0, 5,
              Response({TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f32)),
                        TableRows("item", 4, Rows("item", 4, {20, 21}, f32))}))
          .ok());
  ExpectFakeRows("user", users_, out_u_, 8);
  ExpectFakeRows("item", items_, out_i_, 4);
}

// Rows that lie whole in one slice are copied in runs straight from it
// (repeats included); a row split across slices is read on its own. Slices
// of 1 MiB, 40 and 33 bytes mix both paths.
TEST_F(ConsumeLookupTest, RowsWholeInASliceAndSplitAcrossSlices) {
  const auto f32 = v1::ROW_ENCODING_FLOAT32;
  for (size_t slice : {size_t{1} << 20, size_t{40}, size_t{33}}) {
    std::fill(out_u_.begin(), out_u_.end(), -1.0f);
    std::fill(out_i_.begin(), out_i_.end(), -1.0f);
    ASSERT_TRUE(
        Consume(0, 5,
                Response({TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f32)),
                          TableRows("item", 4, Rows("item", 4, {20, 21}, f32))}),
                f32, slice)
            .ok())
        << slice;
    ExpectFakeRows("user", users_, out_u_, 8);
    ExpectFakeRows("item", items_, out_i_, 4);
  }
}

TEST_F(ConsumeLookupTest, PartSpanningTwoTablesWithUnknownFieldsAndOddOrder) {
  const auto f32 = v1::ROW_ENCODING_FLOAT32;
  // Part [2, 4): user 12, then item 20.
  ASSERT_TRUE(Consume(2, 4,
                      Response({TableRows("user", 8, Rows("user", 8, {12}, f32),
                                          /*reorder=*/true, /*unknown=*/true),
                                TableRows("item", 4, Rows("item", 4, {20}, f32),
                                          false, true)},
                               /*unknown=*/true),
                      f32, /*slice=*/3)
                  .ok());
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(out_u_[2 * 8 + c], FakeRowValue("user", 12, c));
    EXPECT_EQ(out_u_[0 * 8 + c], -1.0f);  // not in the part
  }
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(out_i_[c], FakeRowValue("item", 20, c));
    EXPECT_EQ(out_i_[4 + c], -1.0f);
  }
}

// LookupResponse.incarnation and .applied_step, after the tables as a
// server writes them; an older server's answer has no applied step.
TEST_F(ConsumeLookupTest, IncarnationAndAppliedStep) {
  const auto f32 = v1::ROW_ENCODING_FLOAT32;
  for (const int64_t step : {int64_t{-1}, int64_t{0}, int64_t{123456}}) {
    v1::LookupResponse answer;
    ASSERT_TRUE(answer.ParseFromString(
        Response({TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f32)),
                  TableRows("item", 4, Rows("item", 4, {20, 21}, f32))})));
    answer.set_incarnation(99);
    answer.set_applied_step(step);
    grpc::Slice slice(answer.SerializeAsString());
    grpc::ByteBuffer buffer(&slice, 1);
    uint64_t incarnation = 0;
    std::optional<int64_t> applied;
    ASSERT_TRUE(batch_.ConsumeLookup(0, 0, 5, f32, &buffer, &incarnation, &applied).ok());
    EXPECT_EQ(incarnation, 99u);
    EXPECT_EQ(applied, step);
  }
  grpc::Slice slice(Response({TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f32)),
                              TableRows("item", 4, Rows("item", 4, {20, 21}, f32))}));
  grpc::ByteBuffer buffer(&slice, 1);
  std::optional<int64_t> applied = 5;
  ASSERT_TRUE(batch_.ConsumeLookup(0, 0, 5, f32, &buffer, nullptr, &applied).ok());
  EXPECT_EQ(applied, std::nullopt);
}

TEST_F(ConsumeLookupTest, HalfPrecisionRowsAcrossSlices) {
  const auto f16 = v1::ROW_ENCODING_FLOAT16;
  ASSERT_TRUE(
      Consume(0, 5,
              Response({TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f16)),
                        TableRows("item", 4, Rows("item", 4, {20, 21}, f16))}),
              f16, /*slice=*/5)
          .ok());
  ExpectFakeRows("user", users_, out_u_, 8, 1.0f / 2048);
  ExpectFakeRows("item", items_, out_i_, 4, 1.0f / 2048);
}

TEST_F(ConsumeLookupTest, MismatchesAndMalformedBytesAreInternal) {
  const auto f32 = v1::ROW_ENCODING_FLOAT32;
  const std::string user = TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f32));
  const std::string item = TableRows("item", 4, Rows("item", 4, {20, 21}, f32));
  auto expect_internal = [&](absl::Status s, const std::string& what) {
    EXPECT_TRUE(absl::IsInternal(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr(what)) << s;
  };
  expect_internal(Consume(0, 5, Response({user})), "fewer");
  expect_internal(Consume(0, 5, Response({user, item, item})), "more tables");
  expect_internal(Consume(0, 5, Response({item, user})), "expected 'user'");
  expect_internal(
      Consume(0, 5, Response({TableRows("user", 9, Rows("user", 8, {10, 11, 12}, f32)), item})),
      "of dim 9");
  expect_internal(
      Consume(0, 5, Response({TableRows("user", 8, Rows("user", 8, {10, 11}, f32)), item})),
      "bytes of rows for 3 ids");
  expect_internal(Consume(0, 5, Response({TableRows("user", 8, ""), item})),
                  "0 bytes of rows");
  std::string whole = Response({user, item});
  expect_internal(Consume(0, 5, whole.substr(0, whole.size() - 9)),
                  "malformed");
}

// The client consumes each response on the gRPC thread that received it,
// several at once: two parts of one batch, consumed concurrently (mixed
// encodings, so that each needs its own scratch), write only their own rows.
TEST_F(ConsumeLookupTest, PartsConsumedConcurrently) {
  const auto f32 = v1::ROW_ENCODING_FLOAT32;
  const auto f16 = v1::ROW_ENCODING_FLOAT16;
  const std::string users =
      Response({TableRows("user", 8, Rows("user", 8, {10, 11, 12}, f16))});
  const std::string items =
      Response({TableRows("item", 4, Rows("item", 4, {20, 21}, f32))});
  for (int round = 0; round < 200; ++round) {
    std::fill(out_u_.begin(), out_u_.end(), -1.0f);
    std::fill(out_i_.begin(), out_i_.end(), -1.0f);
    absl::Status user_status;
    absl::Status item_status;
    std::atomic<int> ready{0};
    auto consume = [&](int32_t begin, int32_t end, const std::string& wire,
                       v1::RowEncoding encoding, absl::Status* status) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      *status = Consume(begin, end, wire, encoding, /*slice=*/5);
    };
    std::thread user_thread(consume, 0, 3, std::cref(users), f16, &user_status);
    std::thread item_thread(consume, 3, 5, std::cref(items), f32, &item_status);
    user_thread.join();
    item_thread.join();
    ASSERT_TRUE(user_status.ok()) << user_status;
    ASSERT_TRUE(item_status.ok()) << item_status;
    ExpectFakeRows("user", users_, out_u_, 8, 1.0f / 2048);
    ExpectFakeRows("item", items_, out_i_, 4);
  }
}


// The gRPC push's bytes (SerializePush, rows gathered once straight into
// them) are exactly protobuf's serialization of the request BuildPush
// makes, for each server of a two-server map, repeated ids summed, in
// fp32 and 16-bit.
TEST(SerializePushTest, MatchesTheMessageBuildPushMakesByteForByte) {
  const ShardMap map = ShardMap::Uniform(1, 16, {"a:1", "b:1"});
  const std::vector<TableSchema> tables = {{"user", 8}, {"item", 3}};
  const std::vector<uint64_t> keys = {StableNameKey("user"), StableNameKey("item")};
  std::vector<int64_t> users, items;
  for (int64_t id = 0; id < 40; ++id) users.push_back(id * 7919 % 1000);
  users.push_back(users[3]);  // a repeated id: summed
  for (int64_t id = 0; id < 25; ++id) items.push_back(id * 31);
  std::vector<float> user_grads(users.size() * 8), item_grads(items.size() * 3);
  for (size_t i = 0; i < user_grads.size(); ++i) user_grads[i] = 0.001f * static_cast<float>(i);
  for (size_t i = 0; i < item_grads.size(); ++i) item_grads[i] = -0.002f * static_cast<float>(i);
  const std::vector<PushSpec> specs = {{0, users, user_grads.data()},
                                       {1, items, item_grads.data()}};
  v1::RequestHeader header;
  header.set_shard_map_epoch(1);
  header.set_step(17);
  header.set_worker_rank(1);
  header.set_push_part(0x1234567890abcdefULL);
  header.set_incarnation(99);
  for (v1::RowEncoding encoding : {v1::ROW_ENCODING_FLOAT32, v1::ROW_ENCODING_FLOAT16,
                                   v1::ROW_ENCODING_BFLOAT16}) {
    internal::RoutedBatch batch;
    batch.PreparePush(specs, tables, keys, map);
    ASSERT_TRUE(batch.Route(map).ok());
    for (int server = 0; server < 2; ++server) {
      ASSERT_GT(batch.CountFor(server), 0);
      v1::PushGradientsRequest request;
      *request.mutable_header() = header;
      batch.BuildPush(server, encoding, &request);
      std::string want;
      ASSERT_TRUE(request.SerializeToString(&want));
      std::string got;
      batch.SerializePush(server, encoding, header, &got);
      EXPECT_EQ(got, want) << "server " << server << ", encoding " << encoding;
    }
  }
}

}  // namespace
}  // namespace recps::client
