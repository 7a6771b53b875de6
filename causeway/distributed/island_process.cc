#include "causeway/distributed/island_process.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace causeway::transport {

absl::StatusOr<std::unique_ptr<IslandProcess>> IslandProcess::Start(const std::string& binary,
                                                                    const std::string& name,
                                                                    const std::vector<std::string>& args,
                                                                    const std::vector<std::string>& env,
                                                                    absl::Duration timeout) {
  SpawnOptions options;
  options.argv = {binary, "island", "--listen=127.0.0.1:0"};
  if (!name.empty()) options.argv.push_back("--name=" + name);
  options.argv.insert(options.argv.end(), args.begin(), args.end());
  options.env = env;
  options.pipe_stdout = true;
  // An island must not outlive a parent that crashed or was killed (its
  // destructor never ran): it dies with the thread that started it.
  options.death_signal = SIGKILL;
  const std::string who = name.empty() ? "an unnamed island" : absl::StrCat("island '", name, "'");
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(options);
  if (!child.ok()) {
    return absl::Status(child.status().code(),
                        absl::StrCat(who, " did not start: ", child.status().message()));
  }
  std::unique_ptr<IslandProcess> p(new IslandProcess());
  p->process_ = *std::move(child);
  std::string line;
  const absl::Time deadline = absl::Now() + timeout;
  while (line.find('\n') == std::string::npos && absl::Now() < deadline) {
    pollfd pfd{p->process_.stdout_fd(), POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = read(p->process_.stdout_fd(), buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, n);
  }
  // The island's later output goes nowhere: it is not read.
  p->process_.CloseStdout();
  std::vector<std::string> words = absl::StrSplit(line.substr(0, line.find('\n')), ' ');
  if (words.size() != 3 || words[0] != "island") {
    return absl::UnavailableError(
        absl::StrCat(who, " (", binary, ") did not start: it printed '", line, "'"));
  }
  p->name_ = words[1];
  p->address_ = words[2];
  return p;
}

void IslandProcess::Signal(int signal) { process_.Signal(signal); }

bool IslandProcess::Ended(std::string* how) {
  if (process_.running()) {
    absl::StatusOr<int> status = process_.Wait(absl::Now());
    if (!status.ok()) return false;  // still running
    ended_ = DescribeWaitStatus(*status);
  }
  if (how != nullptr) *how = ended_;
  return true;
}

int IslandProcess::Stop(absl::Duration limit) { return process_.Stop(limit); }

}  // namespace causeway::transport
