// Process-wide malloc settings for processes that move megabytes per RPC
// (shard servers, workers). gRPC allocates its receive buffers with malloc;
// by default glibc maps every allocation this large fresh and unmaps it on
// free, or trims the heap top, so each response is faulted in (the kernel
// zeroing every page) and handed back again: in profiles of 16 MB lookups
// that cost a quarter of the client's CPU.
#ifndef RECPS_COMMON_MALLOC_TUNING_H_
#define RECPS_COMMON_MALLOC_TUNING_H_

namespace recps {

// Serves allocations up to 32 MiB (glibc's largest heap threshold) from the
// heap and keeps up to 1 GiB of freed heap memory instead of returning it to
// the kernel. Call once at the start of main(), before threads start.
// A no-op where the C library is not glibc.
void KeepLargeAllocationsMapped();

// The process-wide settings of a data-plane process (shard server, worker,
// their benchmarks): KeepLargeAllocationsMapped, and abseil's mutex deadlock
// detector off. Debian's abseil is built without NDEBUG, so every
// Mutex::Lock also ran the detector (a global graph under a global lock):
// ~1% of a shard server's CPU at 64 stripe locks per lookup. Tests keep it.
// Call once at the start of main(), before threads start.
void TuneDataPlaneProcess();

}  // namespace recps

#endif  // RECPS_COMMON_MALLOC_TUNING_H_
