#include "worker/data/criteo.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/worker/data_test_util.h"
#include "worker/data/batch.h"
#include "worker/data/synthetic.h"

namespace recps::worker {
namespace {

using ::recps::worker::data_testing::ExpectBatchEq;
using ::recps::worker::data_testing::ExpectWellFormed;
using ::recps::worker::data_testing::SampleOf;

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/criteo_", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// A Criteo line: label, 13 dense fields, 26 categorical fields.
std::string Line(const std::string& label, std::vector<std::string> dense,
                 std::vector<std::string> cats) {
  dense.resize(13);
  cats.resize(26);
  return absl::StrCat(label, "\t", absl::StrJoin(dense, "\t"), "\t",
                      absl::StrJoin(cats, "\t"), "\n");
}

std::unique_ptr<CriteoSource> Open(const CriteoConfig& config, int rank = 0,
                                   int world = 1, int64_t batch = 100) {
  auto source = CriteoSource::Create(config, rank, world, batch);
  EXPECT_TRUE(source.ok()) << source.status();
  return source.ok() ? *std::move(source) : nullptr;
}

CriteoConfig Paths(std::vector<std::string> paths) {
  CriteoConfig config;
  config.paths = std::move(paths);
  return config;
}

std::vector<float> Dense(const Batch& b, int64_t i) {
  return SampleOf(b, i).dense;
}

TEST(CriteoSource, ParsesFieldsAndEmptyValues) {
  // A CRLF line ending, and a last line without '\n'.
  std::string crlf = Line("1", {"7"}, {"ffffffff"});
  crlf.insert(crlf.size() - 1, "\r");
  std::string last = Line("0", {"1"}, {"1"});
  last.pop_back();
  const std::string path =
      WriteFile("good.tsv",
                Line("1", {"3", "", "-2", "0"}, {"68fd1e64", "", "0A0b0C0d"}) +
                    Line("0", {}, {}) + crlf + last);
  auto source = Open(Paths({path}));
  ASSERT_NE(source, nullptr);
  Batch batch;
  ASSERT_TRUE(*source->Next(&batch));
  ExpectWellFormed(batch);
  ASSERT_EQ(batch.size, 4);
  EXPECT_EQ(batch.num_dense, 13);
  ASSERT_EQ(batch.num_sparse(), 26);
  EXPECT_EQ(batch.labels, (std::vector<float>{1, 0, 1, 0}));
  std::vector<float> want0(13, 0.0f);
  want0[0] = static_cast<float>(std::log1p(3.0));  // "", -2 read as 0
  EXPECT_EQ(Dense(batch, 0), want0);
  EXPECT_EQ(Dense(batch, 1), std::vector<float>(13, 0.0f));
  EXPECT_FLOAT_EQ(Dense(batch, 2)[0], std::log(8.0f));
  EXPECT_EQ(SampleOf(batch, 0).bags[0], std::vector<int64_t>{0x68fd1e64});
  EXPECT_TRUE(SampleOf(batch, 0).bags[1].empty());
  EXPECT_EQ(SampleOf(batch, 0).bags[2], std::vector<int64_t>{0x0a0b0c0d});
  EXPECT_TRUE(SampleOf(batch, 1).bags[0].empty());
  EXPECT_EQ(SampleOf(batch, 2).bags[0], std::vector<int64_t>{0xffffffffLL});
  EXPECT_EQ(SampleOf(batch, 3).bags[0], std::vector<int64_t>{1});
  EXPECT_EQ(source->stats().lines, 4);
  EXPECT_EQ(source->stats().bad_lines, 0);
  EXPECT_FALSE(*source->Next(&batch));
  EXPECT_FALSE(*source->Next(&batch));
}

TEST(CriteoSource, SkipsAndReportsMalformedLines) {
  std::string text = Line("1", {"5"}, {"a1"});      // 1: good
  text += "1\t2\t3\n";                              // 2: field count
  text += Line("0", {"1", "abc"}, {"b2"});          // 3: dense
  text += Line("0", {"1"}, {"c3", "zz"});           // 4: hex
  text += Line("2", {"1"}, {"d4"});                 // 5: label
  text += "\n";                                     // 6: empty
  text += Line("0", {"1"}, {"12345678901234567"});  // 7: hex too long
  text += Line("0", {"9"}, {"e5"});                 // 8: good
  const std::string path = WriteFile("bad.tsv", text);
  auto source = Open(Paths({path}));
  ASSERT_NE(source, nullptr);
  Batch batch;
  ASSERT_TRUE(*source->Next(&batch));
  ExpectWellFormed(batch);
  ASSERT_EQ(batch.size, 2);
  EXPECT_EQ(SampleOf(batch, 0).bags[0], std::vector<int64_t>{0xa1});
  EXPECT_EQ(SampleOf(batch, 1).bags[0], std::vector<int64_t>{0xe5});
  EXPECT_FLOAT_EQ(Dense(batch, 1)[0], std::log(10.0f));
  // The rolled-back bad lines left nothing behind in other features.
  EXPECT_TRUE(SampleOf(batch, 1).bags[1].empty());
  const CriteoStats stats = source->stats();
  EXPECT_EQ(stats.lines, 8);
  EXPECT_EQ(stats.bad_lines, 6);
  EXPECT_EQ(stats.first_bad.rfind(absl::StrCat(path, ":2: "), 0), 0u)
      << stats.first_bad;
  EXPECT_NE(stats.first_bad.find("fields"), std::string::npos);
  EXPECT_FALSE(*source->Next(&batch));
}

// Bags of hex ids, parsed in one pass per token (worker/data/criteo.cc):
// digits and letters of either case, up to 16 digits; an empty token
// anywhere in a bag, or a non-hex byte, makes the line bad.
TEST(CriteoSource, BagsOfHexIdsAndTheirBadForms) {
  std::string text = Line("1", {"1"}, {"0,9,a,F,aBcD"});                        // 1: good
  text += Line("1", {"1"}, {"7fffffffffffffff,ffffffffffffffff"});             // 2: good
  text += Line("0", {"1"}, {",a"});                                             // 3: bad
  text += Line("0", {"1"}, {"a,,b"});                                           // 4: bad
  text += Line("0", {"1"}, {"a,"});                                             // 5: bad
  text += Line("0", {"1"}, {"a,g"});                                            // 6: bad
  text += Line("0", {"1"}, {"1,12345678901234567"});                            // 7: bad
  text += Line("0", {"1"}, {"a b"});                                            // 8: bad
  text += Line("0", {"2"}, {"", "c"});                                          // 9: good
  auto source = Open(Paths({WriteFile("bags.tsv", text)}));
  ASSERT_NE(source, nullptr);
  Batch batch;
  ASSERT_TRUE(*source->Next(&batch));
  ExpectWellFormed(batch);
  ASSERT_EQ(batch.size, 3);
  EXPECT_EQ(SampleOf(batch, 0).bags[0], (std::vector<int64_t>{0, 9, 0xa, 0xf, 0xabcd}));
  EXPECT_EQ(SampleOf(batch, 1).bags[0],
            (std::vector<int64_t>{0x7fffffffffffffffLL, static_cast<int64_t>(~uint64_t{0})}));
  EXPECT_TRUE(SampleOf(batch, 2).bags[0].empty());
  EXPECT_EQ(SampleOf(batch, 2).bags[1], std::vector<int64_t>{0xc});
  EXPECT_EQ(source->stats().bad_lines, 6);
}

TEST(CriteoSource, HashBucketsAndMultiHot) {
  CriteoConfig config;
  config.num_dense = 1;
  config.num_categorical = 2;
  config.hash_buckets = {0, 1000};
  config.paths = {
      WriteFile("hash.tsv", "1\t4\ta,b\t68fd1e64\n0\t\t\t68FD1E64,c,c\n")};
  auto source = Open(config);
  ASSERT_NE(source, nullptr);
  Batch batch;
  ASSERT_TRUE(*source->Next(&batch));
  ExpectWellFormed(batch);
  ASSERT_EQ(batch.size, 2);
  EXPECT_EQ(SampleOf(batch, 0).bags[0], (std::vector<int64_t>{0xa, 0xb}));
  const int64_t h = CriteoHashedId("68fd1e64", 1000);
  EXPECT_GE(h, 0);
  EXPECT_LT(h, 1000);
  EXPECT_EQ(SampleOf(batch, 0).bags[1], std::vector<int64_t>{h});
  // The hash is of the text: case matters, and it is stable.
  EXPECT_EQ(SampleOf(batch, 1).bags[1][0], CriteoHashedId("68FD1E64", 1000));
  EXPECT_EQ(SampleOf(batch, 1).bags[1][1], SampleOf(batch, 1).bags[1][2]);
  EXPECT_EQ(CriteoHashedId("68fd1e64", 1 << 30),
            CriteoHashedId("68fd1e64", 1 << 30));
}

TEST(CriteoSource, RanksSplitLinesAcrossFiles) {
  // Line n (0-based over both files) has dense I1 = n.
  std::string first, second;
  for (int n = 0; n < 7; ++n) first += Line("0", {absl::StrCat(n)}, {"1"});
  for (int n = 7; n < 12; ++n) second += Line("1", {absl::StrCat(n)}, {"2"});
  const CriteoConfig config =
      Paths({WriteFile("part0.tsv", first), WriteFile("part1.tsv", second)});
  for (int world : {1, 2, 3}) {
    std::vector<int> seen;
    for (int rank = 0; rank < world; ++rank) {
      auto source = Open(config, rank, world, /*batch=*/2);
      ASSERT_NE(source, nullptr);
      Batch batch;
      int64_t lines = 0;
      while (*source->Next(&batch)) {
        ExpectWellFormed(batch);
        for (int64_t i = 0; i < batch.size; ++i) {
          const int n =
              static_cast<int>(std::lround(std::expm1(Dense(batch, i)[0])));
          EXPECT_EQ(n % world, rank);
          EXPECT_EQ(batch.labels[i], n >= 7 ? 1.0f : 0.0f);
          seen.push_back(n);
          ++lines;
        }
      }
      EXPECT_EQ(source->stats().lines, lines);
    }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(seen.size(), 12u);
    for (int n = 0; n < static_cast<int>(seen.size()); ++n)
      EXPECT_EQ(seen[n], n);
  }
}

TEST(CriteoSource, PartialLastBatch) {
  std::string text;
  for (int n = 0; n < 10; ++n) text += Line("0", {}, {});
  auto source = Open(Paths({WriteFile("ten.tsv", text)}), 0, 1, 4);
  ASSERT_NE(source, nullptr);
  Batch batch;
  std::vector<int64_t> sizes;
  while (*source->Next(&batch)) sizes.push_back(batch.size);
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 2}));
}

TEST(CriteoSource, RefusesBadConfigAndMissingFiles) {
  const std::string path = WriteFile("one.tsv", Line("0", {}, {}));
  EXPECT_EQ(CriteoSource::Create(Paths({path, "/nonexistent/x.tsv"}), 0, 1, 8)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(CriteoSource::Create(Paths({}), 0, 1, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  CriteoConfig two_buckets = Paths({path});
  two_buckets.hash_buckets = {1, 2};
  EXPECT_EQ(CriteoSource::Create(two_buckets, 0, 1, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CriteoSource::Create(Paths({path}), 2, 2, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CriteoSource::Create(Paths({path}), 0, 1, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(MakeCriteoSource(Paths({path}), 0, 1, 8).ok());
}

// Synthetic batches written as TSV read back identical, including bags of
// several ids, empty bags, ids above 32 bits, and a file larger than the
// reader's buffer.
TEST(CriteoSource, SyntheticRoundTrip) {
  SyntheticConfig small;
  small.seed = 11;
  small.num_dense = 5;
  small.features = {{1000, 1.05, 0, 3}, {int64_t{1} << 40, 1.1, 1, 1}};
  struct Case {
    SyntheticConfig config;
    int64_t batches;
  };
  for (const Case& c :
       {Case{small, 10}, Case{CriteoLikeSyntheticConfig(4), 40}}) {
    const int64_t kBatch = 500;
    auto writer = MakeSyntheticSource(c.config, 0, 1, kBatch, -1);
    const std::string path = WriteFile("synthetic.tsv", "");
    ASSERT_TRUE(WriteCriteoTsv(*writer, c.batches * kBatch, path).ok());

    CriteoConfig config;
    config.paths = {path};
    config.num_dense = c.config.num_dense;
    config.num_categorical = static_cast<int>(c.config.features.size());
    auto reader = Open(config, 0, 1, kBatch);
    ASSERT_NE(reader, nullptr);
    auto expected = MakeSyntheticSource(c.config, 0, 1, kBatch, c.batches);
    Batch got, want;
    while (*expected->Next(&want)) {
      ASSERT_TRUE(*reader->Next(&got));
      ExpectBatchEq(got, want);
    }
    EXPECT_FALSE(*reader->Next(&got));
    EXPECT_EQ(reader->stats().lines, c.batches * kBatch);
    EXPECT_EQ(reader->stats().bad_lines, 0);
  }
}

}  // namespace
}  // namespace recps::worker
