// Reading a daemon's Prometheus /metrics in tests.
#ifndef RECPS_TESTS_TESTING_METRICS_SCRAPE_H_
#define RECPS_TESTS_TESTING_METRICS_SCRAPE_H_

#include <string>

namespace recps::testing {

// The body of GET http://127.0.0.1:port/metrics, or "" on any failure
// (5 s socket timeout).
std::string ScrapeMetrics(int port);

// The value of the first sample line of `body` that starts with `name`
// followed by a space or '{' (e.g. "recps_shard_resident_bytes" or
// "recps_shard_requests_total{rpc=\"Lookup\""); -1 when there is none.
double MetricValue(const std::string& body, const std::string& name);

}  // namespace recps::testing

#endif  // RECPS_TESTS_TESTING_METRICS_SCRAPE_H_
