// recps-worker: trains a job's DLRM against the shard servers.
//
//   recps-worker --coordinator=host:7000            (a cluster)
//   recps-worker --config=job.textproto --shards=127.0.0.1:7000   (no coordinator)
//   recps-worker --coordinator=host:7000 --embedded_shard  (its own shard server inside)
//
// Rank and world size come from --rank/--world_size or, as torchrun and
// `recps launch` set them, from RANK and WORLD_SIZE. With --coordinator the
// worker registers (keeping its lease by heartbeat), takes the job and the
// shard map from the coordinator and meets its peers through the
// coordinator's key-value store.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/notification.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/embedding_client.h"
#include "common/exit_codes.h"
#include "common/log.h"
#include "common/malloc_tuning.h"
#include "common/thread_pool.h"
#include "common/port_file.h"
#include "common/status_macros.h"
#include "common/wire/same_host_memory.h"
#include "common/rpc/retry.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "kernels/device_memory.h"
#include "kernels/exec_context.h"
#include "kernels/gemm.h"
#include "worker/collectives/collectives.h"
#include "worker/collectives/coordinator_kv_store.h"
#include "worker/collectives/gloo_collectives.h"
#include "worker/collectives/kv_store.h"
#include "worker/collectives/host_staged_collectives.h"
#include "worker/data/criteo.h"
#include "worker/data/prefetch.h"
#include "worker/data/synthetic.h"
#include "common/config/job_config.h"
#include "common/flags_usage.h"
#include "common/rpc/tls_flags.h"
#include "worker/embedded_shard.h"
#include "worker/result_json.h"
#include "worker/trainer.h"
#include "worker/worker_checkpoints.h"
#include "worker/worker_flags.h"
#include "worker/worker_metrics.h"
#include "worker/worker_setup.h"
// The one server header of the worker: --embedded_shard runs a whole shard
// server in this process (scripts/check-layering.sh allows exactly this).
#include "server/shard/shard_process.h"

namespace recps::worker {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : fallback;
}

// Held-out synthetic samples come from the same hidden model but other
// sample numbers: the generator is keyed by (seed, sample), and the label
// model by the seed alone, so only the sample stream is offset.
constexpr int64_t kEvalSampleOffset = int64_t{1} << 40;

// What the ranks of one process share (--local_ranks): the device, the
// metrics registry and the embedded shard server, which the first of them
// starts once it has the job and the others wait for.
struct ProcessShared {
  int first_rank = 0;
  int local_ranks = 1;
  kernels::Device device = kernels::Device::kCpu;
  int cuda_device = 0;
  std::shared_ptr<prometheus::Registry> registry;

  absl::Notification shard_ready;
  absl::Status shard_status;
  std::unique_ptr<server::ShardProcess> shard;  // null without --embedded_shard
};

// --result_json, --dense_out and --loss_log of `rank`: "{rank}" replaced.
std::string PathForRank(std::string path, int rank) {
  if (const size_t at = path.find("{rank}"); at != std::string::npos) {
    path.replace(at, 6, absl::StrCat(rank));
  }
  return path;
}

// The end of a rank with an embedded shard in its process: other workers
// may still read its rows (their last evaluation), so every rank waits for
// all peers, then the process's first rank stops serving (leaving the
// coordinator, finishing calls in flight).
void StopEmbeddedShard(int rank, Collectives* collectives, ProcessShared* shared) {
  if (shared->shard == nullptr) return;
  WaitForPeers(collectives);
  if (rank == shared->first_rank) shared->shard->Stop(absl::Seconds(10));
}

// One rank's run as RunRank builds it, step by step. The members are in the
// order the steps make them, so they are destroyed in reverse: the map
// watcher, then the trainer (which owns the client and the data), before
// what its callbacks use (progress, metrics, checkpoints), the execution
// resources, the thread pool and the allreduce.
struct RankRun {
  RankRun(int rank, int world, ProcessShared* shared)
      : rank(rank),
        world(world),
        shared(shared),
        config_path(absl::GetFlag(FLAGS_config)),
        coordinator_address(absl::GetFlag(FLAGS_coordinator)),
        on_gpu(shared->device == kernels::Device::kCuda) {}

  const int rank;
  const int world;
  ProcessShared* const shared;
  const std::string config_path;
  const std::string coordinator_address;
  const bool on_gpu;

  // Register: null without --coordinator.
  std::unique_ptr<client::CoordinatorClient> coordinator;
  std::unique_ptr<client::CoordinatorLease> lease;
  v1::RegisterResponse registered;
  // LoadJob.
  v1::JobConfig job;
  bool sync_prefetch = true;
  // FindShards.
  std::vector<std::string> shards;
  // The process's embedded shard outlives every rank's client (ProcessShared).
  server::ShardProcess* embedded_shard = nullptr;
  // Resume state, cuts, pre-emption and the final checkpoint.
  std::unique_ptr<WorkerCheckpoints> checkpoints;
  // CreateClient: the trainer takes `client`; `embedding` stays valid.
  std::unique_ptr<client::EmbeddingClient> client;
  client::EmbeddingClient* embedding = nullptr;
  // OpenData: the trainer takes `train`.
  std::unique_ptr<BatchSource> train;
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()> make_eval;
  std::unique_ptr<WorkerMetrics> metrics;
  // JoinAllreduce: null with one worker.
  std::unique_ptr<KeyValueStore> rendezvous;
  std::unique_ptr<Collectives> collectives;
  // CreateTrainer.
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<kernels::ExecResources> exec;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> loss_log{nullptr, &std::fclose};
  // The progress lines and step metrics (TrainerOptions::on_step, on_eval).
  absl::Time last_print = absl::InfinitePast();
  double last_auc = -1;
  int64_t last_auc_step = 0;  // the step last_auc was measured after
  StepTimes times_so_far;
  int64_t samples_so_far = 0;
  std::unique_ptr<Trainer> trainer;
  // StartTraining.
  std::unique_ptr<client::ShardMapWatcher> map_watcher;
};

// With a coordinator: register (retrying while it starts), then keep the
// lease in the background for the whole run.
int Register(RankRun& run) {
  if (run.coordinator_address.empty()) return 0;
  run.coordinator = std::make_unique<client::CoordinatorClient>(run.coordinator_address);
  v1::RegisterRequest request;
  request.set_role(v1::WORKER);
  request.set_rank(run.rank);
  absl::StatusOr<v1::RegisterResponse> r = run.coordinator->Register(request);
  if (!r.ok()) {
    LogError(r.status().message());
    return 1;
  }
  run.registered = *std::move(r);
  LogInfo("registered with coordinator ", run.coordinator_address, " as ",
          run.registered.member_id());
  run.lease = std::make_unique<client::CoordinatorLease>(run.coordinator.get(), request,
                                                         &run.registered);
  return 0;
}

// The job: --config, else the coordinator's (with --steps over it), checked;
// and --sync_prefetch.
int LoadJob(RankRun& run) {
  absl::StatusOr<v1::JobConfig> job;
  if (!run.config_path.empty()) {
    job = config::ReadJobConfig(run.config_path);
  } else if (run.registered.has_job()) {
    job = run.registered.job();
  } else {
    job = run.coordinator->GetJob();
  }
  if (!job.ok()) {
    LogError(job.status().message());
    return 2;
  }
  if (absl::GetFlag(FLAGS_steps) > 0) {
    job->mutable_training()->set_steps(absl::GetFlag(FLAGS_steps));
  }
  // The coordinator's job (and --steps) are checked here too: sizes within
  // their bounds first, then the memory they add up to on this machine.
  if (absl::Status s = config::ValidateJobConfig(*job); !s.ok()) {
    LogError(s.message());
    return 2;
  }
  if (absl::Status s = CheckMemory(*job); !s.ok()) {
    LogError(s.message());
    return 2;
  }
  run.job = *std::move(job);
  // auto: off when the shard servers are this machine's (embedded, or
  // --shards all on loopback): their lookups are CPU work on the cores the
  // step needs, which the overlap would only compete for.
  const std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  const bool shards_on_loopback =
      !shards.empty() && std::all_of(shards.begin(), shards.end(), [](const std::string& a) {
        return IsLoopbackAddress(a);
      });
  run.sync_prefetch = !absl::GetFlag(FLAGS_embedded_shard) && !shards_on_loopback;
  if (const std::string prefetch = absl::GetFlag(FLAGS_sync_prefetch);
      prefetch != "auto" && !absl::SimpleAtob(prefetch, &run.sync_prefetch)) {
    LogError("--sync_prefetch=", prefetch, ": expected true, false or auto");
    return 2;
  }
  return 0;
}

// The shard servers: --shards, or the embedded one (started by the
// process's first rank, waited for by the others).
int FindShards(RankRun& run) {
  run.shards = absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  ProcessShared* const shared = run.shared;
  if (absl::GetFlag(FLAGS_embedded_shard)) {
    if (run.coordinator == nullptr &&
        (run.world != shared->local_ranks || !run.shards.empty())) {
      LogError("--embedded_shard without --coordinator serves every slot alone: it needs "
               "--world_size=1 (or all ranks in this process, --local_ranks) and no "
               "--shards (got --world_size=", run.world, ", ", run.shards.size(),
               " --shards)");
      return 2;
    }
    if (run.rank == shared->first_rank) {
      absl::StatusOr<std::unique_ptr<server::ShardProcess>> started = StartEmbeddedShard(
          run.job, run.world, shared->local_ranks, run.coordinator_address,
          absl::GetFlag(FLAGS_resume_timeout));
      if (started.ok()) {
        shared->shard = *std::move(started);
      } else {
        shared->shard_status = started.status();
      }
      shared->shard_ready.Notify();
    }
    shared->shard_ready.WaitForNotification();
    if (!shared->shard_status.ok()) {
      LogError("--embedded_shard: ", shared->shard_status.message());
      return absl::IsInvalidArgument(shared->shard_status) ? 2 : 1;
    }
    run.embedded_shard = shared->shard.get();
    if (run.coordinator == nullptr) run.shards = {run.embedded_shard->address()};
  }
  if (run.coordinator == nullptr && run.shards.empty()) {
    LogError("--shards is required without --coordinator (the shard servers' addresses)");
    return 2;
  }
  return 0;
}

// The embedding client, routing by the coordinator's map when there is one
// (it is the one that changes with a rebalance), else by the servers'.
int CreateClient(RankRun& run) {
  std::vector<client::TableSchema> tables;
  for (const v1::TableConfig& t : run.job.tables()) tables.push_back({t.name(), t.dim()});
  client::EmbeddingClientOptions client_options;
  client_options.worker_rank = run.rank;
  client_options.encoding = config::WireEncoding(run.job.training());
  client_options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  client_options.same_host_rows = absl::GetFlag(FLAGS_same_host_rows);
  if (client_options.rpc_timeout <= absl::ZeroDuration()) {
    LogError("--rpc_timeout must be positive, not ", absl::FormatDuration(client_options.rpc_timeout));
    return 2;
  }
  if (run.embedded_shard != nullptr) {
    client_options.in_process_shard = run.embedded_shard->endpoint();
  }
  if (client_options.encoding != v1::ROW_ENCODING_FLOAT32) {
    LogInfo("rows and gradients travel as ", v1::RowEncoding_Name(client_options.encoding),
            " (training.wire_precision)");
  }
  absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> client =
      client::EmbeddingClient::Create(
          tables,
          run.coordinator != nullptr
              ? client::MakeCoordinatorShardMapSource(run.coordinator.get())
              : client::MakeServerShardMapSource(run.shards),
          client_options);
  if (!client.ok()) {
    LogError(client.status().message());
    return 1;
  }
  run.client = *std::move(client);
  run.embedding = run.client.get();
  return 0;
}

// The training data (from the checkpoint's position on a resume, read ahead
// by a prefetch thread), the evaluation data, and this rank's metrics.
int OpenData(RankRun& run) {
  const v1::JobConfig& job = run.job;
  const int rank = run.rank;
  const int world = run.world;
  const int64_t batch_size = job.training().batch_size();
  if (job.data().has_synthetic()) {
    const SyntheticConfig cfg = ToSyntheticConfig(job.data().synthetic());
    run.train = MakeSyntheticSource(cfg, rank, world, batch_size, job.training().steps());
    const int64_t eval_batches = job.training().eval_batches();
    run.make_eval = [cfg, rank, world, batch_size, eval_batches]()
        -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      SyntheticConfig eval_cfg = cfg;
      eval_cfg.first_sample = kEvalSampleOffset;
      return MakeSyntheticSource(eval_cfg, rank, world, batch_size, eval_batches);
    };
  } else {
    CriteoConfig cfg;
    const v1::CriteoDataConfig& c = job.data().criteo();
    cfg.paths.assign(c.train_paths().begin(), c.train_paths().end());
    cfg.hash_buckets.assign(c.hash_buckets().begin(), c.hash_buckets().end());
    cfg.num_categorical = job.features_size();  // one TSV field per feature
    absl::StatusOr<std::unique_ptr<BatchSource>> source =
        MakeCriteoSource(cfg, rank, world, batch_size);
    if (!source.ok()) {
      LogError(source.status().message());
      return 2;
    }
    run.train = *std::move(source);
    CriteoConfig eval_cfg = cfg;
    eval_cfg.paths.assign(c.eval_paths().begin(), c.eval_paths().end());
    if (!eval_cfg.paths.empty()) {
      run.make_eval = [eval_cfg, rank, world, batch_size] {
        return MakeCriteoSource(eval_cfg, rank, world, batch_size);
      };
    }
  }
  // Seek before the prefetch thread starts reading.
  if (const int code = run.checkpoints->SkipTrainedData(*run.train); code != 0) return code;
  run.train = MakePrefetchingSource(std::move(run.train), 4);

  // Metrics: one per quantity, named with its unit (docs/training.md); the
  // ranks of one process tell theirs apart by a rank label.
  run.metrics = std::make_unique<WorkerMetrics>(
      *run.shared->registry, run.shared->local_ranks > 1
                                 ? prometheus::Labels{{"rank", absl::StrCat(rank)}}
                                 : prometheus::Labels{});
  return 0;
}

// Data parallelism: an allreduce over the dense gradients, Gloo for CPU
// workers, NCCL (on the worker's GPU, device pointers) for CUDA workers.
// Nothing with one worker.
int JoinAllreduce(RankRun& run) {
  if (run.world <= 1) return 0;
  const int rank = run.rank;
  const int world = run.world;
  const std::string dir = absl::GetFlag(FLAGS_rendezvous_dir);
  std::string prefix = absl::GetFlag(FLAGS_rendezvous_prefix);
  if (prefix.empty()) prefix = run.job.name().empty() ? "recps" : run.job.name();
  if (!dir.empty()) {
    run.rendezvous = std::make_unique<FileKeyValueStore>(dir);
  } else if (run.coordinator != nullptr) {
    run.rendezvous = std::make_unique<CoordinatorKeyValueStore>(run.coordinator.get());
    absl::StatusOr<std::string> fresh =
        FreshRendezvousPrefix(*run.coordinator, absl::StrCat("rendezvous/", prefix), rank,
                              world, absl::GetFlag(FLAGS_collective_timeout));
    if (!fresh.ok()) {
      LogError("rendezvous through the coordinator failed: ", fresh.status().ToString());
      return 1;
    }
    prefix = *std::move(fresh);
  } else {
    LogError("--world_size ", world, " needs --coordinator or --rendezvous_dir (a "
             "directory the workers share) to set up the allreduce");
    return 2;
  }
  std::string hostname = absl::GetFlag(FLAGS_gloo_hostname);
  if (hostname.empty()) {
    hostname = run.coordinator != nullptr ? LocalAddressToward(run.coordinator_address)
                                          : "127.0.0.1";
    // `recps launch` sets LOCAL_WORLD_SIZE: fewer here than in the world
    // means peers on other nodes, which cannot reach a loopback address.
    if (absl::StartsWith(hostname, "127.") && EnvInt("LOCAL_WORLD_SIZE", world) < world) {
      LogWarning("the allreduce binds to ", hostname, " (the route to the coordinator) "
                 "but there are workers on other nodes; set --gloo_hostname to an "
                 "address they can reach");
    }
  }
  absl::StatusOr<std::unique_ptr<Collectives>> made =
      run.on_gpu ? CreateGpuCollectives(*run.rendezvous, prefix, run.rank, run.world,
                                        run.shared->cuda_device, hostname,
                                        absl::GetFlag(FLAGS_gpu_allreduce),
                                        absl::GetFlag(FLAGS_collective_timeout))
                 : CreateGlooCollectives(*run.rendezvous, prefix, rank, world, hostname,
                                         absl::GetFlag(FLAGS_collective_timeout));
  if (!made.ok()) {
    LogError(run.on_gpu ? "the GPU" : "Gloo", " allreduce set-up failed: ",
             made.status().ToString());
    return 1;
  }
  run.collectives = *std::move(made);
  return 0;
}

// TrainerOptions::on_step and on_eval: --loss_log, the step metrics and a
// progress line every --progress_every (and at the last step).
void ReportProgress(RankRun& run, TrainerOptions* options) {
  const int64_t total_steps = run.job.training().steps();
  const int64_t start_step = run.checkpoints->start_step();
  const absl::Duration every = absl::GetFlag(FLAGS_progress_every);
  options->on_step = [&run, total_steps, start_step, every](int64_t step, float loss,
                                                             const TrainResult& r) {
    if (run.loss_log != nullptr) {
      std::fprintf(run.loss_log.get(), "%lld %.9g\n", static_cast<long long>(step), loss);
      std::fflush(run.loss_log.get());
    }
    const double rate = r.samples / std::max(r.seconds, 1e-9);
    run.metrics->ObserveStep(r.times, run.times_so_far, r.samples - run.samples_so_far, loss,
                             rate, r.last_lookup_staleness);
    run.times_so_far = r.times;
    run.samples_so_far = r.samples;
    if (absl::Now() - run.last_print < every && step + 1 != total_steps) return;
    run.last_print = absl::Now();
    const double eta = (total_steps - step - 1) * r.seconds /
                       std::max<int64_t>(step + 1 - start_step, 1);
    LogInfo(absl::StrFormat(
        "step %d/%d  loss %.4f  %s%.0f samples/s so far  eta %.0fs", step + 1, total_steps,
        loss,
        run.last_auc >= 0
            ? absl::StrFormat("auc %.4f (after step %d)  ", run.last_auc, run.last_auc_step)
            : "",
        rate, eta));
  };
  options->on_eval = [&run](const EvalRecord& e) {
    run.last_auc = e.metrics.auc;
    run.last_auc_step = e.step;
    run.metrics->ObserveEval(e.metrics);
    LogInfo(absl::StrFormat("eval after step %d: auc %.4f  log loss %.4f  ne %.4f  (%d samples)",
                            e.step, e.metrics.auc, e.metrics.log_loss, e.metrics.ne,
                            e.metrics.samples));
  };
}

// The trainer and what it runs on: the thread pool, the allreduce, the
// checkpoints, the device's execution resources, --loss_log.
int CreateTrainer(RankRun& run) {
  // Ranks in one process split the cores unless --threads says otherwise.
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0 && run.shared->local_ranks > 1) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                              run.shared->local_ranks);
  }
  run.pool = std::make_unique<ThreadPool>(threads);
  TrainerOptions options;
  if (run.collectives != nullptr) {
    options.allreduce = [collectives = run.collectives.get()](absl::Span<float> grads) {
      return AllReduceInBuckets(*collectives, grads, int64_t{1} << 20);
    };
  }
  options.rank = run.rank;
  options.world_size = run.world;
  run.checkpoints->Wire(&options);
  options.sync_prefetch = run.sync_prefetch;
  // The stream and cuBLAS handle of a CUDA worker (nothing for the CPU).
  absl::StatusOr<std::unique_ptr<kernels::ExecResources>> exec =
      kernels::ExecResources::Create(run.shared->device, run.shared->cuda_device,
                                     run.pool.get());
  if (!exec.ok()) {
    LogError("--device=", absl::GetFlag(FLAGS_device), ": ", exec.status().message());
    return 2;
  }
  run.exec = *std::move(exec);
  options.ctx = run.exec->ctx();
  options.pool_on_device = absl::GetFlag(FLAGS_pool_on_device);
  if (const std::string path = PathForRank(absl::GetFlag(FLAGS_loss_log), run.rank);
      !path.empty()) {
    run.loss_log.reset(std::fopen(path.c_str(), "a"));
    if (run.loss_log == nullptr) {
      LogError("--loss_log=", path, ": cannot open for appending: ", std::strerror(errno));
      return 2;
    }
  }
  ReportProgress(run, &options);
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(run.job, std::move(run.client), std::move(run.train), run.make_eval,
                      std::move(options));
  if (!trainer.ok()) {
    LogError(trainer.status().message());
    return 2;
  }
  run.trainer = *std::move(trainer);
  return 0;
}

// Before the first step: follow the coordinator's map, load the
// checkpoint's dense state, start every replica from rank 0's parameters.
int StartTraining(RankRun& run) {
  // Follows the coordinator's map so that a new epoch reaches the client at
  // once, not only when a shard server refuses a stale one. A member after
  // the trainer: stopped before the client goes.
  if (run.coordinator != nullptr) {
    client::EmbeddingClient* const embedding = run.embedding;
    run.map_watcher = std::make_unique<client::ShardMapWatcher>(
        run.coordinator.get(), embedding->shard_map_epoch(), [embedding](ShardMap map) {
          const uint64_t epoch = map.epoch();
          if (absl::Status s = embedding->OfferShardMap(std::move(map)); !s.ok()) {
            LogWarning("shard map epoch ", epoch, " from the coordinator: ", s.message());
          } else {
            LogInfo("routing by shard map epoch ", embedding->shard_map_epoch());
          }
        });
  }
  if (const int code = run.checkpoints->RestoreDense(*run.trainer); code != 0) return code;
  if (run.collectives != nullptr) {
    // Every replica starts from rank 0's parameters.
    if (absl::Status s = run.collectives->Broadcast(run.trainer->model().parameters(), 0);
        !s.ok()) {
      LogError("broadcasting the initial parameters failed: ", s.ToString());
      return 1;
    }
  }
  LogInfo("training ", run.job.name().empty() ? run.config_path : run.job.name(), ": ",
          run.job.training().steps(), " steps of ", run.job.training().batch_size(),
          " samples, rank ", run.rank, " of ", run.world, ", shard map from ",
          run.coordinator != nullptr ? "coordinator " + run.coordinator_address
                                     : absl::StrCat(run.shards.size(), " shard server(s)"),
          "; sync prefetch ", run.sync_prefetch ? "on" : "off", " (--sync_prefetch=",
          absl::GetFlag(FLAGS_sync_prefetch), ")",
          run.on_gpu ? "" : "; OpenBLAS kernels " + kernels::BlasKernelsDescription());
  return 0;
}

// A failed run: with a coordinator, names the workers that went silent.
int ReportFailure(RankRun& run, const absl::Status& status) {
  LogError("training failed: ", status.ToString());
  if (run.coordinator != nullptr) {
    // A peer that died stops heartbeating (and its lease runs out): give
    // it two heartbeat intervals, then name whoever stayed silent,
    // whatever the error above says. This worker keeps heartbeating.
    const absl::Time failed = absl::Now();
    absl::SleepFor(std::min(absl::Milliseconds(run.registered.lease_ms()) * 2 / 3 +
                                absl::Milliseconds(300),
                            absl::Seconds(8)));
    if (const std::string silent = run.coordinator->DescribeSilentWorkers(failed);
        !silent.empty()) {
      LogError("workers silent at the coordinator since the failure: ", silent);
    }
  }
  return 1;
}

// The end of a rank: every peer done with the embedded shard, then leave
// the coordinator.
void Leave(RankRun& run) {
  StopEmbeddedShard(run.rank, run.collectives.get(), run.shared);
  if (run.lease != nullptr) run.lease->Leave();
}

// A run that trained every step: the summary line, --dense_out,
// --result_json, then the final checkpoint's outcome.
int ReportDone(RankRun& run, const TrainResult& result) {
  const StepTimes& t = result.times;
  const int64_t trained = std::max<int64_t>(result.steps - run.checkpoints->start_step(), 1);
  // What each figure covers is said in the line (docs/training.md); one
  // line, as log readers parse it (tests/deploy/multihost_test.py).
  const TimedRate timed = TimedRateOf(result);
  LogInfo(absl::StrFormat(
      "done: %d steps, %.0f samples/s timed (this worker: steps %d..%d, after %d "
      "warm-up step(s), evaluations excluded; the job: %.0f samples/s, %d worker(s)); "
      "%.0f samples/s over the whole run (warm-up, evaluations and checkpoints "
      "included); per step: data %.2f ms, lookup %.2f ms, "
      "forward %.2f ms, backward %.2f ms, push %.2f ms, allreduce %.2f ms, "
      "optimizer %.2f ms, waiting for overlapped lookups %.2f ms (prefetch %.2f ms "
      "beside the step); evaluation %.1f s",
      result.steps, timed.samples_per_second, result.steps - timed.steps + 1, result.steps,
      timed.warmup_steps, run.world * timed.samples_per_second, run.world,
      result.samples / std::max(result.seconds, 1e-9), 1e3 * t.data / trained,
      1e3 * t.lookup / trained, 1e3 * t.forward / trained, 1e3 * t.backward / trained,
      1e3 * t.push / trained, 1e3 * t.allreduce / trained,
      1e3 * t.optimizer / trained, 1e3 * t.lookup_wait / trained,
      1e3 * t.prefetch / trained, t.eval));
  if (const std::string path = PathForRank(absl::GetFlag(FLAGS_dense_out), run.rank);
      !path.empty()) {
    std::vector<float> p;
    if (absl::Status s = run.trainer->model().ReadParameters(&p); !s.ok()) {
      LogError("--dense_out: reading the parameters: ", s.message());
      return 1;
    }
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(p.data()), p.size() * sizeof(float));
  }
  if (const std::string path = PathForRank(absl::GetFlag(FLAGS_result_json), run.rank);
      !path.empty()) {
    std::ofstream(path) << ResultJson(result, run.world);
  }
  Leave(run);
  return run.checkpoints->FinalExitCode(result.steps);
}

// Trains, then reports: a failure, a pre-emption (after its checkpoint) or
// the finished run.
int Train(RankRun& run) {
  absl::StatusOr<TrainResult> result = run.trainer->Run();
  if (!result.ok()) return ReportFailure(run, result.status());
  if (result->preempted) {
    const bool here = WorkerCheckpoints::StopSignalledHere();
    LogInfo("pre-empted", here ? "" : " (another rank was; start this one again to resume)",
            ": checkpoint at step ", result->steps);
    if (const std::string path = PathForRank(absl::GetFlag(FLAGS_result_json), run.rank);
        !path.empty()) {
      std::ofstream(path) << ResultJson(*result, run.world);
    }
    Leave(run);
    return here ? 0 : kExitStoppedForPeer;
  }
  return ReportDone(run, *result);
}

// One rank's whole run: register, load the job, find (or start) the shard
// servers, resume, set up the client, data, allreduce and trainer, train,
// report. Returns the process's exit code (each step's: 0 goes on).
int RunRank(int rank, int world, ProcessShared* shared) {
  RankRun run(rank, world, shared);
  if (const int code = Register(run); code != 0) return code;
  if (const int code = LoadJob(run); code != 0) return code;
  if (const int code = FindShards(run); code != 0) return code;
  run.checkpoints = std::make_unique<WorkerCheckpoints>(
      rank, run.job, run.coordinator.get(), run.lease.get(),
      absl::GetFlag(FLAGS_checkpoint_timeout));
  if (const int code = run.checkpoints->Resume(); code != 0) return code;
  if (const int code = CreateClient(run); code != 0) return code;
  if (const int code = OpenData(run); code != 0) return code;
  if (const int code = JoinAllreduce(run); code != 0) return code;
  if (const int code = CreateTrainer(run); code != 0) return code;
  if (const int code = StartTraining(run); code != 0) return code;
  return Train(run);
}

int Run() {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  const std::string coordinator_address = absl::GetFlag(FLAGS_coordinator);
  if (config_path.empty() && coordinator_address.empty()) {
    LogError("give --coordinator=host:port, or --config (a text-format "
             "recps.v1.JobConfig) with --shards");
    return 2;
  }
  const int rank = absl::GetFlag(FLAGS_rank) >= 0 ? absl::GetFlag(FLAGS_rank)
                                                  : EnvInt("RANK", 0);
  const int world = absl::GetFlag(FLAGS_world_size) >= 1
                        ? absl::GetFlag(FLAGS_world_size)
                        : EnvInt("WORLD_SIZE", 1);
  const int local_ranks = absl::GetFlag(FLAGS_local_ranks);
  if (local_ranks < 1) {
    LogError("--local_ranks=", local_ranks, ": must be >= 1");
    return 2;
  }
  if (rank < 0 || rank + local_ranks > world) {
    LogError(local_ranks > 1 ? absl::StrCat("ranks ", rank, "..", rank + local_ranks - 1,
                                            " (--local_ranks=", local_ranks, ") are")
                             : absl::StrCat("rank ", rank, " is"),
             " outside [0, ", world, ")");
    return 2;
  }
  if (local_ranks > 1) {
    for (const auto& [flag, path] :
         {std::pair<const char*, std::string>{"result_json", absl::GetFlag(FLAGS_result_json)},
          {"dense_out", absl::GetFlag(FLAGS_dense_out)},
          {"loss_log", absl::GetFlag(FLAGS_loss_log)}}) {
      if (!path.empty() && !absl::StrContains(path, "{rank}")) {
        LogError("--", flag, "=", path, ": with --local_ranks=", local_ranks,
                 " the path needs {rank} (each rank writes its own)");
        return 2;
      }
    }
  }
  SetLogTag(local_ranks > 1 ? "recps-worker" : absl::StrCat("recps-worker ", rank));
  ProcessShared shared;
  shared.first_rank = rank;
  shared.local_ranks = local_ranks;
  // The device first: a worker that cannot run where it was asked to stops
  // before it registers anywhere.
  absl::StatusOr<kernels::Device> device =
      kernels::ParseDevice(absl::GetFlag(FLAGS_device), &shared.cuda_device);
  if (!device.ok()) {
    LogError("--device: ", device.status().message());
    return 2;
  }
  if (absl::Status s = kernels::CheckDeviceUsable(*device, shared.cuda_device); !s.ok()) {
    LogError("--device=", absl::GetFlag(FLAGS_device), ": ", s.message());
    return 2;
  }
  shared.device = *device;
  if (local_ranks > 1 && shared.device != kernels::Device::kCpu) {
    LogError("--local_ranks=", local_ranks, " runs CPU workers only: a GPU worker is one "
             "process per GPU (recps launch)");
    return 2;
  }

  // Metrics: one registry and /metrics endpoint for the process.
  shared.registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<prometheus::Exposer> exposer;
  if (const std::string addr = absl::GetFlag(FLAGS_metrics_listen); !addr.empty()) {
    exposer = std::make_unique<prometheus::Exposer>(addr);
    exposer->RegisterCollectable(shared.registry);
    const std::vector<int> ports = exposer->GetListeningPorts();
    const int metrics_port = ports.empty() ? 0 : ports[0];
    LogInfo("metrics on port ", metrics_port);
    if (const std::string path = absl::GetFlag(FLAGS_port_file); !path.empty()) {
      if (absl::Status s = WritePortFile(path, 0, metrics_port); !s.ok()) {
        LogError(s.message());
        return 1;
      }
    }
  }

  int code = 0;
  if (local_ranks == 1) {
    code = RunRank(rank, world, &shared);
  } else {
    // One thread per rank. A rank that fails takes the process down at once:
    // its peers here would otherwise wait for it until a timeout.
    // A rank that finished with a failed final checkpoint is no failure of
    // its peers: they finish too (the same answer reached all of them).
    std::vector<std::thread> ranks;
    std::atomic<bool> final_checkpoint_failed{false};
    for (int r = rank; r < rank + local_ranks; ++r) {
      ranks.emplace_back([r, world, &shared, &final_checkpoint_failed] {
        SetThreadLogTag(absl::StrCat("recps-worker ", r));
        const int c = RunRank(r, world, &shared);
        if (c == kExitFinalCheckpointFailed) {
          final_checkpoint_failed = true;
        } else if (c != 0) {
          LogError("rank ", r, " failed: stopping this process's ", shared.local_ranks,
                   " ranks");
          std::fflush(nullptr);
          _exit(c);
        }
      });
    }
    for (std::thread& t : ranks) t.join();
    if (final_checkpoint_failed) code = kExitFinalCheckpointFailed;
  }
  std::fflush(nullptr);
  _exit(code);  // skip the metrics exposer's slow stop (see recps-shard)
}

}  // namespace
}  // namespace recps::worker

int main(int argc, char** argv) {
  recps::SetFlagsUsageFromMainFile(__FILE__);
  absl::SetProgramUsageMessage(
      "recps worker: trains a job's DLRM against the shard servers.\n"
      "  recps-worker --coordinator=HOST:PORT [--rank=R --world_size=W]\n"
      "  recps-worker --config=JOB --shards=HOST:PORT[,HOST:PORT...] "
      "[--rank=R --world_size=W --rendezvous_dir=DIR]\n"
      "  recps-worker ... --embedded_shard   (run a shard server inside the worker)");
  absl::ParseCommandLine(argc, argv);
  recps::SetLogTag("recps-worker");
  // Before any thread starts: it may re-execute the program.
  if (absl::Status s = recps::kernels::UseFastestBlasKernels(
          absl::GetFlag(FLAGS_blas_kernels), argv);
      !s.ok()) {
    recps::LogError(s.message());
    return 2;
  }
  recps::rpc::InitProcessSecurityFromFlags();
  recps::TuneDataPlaneProcess();
  return recps::worker::Run();
}
