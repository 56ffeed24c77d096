// recpsctl's checkpoint listing as text: columns, the increment's base, the
// checkpoint in progress, the restored step and the last error.
#include "client/admin/checkpoint_commands.h"

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recps::client::admin {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(FormatCheckpoints, TableInProgressAndLastError) {
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  v1::ListCheckpointsResponse list;
  list.set_root("/ckpt/job");
  v1::CheckpointSummary* full = list.add_checkpoints();
  full->set_step(1000);
  full->set_kind(v1::CHECKPOINT_KIND_FULL);
  full->set_size_bytes(int64_t{3} << 30);
  full->set_rows(40000000);
  full->set_created_unix_ms(absl::ToUnixMillis(now - absl::Minutes(12)));
  full->set_reason("periodic");
  v1::CheckpointSummary* inc = list.add_checkpoints();
  inc->set_step(1100);
  inc->set_kind(v1::CHECKPOINT_KIND_INCREMENTAL);
  inc->set_base_step(1000);
  inc->set_rows(2500);
  inc->set_created_unix_ms(absl::ToUnixMillis(now - absl::Seconds(10)));
  inc->set_reason("requested");
  list.mutable_in_progress()->set_step(1200);
  list.mutable_in_progress()->set_files_done(1);
  list.mutable_in_progress()->set_files_total(2);
  list.set_restored_step(900);
  list.set_last_error("checkpoint at step 1150 failed: disk full");
  const std::string text = FormatCheckpoints(list, now);
  EXPECT_THAT(text, HasSubstr("checkpoints in /ckpt/job"));
  EXPECT_THAT(text, HasSubstr("STEP"));
  EXPECT_THAT(text, HasSubstr("incremental  1000"));
  EXPECT_THAT(text, HasSubstr("12m"));
  EXPECT_THAT(text, HasSubstr("10s"));
  EXPECT_THAT(text, HasSubstr("writing step 1200: 1 of 2 row files"));
  EXPECT_THAT(text, HasSubstr("restored from step 900"));
  EXPECT_THAT(text, HasSubstr("last error: checkpoint at step 1150 failed: disk full"));
}

TEST(FormatCheckpoints, OffAndEmpty) {
  EXPECT_THAT(FormatCheckpoints(v1::ListCheckpointsResponse(), absl::Now()),
              HasSubstr("checkpoints are off"));
  v1::ListCheckpointsResponse list;
  list.set_root("/ckpt");
  const std::string text = FormatCheckpoints(list, absl::Now());
  EXPECT_THAT(text, HasSubstr("no complete checkpoint yet"));
  EXPECT_THAT(text, Not(HasSubstr("writing")));
}

}  // namespace
}  // namespace recps::client::admin
