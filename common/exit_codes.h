// Exit codes that recps-worker and the launcher (`recps local`, `recps
// launch`) agree on beyond 0 (done), 1 (failed) and 2 (bad flags or job).
#ifndef RECPS_COMMON_EXIT_CODES_H_
#define RECPS_COMMON_EXIT_CODES_H_

namespace recps {

// The worker trained every step and wrote its results (final evaluation,
// --result_json), but the final checkpoint failed (e.g. a full disk): the
// previous complete checkpoint stays the newest. Not a reason to restart the
// job (it would train the same steps again and hit the same disk), so the
// launcher does not; it stops with this code too.
inline constexpr int kExitFinalCheckpointFailed = 3;

// The worker stopped at a pre-emption checkpoint that ANOTHER rank asked
// for (a SIGTERM elsewhere, e.g. one Kubernetes worker pod deleted): its
// state is saved, but its part of the job is not done. A scheduler that
// counts exit 0 as done (a Kubernetes Job's index) must start it again, and
// it then resumes from that checkpoint. A worker that got the signal itself
// exits 0. The launcher passes it on (EX_TEMPFAIL: "try again").
inline constexpr int kExitStoppedForPeer = 75;

}  // namespace recps

#endif  // RECPS_COMMON_EXIT_CODES_H_
