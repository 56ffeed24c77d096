#include "client/launcher/work_dir.h"

#include <errno.h>
#include <stdlib.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace recps::client {

absl::StatusOr<WorkDir> PrepareWorkDir(const std::string& work_dir,
                                       absl::string_view job_text,
                                       FileSystem* fs) {
  WorkDir out;
  out.dir = work_dir;
  if (out.dir.empty()) {
    // mkdtemp, not the seam: it has no call that makes a directory of a
    // unique new name (CreateDir accepts one that exists).
    std::string tmpl = "/tmp/recps-local-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      return ErrnoStatus(errno, "cannot create a work directory", tmpl);
    }
    out.dir = tmpl;
  }
  if (absl::Status s = fs->CreateDirs(out.dir); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("work directory (--work_dir): ", s.message()));
  }
  out.job_copy = out.dir + "/job.textproto";
  // No fsync: the children read it while this run lasts.
  if (absl::Status s = fs->WriteFile(out.job_copy, job_text, /*sync=*/false);
      !s.ok()) {
    fs->RemoveFile(out.job_copy).IgnoreError();
    return absl::Status(
        s.code(), absl::StrCat("writing the job's copy for the children in the "
                               "work directory (--work_dir): ",
                               s.message()));
  }
  return out;
}

}  // namespace recps::client
