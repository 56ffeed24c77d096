// Failed and damaged checkpoints end to end, through `recps local` and the
// real binaries (the small job of tests/testing/local_run.h, 2 workers, 2
// shard servers; each phase trains a few tens of steps):
// - the final checkpoint on a full disk (a small tmpfs filled up; needs
//   root, skipped otherwise): the job still evaluates and writes its
//   results, reports RESOURCE_EXHAUSTED naming the checkpoint directory,
//   removes the failed checkpoint's partial files, keeps the previous
//   checkpoint, and `--max_restarts` does not train again;
// - `--resume` when the newest checkpoint has a corrupted row file (CRC-32C
//   mismatch): the coordinator skips it, says why, and resumes from the
//   older intact one; `--max_restarts` never retries the damaged one.
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/launcher/process.h"
#include "common/exit_codes.h"
#include "gtest/gtest.h"
#include "tests/testing/local_run.h"
#include "tests/testing/local_shard.h"

namespace recps {
namespace {

using ::recps::testing::CheckpointDir;
using ::recps::testing::LocalRun;
using ::recps::testing::ReadAll;
using ::recps::testing::SmallJob;

// Phase 1 trains kFirst steps (checkpoints at kEvery and kFirst); phase 2
// resumes and trains to kSteps (its final checkpoint).
constexpr int kEvery = 20;
constexpr int kFirst = 40;
constexpr int kSteps = 60;

// Runs `recps local` on `run` with `extra` to its end; returns its exit
// code (-1 when it did not end in time).
int RunToEnd(const LocalRun& run, const std::vector<std::string>& extra) {
  absl::StatusOr<client::ChildProcess> p = run.Start(2, extra);
  EXPECT_TRUE(p.ok()) << p.status();
  if (!p.ok()) return -1;
  absl::StatusOr<int> code = p->Wait(absl::Seconds(180));
  EXPECT_TRUE(code.ok()) << code.status() << ReadAll(run.log);
  return code.ok() ? *code : -1;
}

void ExpectHas(const std::string& text, const std::string& part) {
  EXPECT_TRUE(absl::StrContains(text, part)) << "missing: " << part;
}
void ExpectLacks(const std::string& text, const std::string& part) {
  EXPECT_FALSE(absl::StrContains(text, part)) << "unexpected: " << part;
}

// A tmpfs mounted on a folder for the test's life: a disk that fills up
// for real (ENOSPC from every write), without touching the machine's.
class SmallDisk {
 public:
  // False (errno kept) when it cannot be mounted (not root, no CAP_SYS_ADMIN).
  bool Mount(const std::string& dir, const std::string& size) {
    std::filesystem::create_directories(dir);
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) != 0) return false;
    dir_ = dir;
    return true;
  }
  ~SmallDisk() {
    if (!dir_.empty()) umount2(dir_.c_str(), MNT_DETACH);
  }
  // Writes a file until the disk is full (true once a write got ENOSPC),
  // then gives `leave` bytes back: room for a small file (the dense state),
  // not for a row file.
  bool Fill(off_t leave) {
    const int fd = open((dir_ + "/filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return false;
    const std::string chunk(64 << 10, 'x');
    off_t written = 0;
    bool full = false;
    for (size_t size : {chunk.size(), size_t{4096}, size_t{1}}) {
      ssize_t n = 0;
      while ((n = write(fd, chunk.data(), size)) > 0) written += n;
      full = errno == ENOSPC;
    }
    const bool ok = full && ftruncate(fd, std::max<off_t>(written - leave, 0)) == 0;
    close(fd);
    return ok;
  }

 private:
  std::string dir_;
};

TEST(CheckpointFailureE2e, FullDiskAtTheFinalCheckpointKeepsResultsAndThePrevious) {
  LocalRun run(SmallJob{"ckpt_full_disk", kSteps, kEvery});
  SmallDisk disk;
  if (!disk.Mount(run.checkpoints, "32m")) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << run.checkpoints << " (needs root): "
                 << std::strerror(errno);
  }
  ASSERT_EQ(RunToEnd(run, {absl::StrCat("--steps=", kFirst)}), 0) << ReadAll(run.log);
  ASSERT_TRUE(std::filesystem::exists(CheckpointDir(run.checkpoints, kFirst) + "/MANIFEST"));
  const std::string previous = ReadAll(CheckpointDir(run.checkpoints, kFirst) + "/MANIFEST");
  ASSERT_EQ(run.LossLines(), kFirst);
  // 64 KiB left: the shard servers' row files (over 100 KiB each) hit
  // ENOSPC; the coordinator's dense.pb (10 KiB) usually still fits.
  ASSERT_TRUE(disk.Fill(64 << 10));

  run.log = run.dir->path() + "/resumed.log";
  std::filesystem::remove(run.work + "/result0.json");
  const int code = RunToEnd(run, {"--resume", "--max_restarts=2"});
  const std::string log = ReadAll(run.log);
  // Not a success (the final checkpoint is missing), not a plain failure
  // either: trained, evaluated, reported, not restarted.
  EXPECT_EQ(code, kExitFinalCheckpointFailed);
  ExpectHas(log, "RESOURCE_EXHAUSTED");
  ExpectHas(log, "No space left on device");
  ExpectHas(log, CheckpointDir(run.checkpoints, kSteps));
  ExpectLacks(log, "DATA_LOSS");
  ExpectLacks(log, "restart 1/");
  ExpectHas(log, "held-out AUC");
  ExpectHas(ReadAll(run.work + "/result0.json"), "\"auc\"");
  // Steps kFirst.. trained once.
  EXPECT_EQ(run.LossLines(), kSteps);
  // The failed checkpoint's files are gone; the previous one is untouched.
  EXPECT_FALSE(std::filesystem::exists(CheckpointDir(run.checkpoints, kSteps)));
  EXPECT_EQ(ReadAll(CheckpointDir(run.checkpoints, kFirst) + "/MANIFEST"), previous);
  ExpectHas(log, absl::StrCat("the newest complete checkpoint stays step ", kFirst));
  if (HasFailure()) ADD_FAILURE() << "the resumed run's output:\n" << log;
}

TEST(CheckpointFailureE2e, ResumeSkipsADamagedNewestCheckpoint) {
  LocalRun run(SmallJob{"ckpt_damaged", kSteps, kEvery});
  ASSERT_EQ(RunToEnd(run, {absl::StrCat("--steps=", kFirst)}), 0) << ReadAll(run.log);
  // One flipped byte in the middle of a row file of the newest checkpoint.
  const std::string file = CheckpointDir(run.checkpoints, kFirst) + "/shard-00000.sst";
  const uintmax_t size = std::filesystem::file_size(file);
  ASSERT_GT(size, 1024u);
  {
    std::FILE* f = std::fopen(file.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(size / 2), SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, static_cast<long>(size / 2), SEEK_SET);
    std::fputc(c ^ 0x5a, f);
    std::fclose(f);
  }

  run.log = run.dir->path() + "/resumed.log";
  const int code = RunToEnd(run, {"--resume", "--max_restarts=1"});
  const std::string log = ReadAll(run.log);
  const std::string coordinator = ReadAll(run.work + "/coordinator.log");
  EXPECT_EQ(code, 0);
  ExpectLacks(log, "restart 1/");
  ExpectHas(log, absl::StrCat("resuming at step ", kEvery, " of ", kSteps));
  ExpectHas(coordinator, absl::StrCat("skipping the checkpoint at step ", kFirst));
  ExpectHas(coordinator, "CRC-32C");
  ExpectHas(coordinator, absl::StrCat("restored step ", kEvery));
  // The resumed run passes step kFirst again and writes it anew.
  ExpectHas(coordinator, absl::StrCat("replacing the damaged checkpoint at step ", kFirst));
  EXPECT_TRUE(std::filesystem::exists(CheckpointDir(run.checkpoints, kSteps) + "/MANIFEST"));
  // Phase 1's steps, then kEvery.. again.
  EXPECT_EQ(run.LossLines(), kFirst + (kSteps - kEvery));
  if (HasFailure()) {
    ADD_FAILURE() << "the resumed run's output:\n" << log << "\ncoordinator log:\n" << coordinator;
  }
}

}  // namespace
}  // namespace recps
