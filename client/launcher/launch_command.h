// `recps launch` (client/launcher/recps_main.cc parses the flags).
#ifndef RECPS_CLIENT_LAUNCHER_LAUNCH_COMMAND_H_
#define RECPS_CLIENT_LAUNCHER_LAUNCH_COMMAND_H_

#include <string>
#include <vector>

#include "common/file_system.h"

namespace recps::client {

// Starts this node's workers of the cluster whose coordinator is
// --coordinator (RANK, LOCAL_RANK, WORLD_SIZE, ... set; one GPU each where
// there are GPUs), supervises them and restarts them up to --max_restarts
// times. `positional`: at most one job config; `worker_args`: what followed
// "--". The launcher's own file operations (the --log_dir directory) go
// through `fs` (not owned). Returns the exit code.
int RunLaunch(const std::vector<std::string>& positional,
              const std::vector<std::string>& worker_args,
              FileSystem* fs = FileSystem::Default());

}  // namespace recps::client

#endif  // RECPS_CLIENT_LAUNCHER_LAUNCH_COMMAND_H_
