// The plain-TCP baselines for transfers between two processes on loopback,
// written as well as TCP allows, so that a transfer benchmark's ratio says
// how close Causeway comes to the socket and not how slow a naive loop is.
//
// A TcpBaseline forks a receiver process connected over loopback: Nagle off
// (TCP_NODELAY) and both socket buffers as large as the system allows
// (net.core.wmem_max / rmem_max; on a machine with 4 MiB caps, 8 MiB each;
// leaving the receive buffer to autotuning measured the same). The receiver
// recv()s every transfer into one receive buffer of the largest size,
// touched beforehand as a destination buffer would be, and answers each with
// 8 bytes (a checksum of what it got). The sender rotates through distinct
// source buffers (SourceBuffers: 64 MiB in all, every page written), so that
// no transfer reads a cache-hot source.
//
//   streamed:  transfers back to back, each sent in sends of at most
//              `frame_bytes` (the frame size of the transfer it is compared
//              with), keeping at most `depth` unanswered: the sender waits
//              for transfer i's answer only before sending transfer
//              i + depth. With the same depth as the Causeway figure it is
//              compared with, this is the baseline.
//   request/reply: streamed with a depth of 1 (each transfer waits for its
//              answer): the latency-bound loop, informative only.
//   one-way:   transfers back to back with no answers, one answer after the
//              last: the ceiling of the socket on this machine.
//
// Each figure is bytes / seconds over `transfers` transfers, in GB/s (1e9
// B/s), after one untimed transfer. Not thread-safe: one sender thread.
//
// Example:
//   auto tcp = TcpBaseline::Start(largest);
//   SourceBuffers sources(size, SourceBuffers::CountFor(size));
//   double gbps = tcp->Streamed(sources, /*transfers=*/64, /*depth=*/3, kDataChunkBytes);
#ifndef CAUSEWAY_BENCHMARKS_TCP_BASELINE_H_
#define CAUSEWAY_BENCHMARKS_TCP_BASELINE_H_

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmarks/bench_util.h"

namespace causeway::bench {

// A checksum of one byte a page and the last byte: cheap enough to leave in
// the timed loop, enough to catch a transfer that lost its place.
inline uint64_t PageChecksum(const uint8_t* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; i += 4096) h = (h ^ p[i]) * 1099511628211ull;
  if (n > 0) h = (h ^ p[n - 1]) * 1099511628211ull;
  return h;
}

// `count` distinct source buffers of `size` bytes, every byte written (a
// different pattern in each), taken in turn by Next().
class SourceBuffers {
 public:
  SourceBuffers(uint64_t size, int count) : size_(size) {
    for (int b = 0; b < count; ++b) {
      buffers_.emplace_back(size);
      for (uint64_t i = 0; i < size; ++i)
        buffers_.back()[i] = static_cast<uint8_t>((i + b) * 2654435761u >> 24);
    }
  }
  uint64_t size() const { return size_; }
  const std::vector<uint8_t>& Next() {
    next_ = (next_ + 1) % buffers_.size();
    return buffers_[next_];
  }
  // How many buffers make a rotation that no cache holds: 64 MiB in all, and
  // at least two.
  static int CountFor(uint64_t size) {
    return static_cast<int>(std::clamp<uint64_t>(((uint64_t{64} << 20) + size - 1) / size, 2, 64));
  }

 private:
  uint64_t size_;
  std::vector<std::vector<uint8_t>> buffers_;
  size_t next_ = 0;
};

class TcpBaseline {
 public:
  // Forks the receiver for transfers of at most `largest` bytes; aborts the
  // benchmark when it cannot.
  static std::unique_ptr<TcpBaseline> Start(uint64_t largest) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || listen(listener, 1) != 0) {
      Die(absl::StrCat("tcp baseline: listen: ", std::strerror(errno)));
    }
    std::fflush(stdout);
    auto tcp = std::unique_ptr<TcpBaseline>(new TcpBaseline());
    tcp->pid_ = fork();
    if (tcp->pid_ < 0) Die("tcp baseline: fork failed");
    if (tcp->pid_ == 0) {
      const int c = accept(listener, nullptr, nullptr);
      close(listener);
      if (c < 0) _exit(1);
      Tune(c);
      Serve(c, largest);
    }
    close(listener);
    tcp->fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (tcp->fd_ < 0 || connect(tcp->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Die(absl::StrCat("tcp baseline: connect: ", std::strerror(errno)));
    }
    Tune(tcp->fd_);
    return tcp;
  }

  ~TcpBaseline() {
    if (fd_ >= 0) {
      const Command quit{kQuit, 0, 0};
      (void)SendAll(fd_, &quit, sizeof(quit));
      close(fd_);
    }
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }

  // Sends one transfer of `bytes` and aborts unless the receiver got exactly
  // those bytes (by checksum).
  void Check(const std::vector<uint8_t>& bytes) {
    const Command c{kAnswerEach, bytes.size(), 1};
    if (!SendAll(fd_, &c, sizeof(c)) || !SendAll(fd_, bytes.data(), bytes.size())) Fail("check");
    if (Answer() != PageChecksum(bytes.data(), bytes.size()))
      Die("tcp baseline: the receiver got other bytes");
  }

  // See the file comment. GB/s.
  double Streamed(SourceBuffers& sources, int transfers, int depth, uint64_t frame_bytes) {
    Run(sources, 1, 1, frame_bytes, /*one_way=*/false);  // untimed
    const auto start = std::chrono::steady_clock::now();
    Run(sources, transfers, depth, frame_bytes, /*one_way=*/false);
    return Rate(sources.size() * transfers, start);
  }
  double RequestReply(SourceBuffers& sources, int transfers, uint64_t frame_bytes) {
    return Streamed(sources, transfers, 1, frame_bytes);
  }
  double OneWay(SourceBuffers& sources, int transfers, uint64_t frame_bytes) {
    Run(sources, 1, 1, frame_bytes, /*one_way=*/true);
    const auto start = std::chrono::steady_clock::now();
    Run(sources, transfers, 1, frame_bytes, /*one_way=*/true);
    return Rate(sources.size() * transfers, start);
  }

 private:
  enum Mode : uint64_t { kAnswerEach = 1, kAnswerLast = 2, kQuit = 3 };
  struct Command {
    uint64_t mode, size, count;
  };

  TcpBaseline() = default;

  // Nagle off; both socket buffers as large as the system allows (asking
  // for more than net.core.wmem_max / rmem_max gets the cap, doubled).
  static void Tune(int fd) {
    int one = 1, bytes = 64 << 20;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }

  static bool SendAll(int fd, const void* data, uint64_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      p += r;
      n -= static_cast<uint64_t>(r);
    }
    return true;
  }
  static bool RecvAll(int fd, void* data, uint64_t n) {
    uint8_t* p = static_cast<uint8_t*>(data);
    while (n > 0) {
      ssize_t r = recv(fd, p, n, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      p += r;
      n -= static_cast<uint64_t>(r);
    }
    return true;
  }

  [[noreturn]] static void Serve(int fd, uint64_t largest) {
    std::vector<uint8_t> buffer(largest, 1);  // touched, as a destination buffer would be
    for (;;) {
      Command c{};
      if (!RecvAll(fd, &c, sizeof(c)) || c.mode == kQuit || c.size > largest) _exit(0);
      uint64_t sum = 0;
      for (uint64_t i = 0; i < c.count; ++i) {
        if (!RecvAll(fd, buffer.data(), c.size)) _exit(1);
        if (c.mode == kAnswerEach || i + 1 == c.count) {
          sum = PageChecksum(buffer.data(), c.size);
          if (!SendAll(fd, &sum, sizeof(sum))) _exit(1);
        }
      }
    }
  }

  void Run(SourceBuffers& sources, int transfers, int depth, uint64_t frame_bytes, bool one_way) {
    const Command c{one_way ? kAnswerLast : kAnswerEach, sources.size(), static_cast<uint64_t>(transfers)};
    if (!SendAll(fd_, &c, sizeof(c))) Fail("command");
    int answered = 0;
    for (int i = 0; i < transfers; ++i) {
      if (!one_way && i - answered >= depth) Answer(), ++answered;
      const std::vector<uint8_t>& bytes = sources.Next();
      for (uint64_t done = 0; done < bytes.size(); done += frame_bytes) {
        if (!SendAll(fd_, bytes.data() + done, std::min(frame_bytes, bytes.size() - done))) Fail("send");
      }
    }
    for (int left = one_way ? 1 : transfers - answered; left > 0; --left) Answer();
  }

  uint64_t Answer() {
    uint64_t sum = 0;
    if (!RecvAll(fd_, &sum, sizeof(sum))) Fail("answer");
    return sum;
  }

  [[noreturn]] static void Fail(const char* what) {
    Die(absl::StrCat("tcp baseline: ", what, ": ", std::strerror(errno)));
  }

  static double Rate(uint64_t bytes, std::chrono::steady_clock::time_point start) {
    return bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 1e9;
  }

  int fd_ = -1;
  pid_t pid_ = -1;
};

}  // namespace causeway::bench

#endif  // CAUSEWAY_BENCHMARKS_TCP_BASELINE_H_
