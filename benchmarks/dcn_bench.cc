// Transfer throughput between two processes over the DCN transport (an
// authenticated connection carrying data frames) against plain TCP on
// loopback, in the same run.
//
//   causeway:  a connection that passed the handshake with a shared secret
//              (HMAC-SHA256 both ways), as the transport makes it (Nagle
//              off, the kernel's socket buffers). For each transfer the
//              sender sends a control frame with the size and the buffer as
//              data frames of up to kChunkBytes (each header and chunk in
//              one gather write, no copy); the receiver checks each frame
//              header, reads the payload straight into its buffer, and
//              answers with a heartbeat frame. Transfers are streamed with
//              kDepth unanswered at most (the sender waits for transfer i's
//              answer only before sending transfer i + kDepth), and also
//              run request/reply (depth 1).
//   tcp:       the baselines of tcp_baseline.h, in a receiver process of
//              their own: streamed with the same depth and sends of the same
//              frame size (the ratio's baseline), the one-way ceiling (no
//              answers), and request/reply (depth 1, compared with
//              causeway's request/reply).
//
// Both senders rotate through the same distinct source buffers (64 MiB in
// all), so no transfer reads a cache-hot source. A sample is one untimed
// transfer, then transfers until at least sample_bytes have moved, from the
// first byte sent to the last answer received, in GB/s (1e9 B/s). The cases
// alternate sample by sample; medians of `--samples` samples are printed with
// causeway's as a fraction of tcp's. Each size is checked once: the
// receivers send back a checksum of what they got, which must match the
// sender's.
//
//   causeway_dcn_bench [--sizes=1,4,16,64,256] [--samples=9] [--quick] [--json=FILE]   (sizes in MiB)
// --quick: 1 sample of at least 32 MiB moved, sizes 1 and 4 MiB (seconds,
// for tests); the common flags: bench_main.h.
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
#include "benchmarks/bench_main.h"
#include "benchmarks/bench_report.h"
#include "benchmarks/bench_util.h"
#include "benchmarks/tcp_baseline.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/connection.h"
#include "causeway/transport/frame.h"
#include "causeway/transport/handshake.h"
#include "causeway/transport/socket.h"

namespace causeway::bench {
namespace {

using transport::FrameType;
using transport::Socket;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kChunkBytes = transport::kDataChunkBytes;  // data frame payload at most, as islands send
constexpr int kDepth = 3;            // transfers unanswered at most when streamed, as island transfers keep
double sample_bytes = 256.0 * kMiB;  // at least this much a sample (--quick: 32 MiB)
constexpr absl::Duration kTimeout = absl::Seconds(60);

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Time Deadline() { return absl::Now() + kTimeout; }

// The receiver process: serves the causeway connection, `count` transfers
// at a time as the sender announces them on the plain control connection,
// until it reads 'q'.
[[noreturn]] void Receive(const transport::SocketAddress& address, const transport::Secret& secret,
                          uint64_t largest) {
  std::vector<uint8_t> buffer(largest, 1);  // touched, as a destination buffer would be
  Socket control = Must(Socket::Connect(address, Deadline()), "receiver: connect (control)");
  Socket dcn = Must(Socket::Connect(address, Deadline()), "receiver: connect (causeway)");
  transport::ClientHandshakeOptions options;
  options.secret = secret;
  options.name = "receiver";
  Must(transport::ClientHandshake(dcn, options), "receiver: handshake");
  for (;;) {
    char which = 0;
    if (!control.ReadExact(&which, 1, absl::InfiniteFuture()).ok() || which == 'q') std::_Exit(0);
    uint64_t count = 0;
    CheckOk(control.ReadExact(&count, 8, Deadline()), "receiver: count");
    for (uint64_t i = 0; i < count; ++i) {
      transport::Frame size_frame = Must(
          transport::ReadFrame(dcn, true, transport::kMaxControlPayload, Deadline()), "receiver: control");
      if (size_frame.type != FrameType::kControl || size_frame.payload.size() != 8)
        Die("receiver: expected the size");
      uint64_t size = 0;
      std::memcpy(&size, size_frame.payload.data(), 8);
      if (size > largest) Die("receiver: size over the largest");
      for (uint64_t done = 0; done < size;) {
        transport::FrameHeader h =
            Must(transport::ReadFrameHeader(dcn, true, size - done, Deadline()), "receiver: data header");
        if (h.type != FrameType::kData) Die("receiver: expected data");
        CheckOk(dcn.ReadExact(buffer.data() + done, h.length, Deadline()), "receiver: data");
        done += h.length;
      }
      const uint64_t sum = PageChecksum(buffer.data(), size);
      absl::Span<const uint8_t> piece(reinterpret_cast<const uint8_t*>(&sum), 8);
      CheckOk(transport::WriteFrame(dcn, FrameType::kHeartbeat, {piece}, Deadline()), "receiver: answer");
    }
  }
}

class Sender {
 public:
  Sender(Socket control, Socket dcn) : control_(std::move(control)), dcn_(std::move(dcn)) {}

  // `transfers` transfers of the next buffers of `sources`, at most `depth`
  // unanswered.
  void Causeway(SourceBuffers& sources, int transfers, int depth) {
    Announce(transfers);
    int answered = 0;
    for (int i = 0; i < transfers; ++i) {
      if (i - answered >= depth) Answer(), ++answered;
      Send(sources.Next());
    }
    for (; answered < transfers; ++answered) Answer();
  }
  // Sends `bytes` once and aborts unless the receiver got exactly them (by
  // checksum).
  void Check(const std::vector<uint8_t>& bytes) {
    Announce(1);
    Send(bytes);
    if (Answer() != PageChecksum(bytes.data(), bytes.size())) {
      Die(absl::StrCat("the receiver got other bytes than were sent (", bytes.size(), " bytes)"));
    }
  }
  // GB/s of Causeway(sources, transfers, depth) after one untimed transfer.
  double CausewayRate(SourceBuffers& sources, int transfers, int depth) {
    Causeway(sources, 1, 1);
    const double t0 = NowSeconds();
    Causeway(sources, transfers, depth);
    return static_cast<double>(sources.size()) * transfers / (NowSeconds() - t0) / 1e9;
  }
  void Quit() {
    const uint8_t quit[1] = {'q'};
    (void)control_.WriteAll({absl::Span<const uint8_t>(quit)}, Deadline());
  }

 private:
  void Announce(int transfers) {
    uint8_t command[9] = {'c'};
    const uint64_t count = static_cast<uint64_t>(transfers);
    std::memcpy(command + 1, &count, 8);
    CheckOk(control_.WriteAll({absl::Span<const uint8_t>(command)}, Deadline()), "causeway: command");
  }
  void Send(const std::vector<uint8_t>& data) {
    const uint64_t n = data.size();
    absl::Span<const uint8_t> size(reinterpret_cast<const uint8_t*>(&n), 8);
    CheckOk(transport::WriteFrame(dcn_, FrameType::kControl, {size}, Deadline()), "causeway: size");
    for (uint64_t done = 0; done < n; done += kChunkBytes) {
      absl::Span<const uint8_t> chunk(data.data() + done, std::min(kChunkBytes, n - done));
      CheckOk(transport::WriteFrame(dcn_, FrameType::kData, {chunk}, Deadline()), "causeway: data");
    }
  }
  uint64_t Answer() {
    transport::Frame answer = Must(transport::ReadFrame(dcn_, true, 64, Deadline()), "causeway: answer");
    if (answer.type != FrameType::kHeartbeat || answer.payload.size() != 8) Die("causeway: bad answer");
    uint64_t sum = 0;
    std::memcpy(&sum, answer.payload.data(), 8);
    return sum;
  }

  Socket control_, dcn_;
};

int Main(int argc, char** argv) {
  const CommonFlags common = StartBenchmark("causeway_dcn_bench", argc, argv);
  const int runs = common.SamplesOr(common.quick ? 1 : 9);
  std::vector<uint64_t> sizes = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB, 256 * kMiB};
  if (common.quick) {
    sample_bytes = 32.0 * kMiB;
    sizes = {1 * kMiB, 4 * kMiB};
  }
  BenchFlags flags;
  flags.Sizes("sizes", &sizes, kMiB, 2048, "message sizes in MiB");
  flags.Parse(argc, argv);
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
  Socket control = Must(listener.Accept(Deadline()), "accept (control)");
  Socket dcn = Must(listener.Accept(Deadline()), "accept (causeway)");
  transport::ServerHandshakeOptions options;
  options.secret = secret;
  options.name = "sender";
  Must(transport::ServerHandshake(dcn, options), "handshake");
  Sender sender(std::move(control), std::move(dcn));
  auto tcp = TcpBaseline::Start(largest);

  std::printf(
      "transfer between two processes over loopback; GB/s (1e9 B/s), median of %d samples;\n"
      "  causeway: authenticated connection, data frames of up to %llu MiB; tcp: plain TCP, Nagle off, sends "
      "of\n"
      "  the same size; streamed: %d transfers unanswered at most; one-way: no answers (the ceiling);\n"
      "  req/reply: each transfer waits for its answer\n",
      runs, static_cast<unsigned long long>(kChunkBytes / kMiB), kDepth);
  std::printf("%9s | %10s %10s %7s %10s | %10s %10s %7s\n", "", "streamed", "", "", "tcp", "req/reply", "",
              "");
  std::printf("%9s | %10s %10s %7s %10s | %10s %10s %7s\n", "size", "tcp", "causeway", "/tcp", "one-way",
              "tcp", "causeway", "/tcp");
  Report report("dcn");
  for (uint64_t size : sizes) {
    SourceBuffers sources(size, SourceBuffers::CountFor(size));
    tcp->Check(sources.Next());
    sender.Check(sources.Next());
    const int transfers = static_cast<int>(std::max<double>(1, sample_bytes / size));
    std::vector<std::function<double()>> cases = {
        [&] { return tcp->Streamed(sources, transfers, kDepth, kChunkBytes); },
        [&] { return sender.CausewayRate(sources, transfers, kDepth); },
        [&] { return tcp->OneWay(sources, transfers, kChunkBytes); },
        [&] { return tcp->RequestReply(sources, transfers, kChunkBytes); },
        [&] { return sender.CausewayRate(sources, transfers, 1); },
    };
    auto samples = Alternate(runs, cases);
    const double t = Median(samples[0]), c = Median(samples[1]), one_way = Median(samples[2]),
                 t1 = Median(samples[3]), c1 = Median(samples[4]);
    std::printf("%5llu MiB | %10.2f %10.2f %7.2f %10.2f | %10.2f %10.2f %7.2f\n",
                static_cast<unsigned long long>(size / kMiB), t, c, c / t, one_way, t1, c1, c1 / t1);
    report.Add("transfer", absl::StrCat("transfer ", size / kMiB, " MiB"), "GB/s")
        .Value(c)
        .Baseline("streamed TCP", t)
        .Samples(runs)
        .Param("bytes", static_cast<double>(size))
        .Param("frame_bytes", static_cast<double>(kChunkBytes))
        .Param("depth", kDepth)
        .Extra("tcp_one_way_gbps", one_way);
    report.Add("request/reply", absl::StrCat("request/reply ", size / kMiB, " MiB"), "GB/s")
        .Value(c1)
        .Baseline("TCP request/reply", t1)
        .Samples(runs)
        .Param("bytes", static_cast<double>(size))
        .Param("frame_bytes", static_cast<double>(kChunkBytes))
        .Param("depth", 1);
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
