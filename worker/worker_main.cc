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
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
#include "worker/collectives/nccl_collectives.h"
#include "worker/data/criteo.h"
#include "worker/data/prefetch.h"
#include "worker/data/synthetic.h"
#include "common/config/job_config.h"
#include "common/flags_usage.h"
#include "worker/model/dense_state.h"
#include "common/rpc/tls_flags.h"
#include "worker/embedded_shard.h"
#include "worker/result_json.h"
#include "worker/trainer.h"
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

// Set by SIGTERM/SIGINT when checkpoints are on: the trainer checkpoints at
// the next step boundary (agreed with the other workers) and returns.
std::atomic<bool> g_stop_requested{false};

void OnStopSignal(int sig) {
  // A second signal does not wait for the checkpoint.
  if (g_stop_requested.exchange(true)) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

void InstallStopHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
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

// One rank's whole run: register, start (or wait for) the embedded shard,
// set up the client, data, allreduce and trainer, train, report. Returns
// the process's exit code.
int RunRank(int rank, int world, ProcessShared* shared) {
  const std::string config_path = absl::GetFlag(FLAGS_config);
  const std::string coordinator_address = absl::GetFlag(FLAGS_coordinator);
  const kernels::Device* device = &shared->device;
  const int cuda_device = shared->cuda_device;
  const bool on_gpu = *device == kernels::Device::kCuda;

  // With a coordinator: register (retrying while it starts), then keep the
  // lease in the background for the whole run.
  std::unique_ptr<client::CoordinatorClient> coordinator;
  std::unique_ptr<client::CoordinatorLease> lease;
  v1::RegisterResponse registered;
  if (!coordinator_address.empty()) {
    coordinator = std::make_unique<client::CoordinatorClient>(coordinator_address);
    v1::RegisterRequest request;
    request.set_role(v1::WORKER);
    request.set_rank(rank);
    absl::StatusOr<v1::RegisterResponse> r = coordinator->Register(request);
    if (!r.ok()) {
      LogError(r.status().message());
      return 1;
    }
    registered = *std::move(r);
    LogInfo("registered with coordinator ", coordinator_address, " as ",
            registered.member_id());
    lease = std::make_unique<client::CoordinatorLease>(coordinator.get(), request,
                                                       &registered);
  }

  absl::StatusOr<v1::JobConfig> job;
  if (!config_path.empty()) {
    job = config::ReadJobConfig(config_path);
  } else if (registered.has_job()) {
    job = registered.job();
  } else {
    job = coordinator->GetJob();
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
  bool sync_prefetch = !absl::GetFlag(FLAGS_embedded_shard);  // auto
  if (const std::string prefetch = absl::GetFlag(FLAGS_sync_prefetch);
      prefetch != "auto" && !absl::SimpleAtob(prefetch, &sync_prefetch)) {
    LogError("--sync_prefetch=", prefetch, ": expected true, false or auto");
    return 2;
  }
  std::vector<std::string> shards =
      absl::StrSplit(absl::GetFlag(FLAGS_shards), ',', absl::SkipEmpty());
  // The process's embedded shard outlives every rank's client (ProcessShared).
  server::ShardProcess* embedded_shard = nullptr;
  if (absl::GetFlag(FLAGS_embedded_shard)) {
    if (coordinator == nullptr && (world != shared->local_ranks || !shards.empty())) {
      LogError("--embedded_shard without --coordinator serves every slot alone: it needs "
               "--world_size=1 (or all ranks in this process, --local_ranks) and no "
               "--shards (got --world_size=", world, ", ", shards.size(), " --shards)");
      return 2;
    }
    if (rank == shared->first_rank) {
      absl::StatusOr<std::unique_ptr<server::ShardProcess>> started =
          StartEmbeddedShard(*job, world, shared->local_ranks, coordinator_address,
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
    embedded_shard = shared->shard.get();
    if (coordinator == nullptr) shards = {embedded_shard->address()};
  }
  if (coordinator == nullptr && shards.empty()) {
    LogError("--shards is required without --coordinator (the shard servers' addresses)");
    return 2;
  }

  // Checkpoints need the coordinator (it gathers the cut and writes the
  // manifest); without one, or with training.checkpoint.dir empty, the run
  // is as before.
  const bool checkpoints =
      coordinator != nullptr && !job->training().checkpoint().dir().empty();
  if (checkpoints) InstallStopHandler();
  // Resume: the step to train from, the dense state and the data position
  // (the coordinator answers "no resume" for a fresh job).
  int64_t start_step = 0;
  int64_t batches_read = 0;
  v1::DenseState resume_dense;
  if (coordinator != nullptr) {
    absl::StatusOr<v1::GetResumeStateResponse> resume = FetchResumeState(*coordinator, rank);
    if (!resume.ok() && resume.status().code() == absl::StatusCode::kUnimplemented) {
      LogWarning("the coordinator does not know GetResumeState (older version): starting "
                 "from step 0");
    } else if (!resume.ok()) {
      LogError("asking the coordinator where to resume failed: ", resume.status().ToString());
      return 1;
    } else if (resume->resume()) {
      start_step = static_cast<int64_t>(resume->step());
      batches_read = resume->position().batches_read();
      if (!resume_dense.ParseFromString(resume->dense_state())) {
        LogError("the dense state of checkpoint ", resume->dir(), " (step ", start_step,
                 ") does not parse as recps.v1.DenseState");
        return 1;
      }
      if (start_step > job->training().steps()) {
        LogError("checkpoint ", resume->dir(), " is at step ", start_step,
                 ", past this job's training.steps ", job->training().steps());
        return 2;
      }
      if (batches_read != start_step) {
        LogWarning("checkpoint ", resume->dir(), ": rank ", rank, " had read ",
                   batches_read, " batches at step ", start_step, "; resuming its data there");
      }
    }
  }

  std::vector<client::TableSchema> tables;
  for (const v1::TableConfig& t : job->tables()) tables.push_back({t.name(), t.dim()});
  client::EmbeddingClientOptions client_options;
  client_options.worker_rank = rank;
  client_options.encoding = config::WireEncoding(job->training());
  if (embedded_shard != nullptr) client_options.in_process_shard = embedded_shard->endpoint();
  if (client_options.encoding != v1::ROW_ENCODING_FLOAT32) {
    LogInfo("rows and gradients travel as ", v1::RowEncoding_Name(client_options.encoding),
            " (training.wire_precision)");
  }
  // The coordinator's map wins when both are given: it is the one that
  // changes with a rebalance.
  absl::StatusOr<std::unique_ptr<client::EmbeddingClient>> client =
      client::EmbeddingClient::Create(
          tables,
          coordinator != nullptr ? client::MakeCoordinatorShardMapSource(coordinator.get())
                                 : client::MakeServerShardMapSource(shards),
          client_options);
  if (!client.ok()) {
    LogError(client.status().message());
    return 1;
  }
  client::EmbeddingClient* const embedding = client->get();  // the trainer owns it

  const int64_t batch_size = job->training().batch_size();
  std::unique_ptr<BatchSource> train;
  std::function<absl::StatusOr<std::unique_ptr<BatchSource>>()> make_eval;
  if (job->data().has_synthetic()) {
    const SyntheticConfig cfg = ToSyntheticConfig(job->data().synthetic());
    train = MakeSyntheticSource(cfg, rank, world, batch_size, job->training().steps());
    const int64_t eval_batches = job->training().eval_batches();
    make_eval = [cfg, rank, world, batch_size, eval_batches]()
        -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      SyntheticConfig eval_cfg = cfg;
      eval_cfg.first_sample = kEvalSampleOffset;
      return MakeSyntheticSource(eval_cfg, rank, world, batch_size, eval_batches);
    };
  } else {
    CriteoConfig cfg;
    const v1::CriteoDataConfig& c = job->data().criteo();
    cfg.paths.assign(c.train_paths().begin(), c.train_paths().end());
    cfg.hash_buckets.assign(c.hash_buckets().begin(), c.hash_buckets().end());
    cfg.num_categorical = job->features_size();  // one TSV field per feature
    absl::StatusOr<std::unique_ptr<BatchSource>> source =
        MakeCriteoSource(cfg, rank, world, batch_size);
    if (!source.ok()) {
      LogError(source.status().message());
      return 2;
    }
    train = *std::move(source);
    CriteoConfig eval_cfg = cfg;
    eval_cfg.paths.assign(c.eval_paths().begin(), c.eval_paths().end());
    if (!eval_cfg.paths.empty()) {
      make_eval = [eval_cfg, rank, world, batch_size] {
        return MakeCriteoSource(eval_cfg, rank, world, batch_size);
      };
    }
  }
  if (batches_read > 0) {
    // Seek before the prefetch thread starts reading.
    const absl::Time start = absl::Now();
    absl::StatusOr<int64_t> skipped = train->Skip(batches_read);
    if (!skipped.ok()) {
      LogError("skipping the ", batches_read, " batches trained before the checkpoint: ",
               skipped.status().ToString());
      return 1;
    }
    if (*skipped < batches_read) {
      LogError("the training data ends after ", *skipped, " batches, but the checkpoint "
               "says rank ", rank, " read ", batches_read);
      return 2;
    }
    LogInfo(absl::StrFormat("data position: skipped %d batches in %.2f s", batches_read,
                            absl::ToDoubleSeconds(absl::Now() - start)));
  }
  train = MakePrefetchingSource(std::move(train), 4);

  // Metrics: one per quantity, named with its unit (docs/training.md); the
  // ranks of one process tell theirs apart by a rank label.
  WorkerMetrics metrics(*shared->registry,
                        shared->local_ranks > 1
                            ? prometheus::Labels{{"rank", absl::StrCat(rank)}}
                            : prometheus::Labels{});

  // Data parallelism: an allreduce over the dense gradients, Gloo for CPU
  // workers, NCCL (on the worker's GPU, device pointers) for CUDA workers.
  std::unique_ptr<KeyValueStore> rendezvous;
  std::unique_ptr<Collectives> collectives;
  if (world > 1) {
    const std::string dir = absl::GetFlag(FLAGS_rendezvous_dir);
    std::string prefix = absl::GetFlag(FLAGS_rendezvous_prefix);
    if (prefix.empty()) prefix = job->name().empty() ? "recps" : job->name();
    if (!dir.empty()) {
      rendezvous = std::make_unique<FileKeyValueStore>(dir);
    } else if (coordinator != nullptr) {
      rendezvous = std::make_unique<CoordinatorKeyValueStore>(coordinator.get());
      absl::StatusOr<std::string> fresh =
          FreshRendezvousPrefix(*coordinator, absl::StrCat("rendezvous/", prefix), rank,
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
      hostname = coordinator != nullptr ? LocalAddressToward(coordinator_address)
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
        on_gpu ? CreateNcclCollectives(*rendezvous, prefix, rank, world, cuda_device,
                                       absl::GetFlag(FLAGS_collective_timeout))
               : CreateGlooCollectives(*rendezvous, prefix, rank, world, hostname,
                                       absl::GetFlag(FLAGS_collective_timeout));
    if (!made.ok()) {
      LogError(on_gpu ? "NCCL" : "Gloo", " allreduce set-up failed: ",
               made.status().ToString());
      return 1;
    }
    collectives = *std::move(made);
  }

  // Ranks in one process split the cores unless --threads says otherwise.
  int threads = absl::GetFlag(FLAGS_threads);
  if (threads <= 0 && shared->local_ranks > 1) {
    threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) /
                              shared->local_ranks);
  }
  ThreadPool pool(threads);
  TrainerOptions options;
  if (collectives != nullptr) {
    options.allreduce = [&collectives](absl::Span<float> grads) {
      return AllReduceInBuckets(*collectives, grads, int64_t{1} << 20);
    };
  }
  options.rank = rank;
  options.world_size = world;
  options.start_step = start_step;
  // The final checkpoint's error: the run still evaluates and reports, then
  // exits kExitFinalCheckpointFailed (the launcher does not retrain).
  absl::Status final_checkpoint;
  if (checkpoints) {
    options.checkpoint_every = job->training().checkpoint().every_steps();
    options.stop_requested = [] { return g_stop_requested.load(); };
    client::CoordinatorLease* const lease_ptr = lease.get();
    options.checkpoint_request_id = [lease_ptr] { return lease_ptr->checkpoint_request_id(); };
    options.checkpoint = [&, lease_ptr](const CheckpointCutInfo& info) -> absl::Status {
      const absl::Time start = absl::Now();
      v1::CheckpointCutRequest request;
      request.set_member_id(lease_ptr->member_id());
      request.set_rank(rank);
      request.set_step(static_cast<uint64_t>(info.step));
      if (rank == 0) request.set_dense_state(info.dense.SerializeAsString());
      request.mutable_position()->set_rank(rank);
      request.mutable_position()->set_batches_read(info.batches_read);
      request.set_wait_complete(info.wait_complete);
      request.set_reason(info.reason);
      absl::StatusOr<v1::CheckpointCutResponse> cut =
          coordinator->CheckpointCut(request, absl::GetFlag(FLAGS_checkpoint_timeout));
      if (!cut.ok() && !info.wait_complete) {
        // Every worker gets the same answer (the cut is a barrier): all go
        // on, and the previous complete checkpoint stays the one to resume.
        LogWarning("checkpoint at step ", info.step, " (", info.reason, ") failed; training "
                   "goes on and the previous complete checkpoint stays: ",
                   cut.status().message());
        return absl::OkStatus();
      }
      if (!cut.ok() && info.reason == "final") {
        // Every step is trained and every worker got this answer: finish
        // (final evaluation, results) and report it then. The previous
        // complete checkpoint stays the newest.
        final_checkpoint = absl::Status(
            cut.status().code(), absl::StrCat("final checkpoint at step ", info.step,
                                              " failed: ", cut.status().message()));
        LogError(final_checkpoint.ToString());
        return absl::OkStatus();
      }
      if (!cut.ok()) {
        return absl::Status(cut.status().code(),
                            absl::StrCat("checkpoint cut at step ", info.step, " (",
                                         info.reason, "): ", cut.status().message()));
      }
      LogInfo(absl::StrFormat("checkpoint at step %d (%s) %s: training stalled %.1f ms",
                              info.step, info.reason,
                              info.wait_complete ? "complete in " + cut->dir()
                                                 : "cut, writing " + cut->dir(),
                              1e3 * absl::ToDoubleSeconds(absl::Now() - start)));
      return absl::OkStatus();
    };
  }
  options.sync_prefetch = sync_prefetch;
  // The stream and cuBLAS handle of a CUDA worker (nothing for the CPU).
  absl::StatusOr<std::unique_ptr<kernels::ExecResources>> exec =
      kernels::ExecResources::Create(*device, cuda_device, &pool);
  if (!exec.ok()) {
    LogError("--device=", absl::GetFlag(FLAGS_device), ": ", exec.status().message());
    return 2;
  }
  options.ctx = (*exec)->ctx();
  options.pool_on_device = absl::GetFlag(FLAGS_pool_on_device);
  const int64_t total_steps = job->training().steps();
  absl::Time last_print = absl::InfinitePast();
  double last_auc = -1;
  const absl::Duration every = absl::GetFlag(FLAGS_progress_every);
  StepTimes times_so_far;
  int64_t samples_so_far = 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> loss_log(nullptr, &std::fclose);
  if (const std::string path = PathForRank(absl::GetFlag(FLAGS_loss_log), rank);
      !path.empty()) {
    loss_log.reset(std::fopen(path.c_str(), "a"));
    if (loss_log == nullptr) {
      LogError("--loss_log=", path, ": cannot open for appending: ", std::strerror(errno));
      return 2;
    }
  }
  options.on_step = [&](int64_t step, float loss, const TrainResult& r) {
    if (loss_log != nullptr) {
      std::fprintf(loss_log.get(), "%lld %.9g\n", static_cast<long long>(step), loss);
      std::fflush(loss_log.get());
    }
    const double rate = r.samples / std::max(r.seconds, 1e-9);
    metrics.ObserveStep(r.times, times_so_far, r.samples - samples_so_far, loss, rate);
    times_so_far = r.times;
    samples_so_far = r.samples;
    if (absl::Now() - last_print < every && step + 1 != total_steps) return;
    last_print = absl::Now();
    const double eta = (total_steps - step - 1) * r.seconds /
                       std::max<int64_t>(step + 1 - start_step, 1);
    LogInfo(absl::StrFormat("step %d/%d  loss %.4f  %s%.0f samples/s  eta %.0fs",
                            step + 1, total_steps, loss,
                            last_auc >= 0 ? absl::StrFormat("auc %.4f  ", last_auc) : "",
                            rate, eta));
  };
  options.on_eval = [&](const EvalRecord& e) {
    last_auc = e.metrics.auc;
    metrics.ObserveEval(e.metrics);
    LogInfo(absl::StrFormat("eval after step %d: auc %.4f  log loss %.4f  ne %.4f  (%d samples)",
                            e.step, e.metrics.auc, e.metrics.log_loss, e.metrics.ne,
                            e.metrics.samples));
  };

  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(
      *job, *std::move(client), std::move(train), make_eval, std::move(options));
  if (!trainer.ok()) {
    LogError(trainer.status().message());
    return 2;
  }
  // Follows the coordinator's map so that a new epoch reaches the client at
  // once, not only when a shard server refuses a stale one. Declared after
  // the trainer: stopped before the client goes.
  std::unique_ptr<client::ShardMapWatcher> map_watcher;
  if (coordinator != nullptr) {
    map_watcher = std::make_unique<client::ShardMapWatcher>(
        coordinator.get(), embedding->shard_map_epoch(), [embedding](ShardMap map) {
          const uint64_t epoch = map.epoch();
          if (absl::Status s = embedding->OfferShardMap(std::move(map)); !s.ok()) {
            LogWarning("shard map epoch ", epoch, " from the coordinator: ", s.message());
          } else {
            LogInfo("routing by shard map epoch ", embedding->shard_map_epoch());
          }
        });
  }
  if (start_step > 0) {
    if (absl::Status s = LoadDenseState(resume_dense, &(*trainer)->model(),
                                        &(*trainer)->optimizer());
        !s.ok()) {
      LogError("loading the checkpoint's dense state: ", s.message());
      return 2;
    }
    LogInfo("resuming at step ", start_step, " of ", total_steps,
            ": dense model and optimizer loaded, data at batch ", batches_read);
  }
  if (collectives != nullptr) {
    // Every replica starts from rank 0's parameters.
    if (absl::Status s = collectives->Broadcast((*trainer)->model().parameters(), 0);
        !s.ok()) {
      LogError("broadcasting the initial parameters failed: ", s.ToString());
      return 1;
    }
  }
  LogInfo("training ", job->name().empty() ? config_path : job->name(), ": ",
          total_steps, " steps of ", batch_size, " samples, rank ", rank, " of ", world,
          ", shard map from ",
          coordinator != nullptr ? "coordinator " + coordinator_address
                                 : absl::StrCat(shards.size(), " shard server(s)"),
          "; sync prefetch ", sync_prefetch ? "on" : "off", " (--sync_prefetch=",
          absl::GetFlag(FLAGS_sync_prefetch), ")",
          on_gpu ? "" : "; OpenBLAS kernels " + kernels::BlasKernelsDescription());
  absl::StatusOr<TrainResult> result = (*trainer)->Run();
  if (!result.ok()) {
    LogError("training failed: ", result.status().ToString());
    if (coordinator != nullptr) {
      // A peer that died stops heartbeating (and its lease runs out): give
      // it two heartbeat intervals, then name whoever stayed silent,
      // whatever the error above says. This worker keeps heartbeating.
      const absl::Time failed = absl::Now();
      absl::SleepFor(std::min(absl::Milliseconds(registered.lease_ms()) * 2 / 3 +
                                  absl::Milliseconds(300),
                              absl::Seconds(8)));
      if (const std::string silent = coordinator->DescribeSilentWorkers(failed);
          !silent.empty()) {
        LogError("workers silent at the coordinator since the failure: ", silent);
      }
    }
    return 1;
  }
  if (result->preempted) {
    LogInfo("pre-empted: checkpoint at step ", result->steps);
    if (const std::string path = PathForRank(absl::GetFlag(FLAGS_result_json), rank);
        !path.empty()) {
      std::ofstream(path) << ResultJson(*result);
    }
    StopEmbeddedShard(rank, collectives.get(), shared);
    if (lease != nullptr) lease->Leave();
    return 0;
  }
  const StepTimes& t = result->times;
  const int64_t trained = std::max<int64_t>(result->steps - start_step, 1);
  LogInfo(absl::StrFormat(
      "done: %d steps, %.0f samples/s; per step: data %.2f ms, lookup %.2f ms, "
      "forward %.2f ms, backward %.2f ms, push %.2f ms, allreduce %.2f ms, "
      "optimizer %.2f ms, waiting for overlapped lookups %.2f ms (prefetch %.2f ms "
      "beside the step); evaluation %.1f s",
      result->steps, result->samples / std::max(result->seconds, 1e-9),
      1e3 * t.data / trained, 1e3 * t.lookup / trained,
      1e3 * t.forward / trained, 1e3 * t.backward / trained,
      1e3 * t.push / trained, 1e3 * t.allreduce / trained,
      1e3 * t.optimizer / trained, 1e3 * t.lookup_wait / trained,
      1e3 * t.prefetch / trained, t.eval));
  if (const std::string path = PathForRank(absl::GetFlag(FLAGS_dense_out), rank);
      !path.empty()) {
    std::vector<float> p;
    if (absl::Status s = (*trainer)->model().ReadParameters(&p); !s.ok()) {
      LogError("--dense_out: reading the parameters: ", s.message());
      return 1;
    }
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(p.data()), p.size() * sizeof(float));
  }
  if (const std::string path = PathForRank(absl::GetFlag(FLAGS_result_json), rank);
      !path.empty()) {
    std::ofstream(path) << ResultJson(*result);
  }
  StopEmbeddedShard(rank, collectives.get(), shared);
  if (lease != nullptr) lease->Leave();
  if (!final_checkpoint.ok()) {
    LogError("trained all ", result->steps, " steps and wrote the results, but ",
             final_checkpoint.ToString());
    return kExitFinalCheckpointFailed;
  }
  return 0;
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
