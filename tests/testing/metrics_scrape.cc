#include "tests/testing/metrics_scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/match.h"

namespace recps::testing {

std::string ScrapeMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request =
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buf[8192];
      for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) response.append(buf, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") ||
      response.find(" 200 ") == std::string::npos || body == std::string::npos) {
    return "";
  }
  return response.substr(body + 4);
}

double MetricValue(const std::string& body, const std::string& name) {
  for (size_t at = 0; (at = body.find(name, at)) != std::string::npos; ++at) {
    const bool line_start = at == 0 || body[at - 1] == '\n';
    const size_t end = at + name.size();
    if (!line_start || end >= body.size()) continue;
    size_t value = std::string::npos;
    if (body[end] == ' ') {
      value = end + 1;
    } else if (body[end] == '{' || name.back() == '"') {
      const size_t close = body.find("} ", end);
      const size_t eol = body.find('\n', end);
      if (close != std::string::npos && close < eol) value = close + 2;
    }
    if (value != std::string::npos) return std::strtod(body.c_str() + value, nullptr);
  }
  return -1;
}

}  // namespace recps::testing
