// The worker's --result_json: one JSON object summing up a run (steps,
// samples/s, the per-phase step times, every evaluation, the losses and the
// checkpoints), read by `recps local` (the final AUC line), the benchmark
// scripts and the end-to-end tests.
#ifndef RECPS_WORKER_RESULT_JSON_H_
#define RECPS_WORKER_RESULT_JSON_H_

#include <string>

#include "worker/trainer.h"

namespace recps::worker {

// `r` as one line of JSON (newline-terminated).
std::string ResultJson(const TrainResult& r);

}  // namespace recps::worker

#endif  // RECPS_WORKER_RESULT_JSON_H_
