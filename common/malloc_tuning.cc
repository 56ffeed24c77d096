#include "common/malloc_tuning.h"

#include <cstdlib>  // defines __GLIBC__ when the C library is glibc

#include "absl/synchronization/mutex.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace recps {

void KeepLargeAllocationsMapped() {
#if defined(__GLIBC__)
  // Setting either fixes both (glibc otherwise adapts them at run time).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void TuneDataPlaneProcess() {
  KeepLargeAllocationsMapped();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace recps
