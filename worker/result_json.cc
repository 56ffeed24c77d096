#include "worker/result_json.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace recps::worker {

std::string ResultJson(const TrainResult& r) {
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
      "\"last_loss\":%.6f,\"times\":{\"data\":%.4f,\"lookup\":%.4f,\"forward\":%.4f,"
      "\"backward\":%.4f,\"push\":%.4f,\"allreduce\":%.4f,\"optimizer\":%.4f,"
      "\"lookup_wait\":%.4f,\"eval\":%.4f,\"prefetch\":%.4f},"
      "\"evals\":[%s],\"losses\":[%s],\"start_step\":%d,\"step_seconds\":[%s],"
      "\"checkpoints\":[%s],\"preempted\":%s}\n",
      r.steps, r.samples, r.seconds, r.samples / std::max(r.seconds, 1e-9), r.last_loss,
      t.data, t.lookup, t.forward, t.backward, t.push, t.allreduce, t.optimizer,
      t.lookup_wait, t.eval, t.prefetch, evals, losses, r.steps - static_cast<int64_t>(r.losses.size()),
      step_seconds, checkpoints, r.preempted ? "true" : "false");
}

}  // namespace recps::worker
