// The worker's Prometheus metrics (docs/training.md, Monitoring): steps,
// samples, loss and held-out evaluation figures, the per-phase step times
// as one histogram with a `phase` label, and the staleness of the rows each
// step trained on.
#ifndef RECPS_WORKER_WORKER_METRICS_H_
#define RECPS_WORKER_WORKER_METRICS_H_

#include <array>
#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/eval_metrics.h"
#include "worker/trainer.h"

namespace recps::worker {

// The worker's Prometheus metrics: one metric per quantity, its unit in
// the name; the per-phase step times as one histogram with a `phase` label.
class WorkerMetrics {
 public:
  // `labels` on every metric: {{"rank", "R"}} where one process runs
  // several ranks (recps-worker --local_ranks) and they share a registry.
  explicit WorkerMetrics(prometheus::Registry& registry, const prometheus::Labels& labels = {})
      : steps_(prometheus::BuildCounter()
                   .Name("recps_worker_steps_total")
                   .Help("Training steps this worker completed")
                   .Register(registry)
                   .Add(labels)),
        samples_(prometheus::BuildCounter()
                     .Name("recps_worker_samples_total")
                     .Help("Training samples this worker processed")
                     .Register(registry)
                     .Add(labels)),
        samples_per_second_(prometheus::BuildGauge()
                                .Name("recps_worker_samples_per_second")
                                .Help("Training samples per second of this worker, "
                                      "averaged since training started")
                                .Register(registry)
                                .Add(labels)),
        loss_(prometheus::BuildGauge()
                  .Name("recps_worker_loss")
                  .Help("Mean training loss (binary cross-entropy) of the last step's batch")
                  .Register(registry)
                  .Add(labels)),
        evaluations_(prometheus::BuildCounter()
                         .Name("recps_worker_evaluations_total")
                         .Help("Held-out evaluations this worker ran")
                         .Register(registry)
                         .Add(labels)),
        eval_auc_(prometheus::BuildGauge()
                      .Name("recps_worker_eval_auc")
                      .Help("Held-out AUC (ratio, 0.5 = chance) of the last evaluation")
                      .Register(registry)
                      .Add(labels)),
        eval_log_loss_(prometheus::BuildGauge()
                           .Name("recps_worker_eval_log_loss")
                           .Help("Held-out log loss of the last evaluation")
                           .Register(registry)
                           .Add(labels)),
        eval_ne_(prometheus::BuildGauge()
                     .Name("recps_worker_eval_normalized_entropy")
                     .Help("Held-out normalised entropy (ratio; below 1 beats the base "
                           "rate) of the last evaluation")
                     .Register(registry)
                     .Add(labels)),
        step_seconds_(prometheus::BuildHistogram()
                          .Name("recps_worker_step_seconds")
                          .Help("Seconds one training step spent per phase (lookup_wait: "
                                "waiting for an overlapped lookup)")
                          .Register(registry)),
        lookup_staleness_(prometheus::BuildHistogram()
                              .Name("recps_worker_lookup_staleness_steps")
                              .Help("Steps of pushes (from every worker) missing from the "
                                    "embedding rows a training step read: 0 in sync mode, "
                                    "at most the staleness bound in bounded mode")
                              .Register(registry)
                              .Add(labels, StalenessBuckets())) {
    for (size_t i = 0; i < kPhases.size(); ++i) {
      prometheus::Labels phase = labels;
      phase["phase"] = kPhases[i].name;
      phases_[i] = &step_seconds_.Add(phase, Buckets());
    }
  }

  // One step: the phase times are `now - before` (both summed over steps);
  // `lookup_staleness` is the step's (TrainResult::last_lookup_staleness;
  // -1, not known, is not observed).
  void ObserveStep(const StepTimes& now, const StepTimes& before, int64_t samples,
                   float loss, double samples_per_second, int64_t lookup_staleness) {
    steps_.Increment();
    if (lookup_staleness >= 0) lookup_staleness_.Observe(static_cast<double>(lookup_staleness));
    samples_.Increment(static_cast<double>(samples));
    loss_.Set(loss);
    samples_per_second_.Set(samples_per_second);
    for (size_t i = 0; i < kPhases.size(); ++i) {
      phases_[i]->Observe(std::max(0.0, now.*kPhases[i].field - before.*kPhases[i].field));
    }
  }

  void ObserveEval(const EvalMetrics& m) {
    evaluations_.Increment();
    eval_auc_.Set(m.auc);
    eval_log_loss_.Set(m.log_loss);
    eval_ne_.Set(m.ne);
  }

 private:
  struct Phase {
    const char* name;
    double StepTimes::*field;
  };
  static constexpr std::array<Phase, 9> kPhases = {{
      {"data", &StepTimes::data},
      {"lookup", &StepTimes::lookup},
      {"forward", &StepTimes::forward},
      {"backward", &StepTimes::backward},
      {"push", &StepTimes::push},
      {"allreduce", &StepTimes::allreduce},
      {"optimizer", &StepTimes::optimizer},
      {"lookup_wait", &StepTimes::lookup_wait},
      {"prefetch", &StepTimes::prefetch},
  }};
  // 10 us to 10 s, three buckets a decade.
  static prometheus::Histogram::BucketBoundaries Buckets() {
    prometheus::Histogram::BucketBoundaries b;
    for (double decade = 1e-5; decade < 10; decade *= 10) {
      b.push_back(decade);
      b.push_back(2 * decade);
      b.push_back(5 * decade);
    }
    b.push_back(10);
    return b;
  }
  // Each step up to 4, then powers of two up to 1024.
  static prometheus::Histogram::BucketBoundaries StalenessBuckets() {
    prometheus::Histogram::BucketBoundaries b = {0, 1, 2, 3, 4};
    for (double s = 8; s <= 1024; s *= 2) b.push_back(s);
    return b;
  }

  prometheus::Counter& steps_;
  prometheus::Counter& samples_;
  prometheus::Gauge& samples_per_second_;
  prometheus::Gauge& loss_;
  prometheus::Counter& evaluations_;
  prometheus::Gauge& eval_auc_;
  prometheus::Gauge& eval_log_loss_;
  prometheus::Gauge& eval_ne_;
  prometheus::Family<prometheus::Histogram>& step_seconds_;
  prometheus::Histogram& lookup_staleness_;
  std::array<prometheus::Histogram*, kPhases.size()> phases_{};
};

}  // namespace recps::worker

#endif  // RECPS_WORKER_WORKER_METRICS_H_
