// An island server: one island (its accelerators, gang scheduler and
// executors) behind a socket, serving controllers and exchanging values with
// other island servers directly (never through the controller).
//
// Every accepted connection runs the handshake (a secret is required unless
// the server listens on loopback) and becomes a session. A controller's
// session is a client of the island: what it allocates is its own and is
// released when the connection ends. Requests are island.proto messages.
//
// Example:
//   IslandServerOptions options;
//   options.name = "island-0";
//   options.listen = "127.0.0.1:7400";
//   CAUSEWAY_ASSIGN_OR_RETURN(auto server, IslandServer::Create(runtime.get(), options));
//   server->Wait();   // serves until Shutdown() or destruction
#ifndef CAUSEWAY_DISTRIBUTED_ISLAND_SERVER_H_
#define CAUSEWAY_DISTRIBUTED_ISLAND_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "causeway/runtime/host_budget.h"
#include "causeway/runtime/runtime.h"
#include "causeway/scheduler/island.h"
#include "causeway/transport/auth.h"
#include "causeway/transport/connection.h"
#include "causeway/transport/handshake.h"
#include "causeway/transport/launch.h"
#include "causeway/transport/socket.h"

namespace causeway::transport {

// Data streams of the island service (island.proto).
inline constexpr uint64_t kUploadStream = 1;
inline constexpr uint64_t kFetchStream = 2;
inline constexpr uint64_t kFirstChannelStream = 16;
// Array ids a controller picks itself (Execute's outputs) start here; an
// island hands out ids below.
inline constexpr uint64_t kControllerIds = uint64_t{1} << 62;

struct IslandServerOptions {
  // This island's name: told to peers in the handshake, and used in every
  // message about it. Peers of one program must have distinct names. Empty:
  // the address peers reach it at (advertised_address(), "host:port"), so
  // that islands started without names have distinct ones.
  std::string name;
  // host:port; port 0 lets the kernel pick (address() tells).
  std::string listen = "127.0.0.1:0";
  // Required unless `listen` is a loopback address.
  std::optional<Secret> secret;
  ConnectionOptions connection;
  IslandOptions island;
  // Answers launch rendezvous requests (process 0 of a launch); may be null.
  IslandRegistry* registry = nullptr;
  // Admission: connections still in their handshake (not yet authenticated)
  // at once, overall and from one source address. A connection past either
  // cap is closed as soon as it is accepted; authenticated sessions are not
  // counted. Handshakes hold no thread: the accept loop serves them all, each
  // for at most the handshake deadline.
  int max_unauthenticated = 64;
  int max_unauthenticated_per_address = 16;
  // How long a connection may take over its handshake.
  absl::Duration handshake_timeout = kDefaultHandshakeTimeout;
  // Host memory each session (a controller's or a peer island's) may make
  // the island hold for it: its uploads still coming in, and the values it
  // sends before their receives. Past it the upload is refused (the
  // connection closes, naming the budget) or the value's run fails with
  // ResourceExhausted; all of it is given back when the bytes are placed or
  // the session ends.
  uint64_t session_host_budget = uint64_t{1} << 30;
};

class IslandServer {
 public:
  // Makes the island over `runtime` (which must outlive the server) and
  // starts listening. Errors: CheckListenPolicy, Socket::Listen, Island.
  static absl::StatusOr<std::unique_ptr<IslandServer>> Create(Runtime* runtime, IslandServerOptions options);
  // Shutdown, then joins every thread and closes every descriptor.
  ~IslandServer();

  // Where the server listens.
  const SocketAddress& address() const { return address_; }
  // host:port where peers reach it (on a wildcard address, this host's name).
  const std::string& advertised_address() const { return advertised_; }
  const std::string& name() const { return options_.name; }
  // Stops accepting and closes every session (their runs fail).
  void Shutdown();
  // Blocks until Shutdown.
  void Wait();
  // Live sessions (controllers and peer islands), from the end of their
  // handshake until everything they held is back.
  size_t sessions() const;
  // Connections accepted and still in their handshake.
  size_t handshakes() const { return handshakes_.load(); }
  // Host memory the island holds for its sessions, all together: what
  // their host budgets have charged and not yet had back.
  uint64_t host_memory_in_use() const { return host_memory_->in_use(); }

  // Internal: the receiving end of a channel, by id (null if unknown).
  class Receiver;
  class PeerLink;
  class Session;

 private:
  IslandServer(Runtime* runtime, IslandServerOptions options);
  // Accepts connections and serves every handshake in progress, on one
  // thread; starts a session for each peer welcomed.
  void AcceptLoop();
  class Handshakes;
  // Accepts what is queued on the listener (at most a few dozen at a time),
  // closing at once a connection past the handshake caps.
  void AcceptQueued(Handshakes& handshakes);
  // A handshake that ended: a session for the welcomed peer, or a note.
  void HandshakeEnded(ServerHandshakeState& handshake);
  // Notes a refused or failed connection on stderr (rate-limited); the
  // accept loop's thread only.
  void Refused(const std::string& why);
  void ReapLoop();
  std::shared_ptr<Receiver> FindReceiver(uint64_t id);
  // A program's receiving channels, all or none: AlreadyExists if an id is
  // taken. Removed when the controller that loaded them goes.
  absl::Status AddReceivers(const std::vector<std::shared_ptr<Receiver>>& receivers);
  void RemoveReceivers(const std::vector<std::shared_ptr<Receiver>>& receivers);
  // The connection to the island at `address` for sending channel data,
  // made on first use.
  absl::StatusOr<std::shared_ptr<PeerLink>> Peer(const std::string& address);
  // A peer says `channel`'s values come over the link that is `session`
  // (a ChannelOpen), so its receives fail when that link ends.
  void OpenChannel(uint64_t channel, uint64_t session) ABSL_LOCKS_EXCLUDED(mu_);
  // Session `session` (from the island `peer_name`) ended: every channel
  // its peer opened on it is failed for good with `why`, and no other. A
  // channel a later program opened on another link (the peer, alive, made
  // a new one) goes on.
  void LinkLost(uint64_t session, const std::string& peer_name, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Moves links to lost peers out of peers_ and destroys the retired ones
  // nothing holds any more.
  void RetireLinks() ABSL_LOCKS_EXCLUDED(mu_);

  Runtime* runtime_;
  IslandServerOptions options_;
  // The parent of every session's host budget: their sum, with no limit of
  // its own.
  const std::shared_ptr<HostBudget> host_memory_;
  std::unique_ptr<Island> island_;
  Socket listener_;
  SocketAddress address_;
  std::string advertised_;
  std::thread acceptor_;
  std::thread reaper_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> handshakes_{0};
  // The accept loop's own (Refused).
  absl::Time last_refusal_note_ = absl::InfinitePast();
  int unsaid_refusals_ = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Receiver>> receivers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<PeerLink>> peers_ ABSL_GUARDED_BY(mu_);
  // Each channel's link (the serial of the session that carries its
  // values), as the sending island announced it; the last word wins.
  static constexpr size_t kMaxChannelLinks = size_t{1} << 16;
  absl::flat_hash_map<uint64_t, uint64_t> channel_links_ ABSL_GUARDED_BY(mu_);
  // Links whose peer is gone, out of peers_ (a peer started again comes at
  // another address): programs' senders may still hold them, so the reaper
  // destroys each once nothing else does, never its own sender thread.
  std::vector<std::shared_ptr<PeerLink>> retired_links_ ABSL_GUARDED_BY(mu_);
  friend class Session;
};

}  // namespace causeway::transport

#endif  // CAUSEWAY_DISTRIBUTED_ISLAND_SERVER_H_
