#include "worker/result_json.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace recps::worker {

TimedRate TimedRateOf(const TrainResult& r) {
  TimedRate t;
  const auto n = static_cast<int64_t>(
      std::min(r.step_seconds.size(), r.step_samples.size()));
  t.warmup_steps = std::min<int64_t>(10, n / 10);
  for (int64_t i = t.warmup_steps; i < n; ++i) {
    t.seconds += r.step_seconds[i];
    t.samples += r.step_samples[i];
  }
  t.steps = n - t.warmup_steps;
  if (t.steps > 0 && t.seconds > 0) t.samples_per_second = t.samples / t.seconds;
  return t;
}

std::string ResultJson(const TrainResult& r, int world_size) {
  const TimedRate timed = TimedRateOf(r);
  std::string evals;
  for (const EvalRecord& e : r.evals) {
    absl::StrAppend(&evals, evals.empty() ? "" : ",",
                    absl::StrFormat("{\"step\":%d,\"auc\":%.6f,\"log_loss\":%.6f,\"ne\":%.6f,"
                                    "\"samples\":%d}",
                                    e.step, e.metrics.auc, e.metrics.log_loss,
                                    e.metrics.ne, e.metrics.samples));
  }
  std::string losses;
  for (float l : r.losses) absl::StrAppend(&losses, losses.empty() ? "" : ",", absl::StrFormat("%.9g", l));
  std::string step_seconds;
  for (double d : r.step_seconds) {
    absl::StrAppend(&step_seconds, step_seconds.empty() ? "" : ",", absl::StrFormat("%.6f", d));
  }
  std::string checkpoints;
  for (size_t i = 0; i < r.checkpoint_steps.size(); ++i) {
    absl::StrAppend(&checkpoints, checkpoints.empty() ? "" : ",",
                    absl::StrFormat("{\"step\":%d,\"seconds\":%.6f}", r.checkpoint_steps[i],
                                    r.checkpoint_seconds[i]));
  }
  const StepTimes& t = r.times;
  return absl::StrFormat(
      "{\"steps\":%d,\"samples\":%d,\"seconds\":%.3f,\"samples_per_second\":%.1f,"
      "\"warmup_steps\":%d,\"timed_steps\":%d,\"timed_seconds\":%.4f,"
      "\"timed_samples_per_second\":%.1f,\"world_size\":%d,"
      "\"job_timed_samples_per_second\":%.1f,"
      "\"last_loss\":%.6f,\"times\":{\"data\":%.4f,\"lookup\":%.4f,\"forward\":%.4f,"
      "\"backward\":%.4f,\"push\":%.4f,\"allreduce\":%.4f,\"optimizer\":%.4f,"
      "\"lookup_wait\":%.4f,\"eval\":%.4f,\"prefetch\":%.4f},"
      "\"evals\":[%s],\"losses\":[%s],\"start_step\":%d,\"step_seconds\":[%s],"
      "\"checkpoints\":[%s],\"preempted\":%s,\"max_lookup_staleness_steps\":%d}\n",
      r.steps, r.samples, r.seconds, r.samples / std::max(r.seconds, 1e-9),
      timed.warmup_steps, timed.steps, timed.seconds, timed.samples_per_second, world_size,
      world_size * timed.samples_per_second, r.last_loss,
      t.data, t.lookup, t.forward, t.backward, t.push, t.allreduce, t.optimizer,
      t.lookup_wait, t.eval, t.prefetch, evals, losses, r.steps - static_cast<int64_t>(r.losses.size()),
      step_seconds, checkpoints, r.preempted ? "true" : "false", r.max_lookup_staleness);
}

}  // namespace recps::worker
