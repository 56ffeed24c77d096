// Same-host rows (docs/shard-server.md) through a real recps-shard with
// mutual TLS: the rows a worker gets and the updates it makes are the
// socket path's bit for bit, the bytes skip the socket (the server's
// metrics say so), a server that may not map memory gets bytes, and what a
// caller names is checked before the server touches it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/embedding_client.h"
#include "common/wire/same_host_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/security/tls_fixture.h"
#include "tests/testing/metrics_scrape.h"

namespace recps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

class SameHostRowsTest : public TlsProcessTest {
 protected:
  std::unique_ptr<client::EmbeddingClient> Client(const std::string& address,
                                                  bool same_host_rows) {
    client::EmbeddingClientOptions o;
    o.security = Tls("worker");
    o.rpc_timeout = absl::Seconds(20);
    o.same_host_rows = same_host_rows;
    auto c = client::EmbeddingClient::Create(
        {{"fixed", 4}, {"dyn", 4}},
        client::MakeServerShardMapSource({address}, Tls("worker")), o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }
  static double Metric(const LocalShard& shard, const std::string& name) {
    return ::recps::testing::MetricValue(
        ::recps::testing::ScrapeMetrics(shard.metrics_port()), name);
  }
};

// Ten sync steps of lookups and pushes (repeated ids, a fixed and a dynamic
// table) against two servers of the same seed: one serving same-host rows,
// one refusing them.
TEST_F(SameHostRowsTest, RowsAndUpdatesAreTheSocketPathsBitForBit) {
  auto shared = StartShard({});
  auto bytes = StartShard({"--same_host_rows=false"});
  ASSERT_NE(shared, nullptr);
  ASSERT_NE(bytes, nullptr);
  auto via_memory = Client(shared->address(), true);
  auto via_bytes = Client(bytes->address(), true);  // offered, refused
  ASSERT_NE(via_memory, nullptr);
  ASSERT_NE(via_bytes, nullptr);

  std::mt19937_64 rng(7);
  constexpr int kIds = 3000;
  for (int64_t step = 0; step < 10; ++step) {
    std::vector<int64_t> fixed(kIds), dyn(kIds);
    for (int i = 0; i < kIds; ++i) {
      fixed[i] = static_cast<int64_t>(rng() % 1000);       // repeats
      dyn[i] = static_cast<int64_t>(rng() % 5000) * 7919;  // scattered
    }
    std::vector<float> rows[2][2];  // [server][table]
    for (int s = 0; s < 2; ++s) {
      rows[s][0].assign(kIds * 4, -1.f);
      rows[s][1].assign(kIds * 4, -1.f);
      client::EmbeddingClient& c = s == 0 ? *via_memory : *via_bytes;
      const client::LookupSpec specs[] = {{0, fixed, rows[s][0].data()},
                                          {1, dyn, rows[s][1].data()}};
      ASSERT_TRUE(c.Lookup(step, specs).ok()) << "server " << s << " step " << step;
    }
    for (int t = 0; t < 2; ++t) {
      ASSERT_EQ(std::memcmp(rows[0][t].data(), rows[1][t].data(),
                            rows[0][t].size() * sizeof(float)),
                0)
          << "table " << t << " step " << step;
    }
    std::vector<float> grads(kIds * 4);
    for (size_t i = 0; i < grads.size(); ++i) {
      grads[i] = static_cast<float>((i * 37 + step * 11) % 101) / 100.f - 0.5f;
    }
    const client::PushSpec pushes[] = {{0, fixed, grads.data()}, {1, dyn, grads.data()}};
    ASSERT_TRUE(via_memory->PushGradients(step, pushes).ok());
    ASSERT_TRUE(via_bytes->PushGradients(step, pushes).ok());
  }

  // The rows went through memory, both ways, on the server that allows it.
  EXPECT_GT(Metric(*shared, "recps_shard_same_host_bytes_total{rpc=\"Lookup\""), 0);
  EXPECT_GT(Metric(*shared, "recps_shard_same_host_bytes_total{rpc=\"PushGradients\""), 0);
  EXPECT_EQ(Metric(*bytes, "recps_shard_same_host_bytes_total{rpc=\"Lookup\""), -1);
  EXPECT_EQ(Metric(*bytes, "recps_shard_same_host_bytes_total{rpc=\"PushGradients\""), -1);
  // The refusing server was offered one shared push; every later one came
  // as bytes.
  EXPECT_EQ(Metric(*bytes,
                   "recps_shard_requests_total{code=\"FAILED_PRECONDITION\",rpc=\"PushGradients\""),
            1);
  EXPECT_EQ(Metric(*shared,
                   "recps_shard_requests_total{code=\"FAILED_PRECONDITION\",rpc=\"PushGradients\""),
            -1);
}

// A step's lookups go in parts of max_ids_per_lookup_request ids, all in
// flight at once: here 24 parts. The worker keeps the memfds of the calls
// before for the calls after, so after the first step the server maps no
// new memfd. (With a fixed pool of 8 free memfds, every step made 16 new
// ones, their pages faulting in zeroed, and the server kept the dropped
// ones mapped: 10 steps mapped ~170.)
TEST_F(SameHostRowsTest, AStepsCallsReuseTheMemfdsOfTheStepsBefore) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  client::EmbeddingClientOptions o;
  o.security = Tls("worker");
  o.rpc_timeout = absl::Seconds(20);
  o.max_ids_per_lookup_request = 256;
  auto c = client::EmbeddingClient::Create(
      {{"fixed", 4}, {"dyn", 4}},
      client::MakeServerShardMapSource({shard->address()}, Tls("worker")), o);
  ASSERT_TRUE(c.ok()) << c.status();
  constexpr int kIds = 24 * 256;
  std::vector<int64_t> ids(kIds);
  std::vector<float> rows(kIds * 4), grads(kIds * 4, 0.01f);
  double after_first_step = 0;
  for (int64_t step = 0; step < 10; ++step) {
    for (int i = 0; i < kIds; ++i) ids[i] = (i + step * 101) * 7919;
    const client::LookupSpec specs[] = {{1, ids, rows.data()}};
    ASSERT_TRUE((*c)->Lookup(step, specs).ok()) << "step " << step;
    const client::PushSpec pushes[] = {{1, ids, grads.data()}};
    ASSERT_TRUE((*c)->PushGradients(step, pushes).ok()) << "step " << step;
    if (step == 0) after_first_step = Metric(*shard, "recps_shard_same_host_mappings_total");
  }
  EXPECT_GE(after_first_step, 24);  // the lookup's parts, at least
  EXPECT_EQ(Metric(*shard, "recps_shard_same_host_mappings_total"), after_first_step);
  EXPECT_GT(Metric(*shard, "recps_shard_same_host_bytes_total{rpc=\"Lookup\""), 0);
}

TEST_F(SameHostRowsTest, WhatACallerNamesIsCheckedBeforeItIsTouched) {
  auto shard = StartShard({});
  ASSERT_NE(shard, nullptr);
  auto worker = v1::EmbeddingShard::NewStub(Channel(shard->address(), Tls("worker")));
  auto push_shared = [&](const v1::SharedBuffer& buffer,
                         v1::EmbeddingShard::Stub* stub) {
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::SharedPushRequest request;
    *request.mutable_request() = buffer;
    v1::PushGradientsResponse response;
    return stub->PushGradientsShared(&context, request, &response);
  };

  // A file of this process (a key, say): refused, and left as it was.
  const std::string path = dir_->WriteFile("secret.key", std::string(4096, 's'));
  const int file = open(path.c_str(), O_RDWR);
  ASSERT_GE(file, 0);
  v1::SharedBuffer named_file;
  named_file.set_pid(static_cast<uint32_t>(getpid()));
  named_file.set_fd(file);
  named_file.set_length(4096);
  const grpc::Status refused = push_shared(named_file, worker.get());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), StartsWith(kSameHostRefusal));
  EXPECT_THAT(refused.error_message(), HasSubstr("not a recps shared buffer"));
  // A lookup asking for its answer there is answered as bytes instead.
  {
    v1::LookupRequest request = LookupOf("fixed", 0);
    *request.mutable_response_buffer() = named_file;
    grpc::ClientContext context;
    rpc::SetTimeout(absl::Seconds(5), &context);
    v1::LookupResponse response;
    ASSERT_TRUE(worker->Lookup(&context, request, &response).ok());
    EXPECT_EQ(response.shared_length(), 0u);
    ASSERT_EQ(response.tables_size(), 1);
    EXPECT_EQ(response.tables(0).rows().size(), 2 * 4 * sizeof(float));
  }
  EXPECT_EQ(::recps::testing::ReadAll(path), std::string(4096, 's'));
  close(file);

  // Real shared memory holding no push: a bad request, not a crash.
  auto memory = SharedMemory::Create(4096);
  ASSERT_TRUE(memory.ok());
  std::memset((*memory)->data(), 0xff, 64);
  const grpc::Status garbage = push_shared((*memory)->Describe(0, 64), worker.get());
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << garbage.error_message();

  // The shared form of a push is a worker's, as the push is.
  auto reader = v1::EmbeddingShard::NewStub(Channel(shard->address(), Tls("reader")));
  EXPECT_EQ(push_shared((*memory)->Describe(0, 64), reader.get()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_GE(Metric(*shard, "recps_shard_bad_requests_total{reason=\"malformed\",rpc=\"PushGradients\""),
            1);
}

}  // namespace
}  // namespace recps
