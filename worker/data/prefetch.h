// Reads ahead of the trainer: a background thread fills a bounded queue of
// batches from another source, so input work overlaps the training step.
#ifndef RECPS_WORKER_DATA_PREFETCH_H_
#define RECPS_WORKER_DATA_PREFETCH_H_

#include <memory>

#include "worker/data/batch.h"

namespace recps::worker {

// Returns a source that yields exactly what `inner` yields, in order,
// including its error or end of data after the batches before it. A
// background thread keeps up to `depth` batches (at least 1) ready; Batch
// objects are recycled between the thread and the consumer by swapping, so
// the steady state allocates nothing. The destructor stops and joins the
// thread even when the consumer stops early (it waits for an inner Next in
// progress to return). `inner` is used only by that thread.
std::unique_ptr<BatchSource> MakePrefetchingSource(
    std::unique_ptr<BatchSource> inner, int depth = 4);

}  // namespace recps::worker

#endif  // RECPS_WORKER_DATA_PREFETCH_H_
