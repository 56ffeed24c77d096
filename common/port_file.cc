#include "common/port_file.h"

#include "absl/strings/str_cat.h"

namespace recps {

absl::Status WritePortFile(const std::string& path, int grpc_port,
                           int metrics_port, FileSystem* fs) {
  const std::string tmp = path + ".tmp";
  absl::Status s = fs->WriteFile(
      tmp, absl::StrCat(grpc_port, " ", metrics_port, "\n"), /*sync=*/false);
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    fs->RemoveFile(tmp).IgnoreError();  // a partial one; may not exist
    return absl::Status(s.code(),
                        absl::StrCat("port file ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace recps
