// What the shard bench's two parts share (bench/shard_bench.cc: lookups
// and pushes against raw TCP; bench/shard_bench_move.cc: slot moves): the
// row width, clocks, a process's CPU time, the raw loopback TCP anchor and
// order statistics.
#ifndef RECPS_BENCH_SHARD_BENCH_UTIL_H_
#define RECPS_BENCH_SHARD_BENCH_UTIL_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace recps::shard_bench {

// Floats per row of the bench's tables.
constexpr int kDim = 64;

// Seconds on the steady clock.
double Now();
// CPU seconds (user + system) process `pid` has used so far.
double ProcessCpuSeconds(pid_t pid);
// CPU seconds of this process.
double SelfCpuSeconds();
// Bytes per second through one warm loopback TCP connection (see the .cc).
double RawTcpBandwidth(size_t timed_bytes, size_t warmup_bytes);
// 0 for an empty `v`.
double Median(std::vector<double> v);
double Percentile(std::vector<double> v, double p);

// --op=move: two servers of `binary`, a worker stepping all the time; moves
// every slot of one server to the other and back. Reads --rows, --moves,
// --ids and --max_bytes_per_second from argv; passes the --move_* and
// --threads flags of `shard_flags` on. Returns the exit code.
int RunMoveBench(const std::string& binary, int argc, char** argv,
                 const std::vector<std::string>& shard_flags);

}  // namespace recps::shard_bench

#endif  // RECPS_BENCH_SHARD_BENCH_UTIL_H_
