// recps-worker's flags (docs/training.md, "recps-worker flags").
#include "worker/worker_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, device, "cpu",
          "where the dense model runs: cpu, cuda (GPU 0) or cuda:N. A CUDA "
          "worker allreduces with NCCL instead of Gloo; without a usable GPU "
          "it exits 2 at start");
ABSL_FLAG(bool, pool_on_device, false,
          "pool the looked-up rows with the --device kernels (a GPU worker: "
          "each table's distinct rows are copied once and pooled on the GPU, "
          "and the gradient rows computed there); false: pool on the host "
          "and copy the pooled tensor");
ABSL_FLAG(std::string, coordinator, "",
          "coordinator address, host:port: register there, take the job, the "
          "shard map and the rendezvous from it (replaces --config, --shards "
          "and --rendezvous_dir)");
ABSL_FLAG(std::string, config, "",
          "job config (text-format recps.v1.JobConfig); required without "
          "--coordinator, and overrides the coordinator's job with it");
ABSL_FLAG(std::string, shards, "",
          "without --coordinator: comma-separated shard server addresses "
          "(host:port); the client asks them for the shard map");
ABSL_FLAG(int, rank, -1, "this worker's rank (default: $RANK, else 0)");
ABSL_FLAG(int, world_size, -1, "workers in the job (default: $WORLD_SIZE, else 1)");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per core)");
ABSL_FLAG(std::string, blas_kernels, "auto",
          "OpenBLAS's kernels: auto (its AVX-512 kernels wherever this CPU "
          "runs AVX-512, even if OPENBLAS_CORETYPE in the environment names an "
          "older core; the process re-executes itself once to apply it) or env "
          "(OpenBLAS's own choice, from OPENBLAS_CORETYPE or the CPU)");
ABSL_FLAG(int64_t, steps, 0, "override the job's training.steps (0: keep)");
ABSL_FLAG(std::string, metrics_listen, "",
          "Prometheus /metrics address, host:port (empty: off)");
ABSL_FLAG(std::string, port_file, "",
          "with --metrics_listen: write '0 <metrics port>' here once /metrics "
          "serves (the format of the daemons' port files; the worker serves "
          "no gRPC)");
ABSL_FLAG(std::string, result_json, "",
          "write the run's result (evaluations, samples/s, step times) here");
ABSL_FLAG(absl::Duration, progress_every, absl::Seconds(2),
          "how often to print progress");
ABSL_FLAG(std::string, dense_out, "",
          "write the trained dense parameters here (raw little-endian floats)");
ABSL_FLAG(std::string, rendezvous_dir, "",
          "with --world_size > 1 and no --coordinator: a directory all "
          "workers on this machine share, where they meet to set up the Gloo "
          "allreduce");
ABSL_FLAG(std::string, rendezvous_prefix, "",
          "names this run in the rendezvous store (default: the job name), so "
          "runs sharing a directory or coordinator do not meet each other");
ABSL_FLAG(std::string, gloo_hostname, "",
          "address the Gloo TCP transport binds to and peers connect to "
          "(default: with --coordinator, this host's address on the route to "
          "the coordinator; else 127.0.0.1)");
ABSL_FLAG(std::string, memory_limit, "",
          "memory this worker may use, bytes with an optional K, M, G or T "
          "suffix (powers of 1024), e.g. 8G; the job's estimated need is "
          "checked against it at start (default: MemAvailable in "
          "/proc/meminfo)");
ABSL_FLAG(std::string, loss_log, "",
          "append one line 'STEP LOSS' per trained step to this file (the "
          "loss with 9 significant digits, exact for a float32; '{rank}' in "
          "the path is replaced by this worker's rank); a resumed run appends "
          "the steps it trains again");
ABSL_FLAG(absl::Duration, resume_timeout, absl::Minutes(5),
          "with --coordinator: how long a starting worker waits for the "
          "coordinator's resume state (it answers UNAVAILABLE while the shard "
          "servers restore their rows)");
ABSL_FLAG(bool, same_host_rows, true,
          "to shard servers on this host's loopback, pass pushes and lookup "
          "answers through shared memory instead of the socket "
          "(docs/shard-server.md, Same-host rows); false: bytes always");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(60),
          "deadline of each lookup and push attempt to a shard server; a "
          "sync-mode lookup waits for the slowest worker's push of the step "
          "before, so keep it well above a step time (a silently dead link "
          "is noticed sooner, by keepalive pings, within ~5 s)");
ABSL_FLAG(absl::Duration, checkpoint_timeout, absl::Minutes(10),
          "how long a worker waits at a checkpoint cut for the other workers "
          "and the shard servers' snapshots (for the final and pre-emption "
          "checkpoints: for the whole checkpoint to be written)");
ABSL_FLAG(std::string, gpu_allreduce, "auto",
          "GPU workers' dense allreduce: nccl, gloo (through host memory: each "
          "step copies the dense gradients to the host and back), or auto "
          "(NCCL; Gloo through host memory when NCCL cannot be set up, e.g. a "
          "build without NCCL)");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(120),
          "how long a worker waits for its peers at set-up and in each "
          "allreduce before failing");
ABSL_FLAG(bool, embedded_shard, false,
          "run a shard server inside this worker (the same store, update and "
          "step clock as recps-shard): it registers with --coordinator and "
          "serves other workers, the coordinator and recpsctl over gRPC like "
          "a recps-shard, while this worker reaches it directly, without "
          "gRPC. Without --coordinator (and --world_size=1) it serves every "
          "slot alone. Its rows live in this process: if the worker dies, "
          "they are lost (restart from a checkpoint)");
ABSL_FLAG(int, local_ranks, 1,
          "CPU workers: run this many consecutive ranks (--rank, --rank+1, ...) "
          "as threads of this one process. With --embedded_shard they share its "
          "shard server and all reach it without gRPC (one store, no copies "
          "between workers on one machine); --result_json, --dense_out and "
          "--loss_log then need {rank} in their path. A rank that fails stops "
          "the whole process");
ABSL_FLAG(std::string, sync_prefetch, "auto",
          "sync mode: read step t+1's rows during step t and re-read only the "
          "rows step t updated (exact either way). true, false (look up after "
          "each push) or auto: false with --embedded_shard or --shards all on "
          "loopback, whose lookups are CPU work on this machine's cores (the "
          "overlap would only compete with the step for them), true otherwise");
