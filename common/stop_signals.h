// SIGTERM and SIGINT, the signals that stop a recps process, taken
// synchronously (sigwait / sigtimedwait) rather than by a handler: block
// them before any thread starts, so that every thread inherits the mask and
// only the waiting thread sees them.
#ifndef RECPS_COMMON_STOP_SIGNALS_H_
#define RECPS_COMMON_STOP_SIGNALS_H_

#include <pthread.h>
#include <signal.h>

namespace recps {

// The set {SIGINT, SIGTERM}.
inline sigset_t StopSignals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  return stop;
}

// Blocks StopSignals() in the calling thread (call it first in main) and
// returns the set, for sigwait.
inline sigset_t BlockStopSignals() {
  const sigset_t stop = StopSignals();
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop;
}

}  // namespace recps

#endif  // RECPS_COMMON_STOP_SIGNALS_H_
