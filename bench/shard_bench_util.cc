#include "bench/shard_bench_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

namespace recps::shard_bench {

double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU seconds (user + system) process `pid` has used so far.
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  // Fields after the command name, which may hold spaces: state is field 3,
  // utime and stime are fields 14 and 15.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

double SelfCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Bytes per second through one loopback TCP connection in its steady state,
// sender and receiver in two threads, 4 MiB writes. The first
// `warmup_bytes` are not timed: a fresh connection starts with small
// windows and socket buffers, which the kernel grows over the first hundred
// MiB or so (timed from the start, 512 MiB ran ~20% slower), while the
// client's connection to the server is long warmed up.
double RawTcpBandwidth(size_t timed_bytes, size_t warmup_bytes) {
  const size_t total_bytes = warmup_bytes + timed_bytes;
  int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  listen(listener, 1);
  std::thread receiver([&] {
    int conn = accept(listener, nullptr, nullptr);
    std::vector<char> buf(4 << 20);
    size_t got = 0;
    while (got < total_bytes) {
      const ssize_t n = read(conn, buf.data(), buf.size());
      if (n <= 0) break;
      got += n;
    }
    close(conn);
  });
  int sender = socket(AF_INET, SOCK_STREAM, 0);
  connect(sender, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  std::vector<char> buf(4 << 20, 'x');
  double start = Now();
  size_t sent = 0;
  while (sent < total_bytes) {
    if (sent == warmup_bytes) start = Now();
    const size_t chunk = std::min(buf.size(), (sent < warmup_bytes ? warmup_bytes : total_bytes) - sent);
    const ssize_t n = write(sender, buf.data(), chunk);
    if (n <= 0) break;
    sent += n;
  }
  close(sender);
  receiver.join();
  const double seconds = Now() - start;
  close(listener);
  return timed_bytes / seconds;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;  // a run whose first move failed
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min<size_t>(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace recps::shard_bench
