// recps-worker's own flags (worker_flags.cc defines them, with their help
// text); worker_main.cc reads them. The --embedded_shard_* flags live in
// embedded_shard.cc.
#ifndef RECPS_WORKER_WORKER_FLAGS_H_
#define RECPS_WORKER_WORKER_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"

ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(bool, pool_on_device);
ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::string, shards);
ABSL_DECLARE_FLAG(int, rank);
ABSL_DECLARE_FLAG(int, world_size);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, blas_kernels);
ABSL_DECLARE_FLAG(int64_t, steps);
ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, port_file);
ABSL_DECLARE_FLAG(std::string, result_json);
ABSL_DECLARE_FLAG(absl::Duration, progress_every);
ABSL_DECLARE_FLAG(std::string, dense_out);
ABSL_DECLARE_FLAG(std::string, rendezvous_dir);
ABSL_DECLARE_FLAG(std::string, rendezvous_prefix);
ABSL_DECLARE_FLAG(std::string, gloo_hostname);
ABSL_DECLARE_FLAG(std::string, memory_limit);
ABSL_DECLARE_FLAG(std::string, loss_log);
ABSL_DECLARE_FLAG(absl::Duration, resume_timeout);
ABSL_DECLARE_FLAG(absl::Duration, checkpoint_timeout);
ABSL_DECLARE_FLAG(absl::Duration, rpc_timeout);
ABSL_DECLARE_FLAG(bool, same_host_rows);
ABSL_DECLARE_FLAG(std::string, gpu_allreduce);
ABSL_DECLARE_FLAG(absl::Duration, collective_timeout);
ABSL_DECLARE_FLAG(bool, embedded_shard);
ABSL_DECLARE_FLAG(int, local_ranks);
ABSL_DECLARE_FLAG(std::string, sync_prefetch);

#endif  // RECPS_WORKER_WORKER_FLAGS_H_
