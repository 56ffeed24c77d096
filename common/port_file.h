// The port file daemons write once they serve ("<grpc port> <metrics
// port>"), so launchers and tests learn OS-picked ports.
#ifndef RECPS_COMMON_PORT_FILE_H_
#define RECPS_COMMON_PORT_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace recps {

// Writes atomically (temporary file, then rename): readers never see half.
absl::Status WritePortFile(const std::string& path, int grpc_port,
                           int metrics_port);

}  // namespace recps

#endif  // RECPS_COMMON_PORT_FILE_H_
