// Transfer throughput between two processes over the DCN transport (an
// authenticated connection carrying data frames) against a plain TCP socket
// copy of the same bytes on loopback, in the same run.
//
// The benchmark forks a receiver process; both cases connect it over
// loopback, each on its own connection made once:
//
//   tcp:       the baseline. The sender write()s an 8-byte size and then the
//              whole buffer (the kernel takes it in as large pieces as it
//              can); the receiver recv()s it into its buffer and answers
//              with one byte.
//   causeway:  a connection that passed the handshake with a shared secret
//              (HMAC-SHA256 both ways). The sender sends a control frame
//              with the size and the buffer as data frames of up to
//              kChunkBytes (each header and chunk in one gather write, no
//              copy); the receiver checks each frame header, reads the
//              payload straight into its buffer, and answers with a
//              heartbeat frame.
//
// A sample is one untimed transfer, then transfers repeated until at least
// sample_bytes have moved; its figure is bytes / seconds per transfer (from
// the first byte sent to the answer received), in GB/s (1e9 B/s). The cases
// alternate sample by sample; medians of `--runs` samples are printed with
// causeway's as a fraction of tcp's. Each size is checked once: the receiver
// sends back a checksum of what it got, which must match the sender's.
//
//   causeway_dcn_bench [--runs=9] [--sizes=1,4,16,64,256] [--quick] [--json=FILE]   (sizes in MiB)
// --quick: 1 sample of at least 32 MiB moved, sizes 1 and 4 MiB (seconds,
// for tests); --json: the figures as a list of results (bench_report.h).
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "transport/auth.h"
#include "transport/frame.h"
#include "transport/handshake.h"
#include "transport/socket.h"

namespace causeway::bench {
namespace {

using transport::FrameType;
using transport::Socket;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kChunkBytes = 64 * kMiB;     // data frame payload at most
double sample_bytes = 256.0 * kMiB;  // at least this much a sample (--quick: 32 MiB)
constexpr absl::Duration kTimeout = absl::Seconds(60);

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t Checksum(const uint8_t* p, uint64_t n) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < n; i += 4096) h = (h ^ p[i]) * 1099511628211ull;  // one byte a page
  if (n > 0) h = (h ^ p[n - 1]) * 1099511628211ull;
  return h;
}

absl::Time Deadline() { return absl::Now() + kTimeout; }

// Plain sockets for the baseline: whole-buffer send and recv loops.
absl::Status SendAll(int fd, const void* data, uint64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, uint64_t n) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return absl::UnavailableError(r == 0 ? "peer closed" : std::strerror(errno));
    p += r;
    n -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

// A blocking socket for the baseline (Socket is non-blocking, which would
// make the plain loops spin).
void MakeBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
}

// The receiver process: serves both connections until the sender closes them.
[[noreturn]] void Receive(const transport::SocketAddress& address, const transport::Secret& secret,
                          uint64_t largest) {
  std::vector<uint8_t> buffer(largest, 1);  // touched, as a destination buffer would be
  Socket tcp = Must(Socket::Connect(address, Deadline()), "receiver: connect (tcp)");
  Socket dcn = Must(Socket::Connect(address, Deadline()), "receiver: connect (causeway)");
  transport::ClientHandshakeOptions options;
  options.secret = secret;
  options.name = "receiver";
  Must(transport::ClientHandshake(dcn, options), "receiver: handshake");
  MakeBlocking(tcp.fd());
  // The sender names the connection of each transfer with one byte on tcp:
  // 't' (tcp), 'c' (causeway), or 'q'.
  for (;;) {
    char which = 0;
    if (!RecvAll(tcp.fd(), &which, 1).ok() || which == 'q') std::_Exit(0);
    uint64_t size = 0;
    if (which == 't') {
      CheckOk(RecvAll(tcp.fd(), &size, 8), "receiver: size");
      if (size > largest) Die("receiver: size over the largest");
      CheckOk(RecvAll(tcp.fd(), buffer.data(), size), "receiver: bytes");
    } else {
      transport::Frame control =
          Must(transport::ReadFrame(dcn, true, transport::kMaxControlPayload, Deadline()), "receiver: control");
      if (control.type != FrameType::kControl || control.payload.size() != 8) Die("receiver: expected the size");
      std::memcpy(&size, control.payload.data(), 8);
      if (size > largest) Die("receiver: size over the largest");
      for (uint64_t done = 0; done < size;) {
        transport::FrameHeader h =
            Must(transport::ReadFrameHeader(dcn, true, size - done, Deadline()), "receiver: data header");
        if (h.type != FrameType::kData) Die("receiver: expected data");
        CheckOk(dcn.ReadExact(buffer.data() + done, h.length, Deadline()), "receiver: data");
        done += h.length;
      }
    }
    const uint64_t sum = Checksum(buffer.data(), size);
    if (which == 't') {
      CheckOk(SendAll(tcp.fd(), &sum, 8), "receiver: answer");
    } else {
      absl::Span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(&sum), 8);
      CheckOk(transport::WriteFrame(dcn, FrameType::kHeartbeat, {piece}, Deadline()), "receiver: answer");
    }
  }
}

class Sender {
 public:
  Sender(Socket tcp, Socket dcn) : tcp_(std::move(tcp)), dcn_(std::move(dcn)) { MakeBlocking(tcp_.fd()); }

  // One transfer of `n` bytes of `data`; the receiver's checksum.
  uint64_t Tcp(const uint8_t* data, uint64_t n) {
    const char which = 't';
    CheckOk(SendAll(tcp_.fd(), &which, 1), "tcp: which");
    CheckOk(SendAll(tcp_.fd(), &n, 8), "tcp: size");
    CheckOk(SendAll(tcp_.fd(), data, n), "tcp: bytes");
    uint64_t sum = 0;
    CheckOk(RecvAll(tcp_.fd(), &sum, 8), "tcp: answer");
    return sum;
  }
  uint64_t Causeway(const uint8_t* data, uint64_t n) {
    const char which = 'c';
    CheckOk(SendAll(tcp_.fd(), &which, 1), "causeway: which");
    absl::Span<const uint8_t> size(reinterpret_cast<const uint8_t*>(&n), 8);
    CheckOk(transport::WriteFrame(dcn_, FrameType::kControl, {size}, Deadline()), "causeway: size");
    for (uint64_t done = 0; done < n; done += kChunkBytes) {
      absl::Span<const uint8_t> chunk(data + done, std::min(kChunkBytes, n - done));
      CheckOk(transport::WriteFrame(dcn_, FrameType::kData, {chunk}, Deadline()), "causeway: data");
    }
    transport::Frame answer = Must(transport::ReadFrame(dcn_, true, 64, Deadline()), "causeway: answer");
    if (answer.type != FrameType::kHeartbeat || answer.payload.size() != 8) Die("causeway: bad answer");
    uint64_t sum = 0;
    std::memcpy(&sum, answer.payload.data(), 8);
    return sum;
  }
  void Quit() {
    const char which = 'q';
    (void)SendAll(tcp_.fd(), &which, 1);
  }

 private:
  Socket tcp_, dcn_;
};

double Bandwidth(uint64_t bytes, const std::function<void()>& transfer) {
  transfer();
  const int reps = static_cast<int>(std::max<double>(1, sample_bytes / bytes));
  double t0 = NowSeconds();
  for (int i = 0; i < reps; ++i) transfer();
  return bytes * reps / (NowSeconds() - t0) / 1e9;
}

std::vector<uint64_t> ParseSizes(absl::string_view text) {
  std::vector<uint64_t> out;
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    uint64_t mib = 0;
    if (!absl::SimpleAtoi(s, &mib) || mib == 0) Die(absl::StrCat("bad size '", s, "' (MiB)"));
    out.push_back(mib * kMiB);
  }
  return out;
}

int Main(int argc, char** argv) {
  ProgramName() = "causeway_dcn_bench";
  const CommonFlags common = TakeCommonFlags(argc, argv);
  int runs = 9;
  std::vector<uint64_t> sizes = ParseSizes("1,4,16,64,256");
  if (common.quick) {
    runs = 1;
    sample_bytes = 32.0 * kMiB;
    sizes = ParseSizes("1,4");
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (absl::ConsumePrefix(&arg, "--runs=")) {
      if (!absl::SimpleAtoi(arg, &runs) || runs < 1) Die("--runs must be a positive integer");
    } else if (absl::ConsumePrefix(&arg, "--sizes=")) {
      sizes = ParseSizes(arg);
    } else {
      std::fprintf(stderr, "usage: %s [--runs=9] [--sizes=1,4,16,64,256] [--quick] [--json=FILE]   (sizes in MiB)\n",
                   argv[0]);
      return 2;
    }
  }
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> secret_bytes(32);
  CheckOk(transport::FillRandom(absl::MakeSpan(secret_bytes)), "secret");
  transport::Secret secret = Must(
      transport::Secret::FromBytes(absl::string_view(reinterpret_cast<const char*>(secret_bytes.data()), 32)),
      "secret");

  Socket listener =
      Must(Socket::Listen(Must(transport::SocketAddress::Parse("127.0.0.1:0"), "address"), 4), "listen");
  transport::SocketAddress address = Must(transport::SocketAddress::Parse(absl::StrCat("127.0.0.1:", listener.port())),
                                          "address");
  std::fflush(stdout);
  pid_t child = fork();
  if (child < 0) Die("fork failed");
  if (child == 0) {
    listener.Close();
    Receive(address, secret, largest);
  }
  Socket tcp = Must(listener.Accept(Deadline()), "accept (tcp)");
  Socket dcn = Must(listener.Accept(Deadline()), "accept (causeway)");
  transport::ServerHandshakeOptions options;
  options.secret = secret;
  options.name = "sender";
  Must(transport::ServerHandshake(dcn, options), "handshake");
  Sender sender(std::move(tcp), std::move(dcn));

  std::vector<uint8_t> data(largest);
  for (uint64_t i = 0; i < largest; ++i) data[i] = static_cast<uint8_t>(i * 2654435761u >> 24);
  std::printf("transfer between two processes over loopback; GB/s (1e9 B/s), median of %d samples; "
              "causeway = authenticated connection, data frames of up to %s\n",
              runs, "64 MiB");
  std::printf("%8s %10s %10s %9s\n", "size", "tcp", "causeway", "/tcp");
  Report report("dcn");
  for (uint64_t size : sizes) {
    const uint64_t want = Checksum(data.data(), size);
    if (sender.Tcp(data.data(), size) != want || sender.Causeway(data.data(), size) != want) {
      Die(absl::StrCat("the receiver got other bytes than were sent (", size, " bytes)"));
    }
    std::vector<std::function<double()>> cases = {
        [&] { return Bandwidth(size, [&] { sender.Tcp(data.data(), size); }); },
        [&] { return Bandwidth(size, [&] { sender.Causeway(data.data(), size); }); },
    };
    auto samples = Alternate(runs, cases);
    const double t = Median(samples[0]), c = Median(samples[1]);
    std::printf("%5llu MiB %10.2f %10.2f %9.2f\n", static_cast<unsigned long long>(size / kMiB), t, c, c / t);
    report.Add("transfer", absl::StrCat("transfer ", size / kMiB, " MiB"), "GB/s")
        .Value(c)
        .Baseline("TCP", t)
        .Samples(runs)
        .Param("bytes", static_cast<double>(size))
        .Param("frame_bytes", static_cast<double>(kChunkBytes));
    std::fflush(stdout);
  }
  sender.Quit();
  int status = 0;
  waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("the receiver process failed");
  report.WriteOrDie(common.json);
  return 0;
}

}  // namespace
}  // namespace causeway::bench

int main(int argc, char** argv) { return causeway::bench::Main(argc, argv); }
