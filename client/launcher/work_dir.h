// The work directory of `recps local` (client/launcher/local_cluster.cc):
// its logs, port files, pid file, coordinator states and the copy of the
// job that every child reads. Apart from local_cluster.cc, which links the
// whole launcher, so that tests can run this step over a faulty file system.
#ifndef RECPS_CLIENT_LAUNCHER_WORK_DIR_H_
#define RECPS_CLIENT_LAUNCHER_WORK_DIR_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"

namespace recps::client {

struct WorkDir {
  std::string dir;
  std::string job_copy;  // dir/job.textproto
};

// Creates `work_dir` and its parents ("": a new /tmp/recps-local-*
// directory) and writes `job_text` as its job.textproto, through `fs`.
// Errors keep the file system's code (RESOURCE_EXHAUSTED for a full disk)
// and name the path and --work_dir; a job copy not written whole is
// removed, so no child ever reads half a job.
absl::StatusOr<WorkDir> PrepareWorkDir(const std::string& work_dir,
                                       absl::string_view job_text,
                                       FileSystem* fs);

}  // namespace recps::client

#endif  // RECPS_CLIENT_LAUNCHER_WORK_DIR_H_
