// The rows of docs/security.md that no narrower test covers, each against
// real island server processes: what one controller's session may see of
// another's, that an island's memory budget holds against a controller, and
// that traffic after the handshake is plain (authentication, not secrecy).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "causeway/base/status.h"
#include "causeway/distributed/controller.h"
#include "causeway/distributed/island_process.h"
#include "causeway/transport/auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway::transport {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kDeadline = absl::Seconds(30);

std::unique_ptr<IslandProcess> StartIsland(const std::string& name, std::vector<std::string> extra = {},
                                           std::vector<std::string> env = {}) {
  std::vector<std::string> args = {::causeway::testing::DeviceFlag(), "--accelerators=1",
                                   ::causeway::testing::ValidationFlag()};
  args.insert(args.end(), extra.begin(), extra.end());
  auto p = IslandProcess::Start(::causeway::testing::CliPath(), name, args, env);
  if (!p.ok()) {
    ADD_FAILURE() << p.status();
    return nullptr;
  }
  return *std::move(p);
}

// Tests that one controller's session cannot reach another's arrays by id:
// not fetch them, release them or run on them; the owner's data is intact.
TEST(SecurityTest, ASessionSeesOnlyItsOwnArrays) {
  auto island = StartIsland("isl");
  ASSERT_NE(island, nullptr);
  ASSERT_OK_AND_ASSIGN(auto owner, Controller::Connect({island->address()}));
  ASSERT_OK_AND_ASSIGN(auto other, Controller::Connect({island->address()}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, owner->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(RemoteArray secret, owner->CreateArray(mesh, {256}, DType::kF32));
  std::vector<float> values(256);
  for (int i = 0; i < 256; ++i) values[i] = static_cast<float>(i) * 0.5f;
  ASSERT_OK(owner->Upload(secret, values.data(), values.size() * 4));

  std::vector<float> stolen(256);
  EXPECT_ERROR(other->Download(secret, stolen.data(), stolen.size() * 4, absl::Now() + kDeadline),
               absl::StatusCode::kNotFound, "no array");
  EXPECT_ERROR(other->Release(secret), absl::StatusCode::kNotFound, "no array");
  EXPECT_ERROR(other->CreateArray(mesh, {4}, DType::kF32), absl::StatusCode::kNotFound, "mesh");

  std::vector<float> back(256);
  ASSERT_OK(owner->Download(secret, back.data(), back.size() * 4, absl::Now() + kDeadline));
  EXPECT_EQ(back, values);
}

// Tests that a controller cannot take more of an island's memory than its
// budget: the request over it is refused with ResourceExhausted before the
// driver is asked, and the island keeps serving within it.
TEST(SecurityTest, AControllerIsHeldToTheIslandsBudget) {
  auto island = StartIsland("isl", {"--memory-budget=64MiB"});
  ASSERT_NE(island, nullptr);
  ASSERT_OK_AND_ASSIGN(auto c, Controller::Connect({island->address()}));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, c->AllocateMesh(0, {1}));
  // A release takes effect on the island's worker, after what was asked for
  // before it; a fetch, which runs there too, then tells when it has.
  ASSERT_OK_AND_ASSIGN(RemoteArray marker, c->CreateArray(mesh, {4}, DType::kF32));
  const float ones[4] = {1, 1, 1, 1};
  ASSERT_OK(c->Upload(marker, ones, sizeof(ones)));
  std::vector<RemoteArray> held;
  absl::Status refused;
  for (int i = 0; i < 8 && refused.ok(); ++i) {  // 8 x 16 MiB against 64 MiB
    absl::StatusOr<RemoteArray> a = c->CreateArray(mesh, {4 << 20}, DType::kF32);
    if (a.ok()) {
      held.push_back(*a);
    } else {
      refused = a.status();
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_LE(held.size(), 4u);
  for (const RemoteArray& a : held) ASSERT_OK(c->Release(a));
  float back_marker[4] = {};
  ASSERT_OK(c->Download(marker, back_marker, sizeof(back_marker), absl::Now() + kDeadline));
  // What was given back can be taken again, and used.
  ASSERT_OK_AND_ASSIGN(RemoteArray x, c->CreateArray(mesh, {4 << 20}, DType::kF32));
  std::vector<float> values(4 << 20, 3.0f), back(4 << 20);
  ASSERT_OK(c->Upload(x, values.data(), values.size() * 4));
  ASSERT_OK(c->Download(x, back.data(), back.size() * 4, absl::Now() + kDeadline));
  EXPECT_EQ(back[12345], 3.0f);
}

// A TCP relay on loopback that passes bytes both ways and keeps what the
// client sent: a stand-in for anyone on the network path.
class Tap {
 public:
  explicit Tap(const std::string& server) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listener_, 1);
    socklen_t len = sizeof(a);
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    const int server_port = std::stoi(server.substr(server.rfind(':') + 1));
    thread_ = std::thread([this, server_port] { Relay(server_port); });
  }
  ~Tap() {
    shutdown(listener_, SHUT_RDWR);
    close(listener_);
    for (int fd : {client_.load(), upstream_.load()}) {
      if (fd >= 0) shutdown(fd, SHUT_RDWR);
    }
    thread_.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }

 private:
  void Relay(int server_port) {
    const int client = accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    const int upstream = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(server_port));
    if (connect(upstream, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(client);
      close(upstream);
      return;
    }
    client_ = client;
    upstream_ = upstream;
    std::thread back([&] { Pump(upstream, client, false); });
    Pump(client, upstream, true);
    shutdown(upstream, SHUT_RDWR);
    back.join();
    close(client);
    close(upstream);
  }
  void Pump(int from, int to, bool record) {
    char buf[65536];
    for (;;) {
      const ssize_t n = read(from, buf, sizeof(buf));
      if (n <= 0) break;
      if (record) {
        absl::MutexLock lock(&mu_);
        seen_.append(buf, static_cast<size_t>(n));
      }
      for (ssize_t off = 0; off < n;) {
        // send, not write: a closed peer must not raise SIGPIPE in the test.
        const ssize_t w = send(to, buf + off, static_cast<size_t>(n - off), MSG_NOSIGNAL);
        if (w <= 0) return;
        off += w;
      }
    }
    shutdown(to, SHUT_WR);
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<int> client_{-1}, upstream_{-1};
  std::thread thread_;
  absl::Mutex mu_;
  std::string seen_ ABSL_GUARDED_BY(mu_);
};

// Tests what the secret does not do: the handshake proves both ends hold it,
// but the traffic after it is plain, so whoever is on the path reads the
// data a controller uploads (docs/security.md: run DCN on a trusted network
// or inside a tunnel).
TEST(SecurityTest, TrafficAfterTheHandshakeIsNotEncrypted) {
  const std::string secret = "a-shared-secret-of-32-characters";
  auto island = StartIsland("isl", {}, {absl::StrCat("CAUSEWAY_SECRET=", secret)});
  ASSERT_NE(island, nullptr);
  Tap tap(island->address());
  ControllerOptions options;
  options.secret = ::causeway::testing::ValueOrThrow(Secret::FromBytes(secret, "test"));
  ASSERT_OK_AND_ASSIGN(auto c, Controller::Connect({tap.address()}, options));
  ASSERT_OK_AND_ASSIGN(RemoteMesh mesh, c->AllocateMesh(0, {1}));
  ASSERT_OK_AND_ASSIGN(RemoteArray x, c->CreateArray(mesh, {16}, DType::kF32));
  const std::string plain = "the controller's private bytes!!!";  // 64 bytes, 16 floats
  std::string payload = plain + std::string(64 - plain.size(), '.');
  ASSERT_OK(c->Upload(x, payload.data(), payload.size()));
  std::vector<char> back(64);
  ASSERT_OK(c->Download(x, back.data(), back.size(), absl::Now() + kDeadline));
  EXPECT_EQ(std::string(back.begin(), back.end()), payload);
  const std::string seen = tap.seen();
  EXPECT_THAT(seen, HasSubstr(plain));        // the data, in the clear
  EXPECT_THAT(seen, ::testing::Not(HasSubstr(secret)));  // but never the secret
}

// Tests that every test docs/security.md names exists in tests/, so that the
// threat model cannot claim a test that is gone or renamed.
TEST(SecurityTest, EveryTestTheThreatModelNamesExists) {
  namespace fs = std::filesystem;
  const fs::path root = ::causeway::testing::SourceDir();
  std::ifstream doc(root / "docs" / "security.md");
  ASSERT_TRUE(doc.good()) << "docs/security.md";
  const std::string text((std::istreambuf_iterator<char>(doc)), std::istreambuf_iterator<char>());
  std::string sources;
  for (const auto& entry : fs::recursive_directory_iterator(root / "tests")) {
    if (entry.path().extension() != ".cc") continue;
    std::ifstream f(entry.path());
    sources.append((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  const std::regex named("`([A-Z][A-Za-z0-9]*Test)\\.([A-Z][A-Za-z0-9]*)`");
  int count = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), named); it != std::sregex_iterator(); ++it) {
    const std::string suite = (*it)[1], test = (*it)[2];
    ++count;
    bool found = false;
    for (const char* macro : {"TEST(", "TEST_F(", "TEST_P("}) {
      found |= sources.find(absl::StrCat(macro, suite, ", ", test, ")")) != std::string::npos;
    }
    EXPECT_TRUE(found) << suite << "." << test << " is named in docs/security.md but not in tests/";
  }
  EXPECT_GE(count, 20);
}

}  // namespace
}  // namespace causeway::transport
