// The worker's --result_json: one JSON object summing up a run (steps,
// samples/s, the per-phase step times, every evaluation, the losses and the
// checkpoints), read by `recps local` (the final AUC line), the benchmark
// scripts and the end-to-end tests.
#ifndef RECPS_WORKER_RESULT_JSON_H_
#define RECPS_WORKER_RESULT_JSON_H_

#include <string>

#include "worker/trainer.h"

namespace recps::worker {

// A worker's training rate in the steady state: the steps of this run
// after the first `warmup_steps` (connections, first-touch row creation,
// caches: min(10, a tenth of the steps)), over their wall time without the
// evaluations (checkpoint cuts at their end included: they are training's
// cost), and the samples they trained.
struct TimedRate {
  int64_t warmup_steps = 0;
  int64_t steps = 0;  // timed
  int64_t samples = 0;
  double seconds = 0;
  double samples_per_second = 0;  // 0 when no step is timed
};
TimedRate TimedRateOf(const TrainResult& r);

// `r` as one line of JSON (newline-terminated). `samples_per_second` is
// this worker's samples over the run's whole wall time (warm-up, evaluations
// and checkpoints included); `timed_samples_per_second` is TimedRateOf's;
// `job_timed_samples_per_second` is world_size times it (the workers of a
// sync job step in lockstep; an estimate in bounded and async modes).
// `max_lookup_staleness_steps` is TrainResult::max_lookup_staleness.
std::string ResultJson(const TrainResult& r, int world_size = 1);

}  // namespace recps::worker

#endif  // RECPS_WORKER_RESULT_JSON_H_
