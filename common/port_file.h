// The port file daemons write once they serve ("<grpc port> <metrics
// port>"), so launchers and tests learn OS-picked ports.
#ifndef RECPS_COMMON_PORT_FILE_H_
#define RECPS_COMMON_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "common/file_system.h"

namespace recps {

// Writes atomically through `fs` (a temporary file, then rename; no fsync:
// the file matters only while the daemon runs), so readers never see half.
// On an error (the file system's code, naming the file) neither the port
// file nor the temporary one is left.
absl::Status WritePortFile(const std::string& path, int grpc_port,
                           int metrics_port,
                           FileSystem* fs = FileSystem::Default());

}  // namespace recps

#endif  // RECPS_COMMON_PORT_FILE_H_
