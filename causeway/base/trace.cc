#include "causeway/base/trace.h"

#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "causeway/base/env.h"

namespace causeway {

Tracer::Tracer() { enabled_ = EnvFlag("CAUSEWAY_TRACE"); }

Tracer& Tracer::Get() {
  static Tracer* tracer = new Tracer();
  return *tracer;
}

void Tracer::Add(TraceEvent event) {
  absl::MutexLock lock(&mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(event));
}

void Tracer::Counter(std::string name, int track, double value) {
  if (!enabled()) return;
  TraceEvent e;
  e.kind = TraceEvent::kCounter;
  e.name = std::move(name);
  e.track = track;
  e.begin_ns = e.end_ns = NowNs();
  e.value = value;
  Add(std::move(e));
}

void Tracer::Instant(std::string name, std::string args) {
  if (!enabled()) return;
  TraceEvent e;
  e.kind = TraceEvent::kInstant;
  e.name = std::move(name);
  e.track = ThreadId();
  e.begin_ns = e.end_ns = NowNs();
  e.args = std::move(args);
  Add(std::move(e));
}

std::vector<TraceEvent> Tracer::Take() {
  absl::MutexLock lock(&mu_);
  std::vector<TraceEvent> out;
  out.swap(events_);
  dropped_ = 0;
  return out;
}

uint64_t Tracer::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

void Tracer::NameThread(std::string name) {
  Tracer& t = Get();
  int id = ThreadId();
  absl::MutexLock lock(&t.mu_);
  t.thread_names_[id] = std::move(name);
}

void Tracer::NameAccelerator(int index, std::string name, std::string clock) {
  absl::MutexLock lock(&mu_);
  accelerators_[index] = {std::move(name), std::move(clock)};
}

absl::flat_hash_map<int, std::string> Tracer::ThreadNames() const {
  absl::MutexLock lock(&mu_);
  return thread_names_;
}

absl::flat_hash_map<int, std::pair<std::string, std::string>> Tracer::AcceleratorNames() const {
  absl::MutexLock lock(&mu_);
  return accelerators_;
}

int64_t Tracer::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int Tracer::ThreadId() {
  static std::atomic<int> next{1};
  thread_local int id = next.fetch_add(1);
  return id;
}

HostSpan::~HostSpan() {
  if (name_ == nullptr) return;
  TraceEvent e;
  e.kind = TraceEvent::kHost;
  e.name = name_;
  e.track = Tracer::ThreadId();
  e.begin_ns = begin_;
  e.end_ns = Tracer::NowNs();
  e.flow = flow_;
  e.args = std::move(args_);
  Tracer::Get().Add(std::move(e));
}

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  return out;
}

namespace {

constexpr int kHostPid = 1;
constexpr int kDevicePid = 2;

// Nanoseconds as microseconds with three decimals.
std::string Micros(int64_t ns) {
  if (ns < 0) return absl::StrCat("-", Micros(-ns));
  return absl::StrFormat("%d.%03d", ns / 1000, ns % 1000);
}

// Appends `e` as one or more JSON objects, each followed by ",\n".
void AppendEvent(std::string* out, const TraceEvent& e) {
  auto args = [&e](std::string more) {
    std::string all = e.args;
    if (!more.empty()) all = all.empty() ? std::move(more) : absl::StrCat(all, ",", more);
    return absl::StrCat("{", all, "}");
  };
  switch (e.kind) {
    case TraceEvent::kHost:
      absl::StrAppend(out, "{\"ph\":\"X\",\"cat\":\"host\",\"name\":", JsonQuote(e.name), ",\"pid\":", kHostPid,
                      ",\"tid\":", e.track, ",\"ts\":", Micros(e.begin_ns), ",\"dur\":",
                      Micros(std::max<int64_t>(0, e.end_ns - e.begin_ns)), ",\"args\":", args(""), "},\n");
      if (e.flow != 0) {
        absl::StrAppend(out, "{\"ph\":\"s\",\"cat\":\"dispatch\",\"name\":\"dispatch\",\"pid\":", kHostPid,
                        ",\"tid\":", e.track, ",\"ts\":", Micros(e.begin_ns), ",\"id\":", e.flow, "},\n");
      }
      break;
    case TraceEvent::kDevice:
      absl::StrAppend(out, "{\"ph\":\"X\",\"cat\":\"device\",\"name\":", JsonQuote(e.name), ",\"pid\":", kDevicePid,
                      ",\"tid\":", e.track, ",\"ts\":", Micros(e.begin_ns), ",\"dur\":",
                      Micros(std::max<int64_t>(0, e.end_ns - e.begin_ns)), ",\"args\":",
                      args(absl::StrCat("\"submission\":", e.timeline_value, ",\"list\":", JsonQuote(e.list))),
                      "},\n");
      if (e.flow != 0) {
        absl::StrAppend(out, "{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"dispatch\",\"name\":\"dispatch\",\"pid\":",
                        kDevicePid, ",\"tid\":", e.track, ",\"ts\":", Micros(e.begin_ns), ",\"id\":", e.flow,
                        "},\n");
      }
      break;
    case TraceEvent::kInstant:
      // Gang calls are "gang"; other instants (the watchdog's) are "host".
      absl::StrAppend(out,
                      "{\"ph\":\"i\",\"s\":\"t\",\"cat\":", e.name == "gang call" ? "\"gang\"" : "\"host\"",
                      ",\"name\":", JsonQuote(e.name), ",\"pid\":", kHostPid, ",\"tid\":", e.track,
                      ",\"ts\":", Micros(e.begin_ns), ",\"args\":", args(""), "},\n");
      break;
    case TraceEvent::kCounter:
      absl::StrAppend(out, "{\"ph\":\"C\",\"name\":", JsonQuote(e.name), ",\"pid\":",
                      e.track < 0 ? kHostPid : kDevicePid, ",\"ts\":", Micros(e.begin_ns),
                      ",\"args\":{\"value\":", absl::StrFormat("%.17g", e.value), "}},\n");
      break;
  }
}

// Writes the whole trace through `sink`, a piece at a time.
void WriteTrace(const std::vector<TraceEvent>& events, uint64_t dropped,
                const std::function<void(const std::string&)>& sink) {
  std::string out = absl::StrCat(
      "{\"displayTimeUnit\":\"ns\",\n\"otherData\":{\"format\":\"causeway-trace\",\"version\":1,"
      "\"clock\":\"CLOCK_MONOTONIC\",\"dropped_events\":",
      dropped, "},\n\"traceEvents\":[\n");
  Tracer& tracer = Tracer::Get();
  absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", kHostPid,
                  ",\"args\":{\"name\":\"host\"}},\n");
  absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", kDevicePid,
                  ",\"args\":{\"name\":\"accelerators\"}},\n");
  // Names of threads that recorded something; accelerators all.
  absl::flat_hash_map<int, std::string> threads = tracer.ThreadNames();
  absl::flat_hash_map<int, bool> seen;
  for (const TraceEvent& e : events) {
    if (e.kind == TraceEvent::kHost || e.kind == TraceEvent::kInstant) seen[e.track] = true;
  }
  for (const auto& [tid, unused] : seen) {
    auto it = threads.find(tid);
    std::string name = it != threads.end() ? it->second : absl::StrCat("thread ", tid);
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", kHostPid, ",\"tid\":", tid,
                    ",\"args\":{\"name\":", JsonQuote(name), "}},\n");
  }
  for (const auto& [index, name_clock] : tracer.AcceleratorNames()) {
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", kDevicePid, ",\"tid\":", index,
                    ",\"args\":{\"name\":", JsonQuote(name_clock.first), ",\"clock\":", JsonQuote(name_clock.second),
                    "}},\n");
    absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":", kDevicePid, ",\"tid\":", index,
                    ",\"args\":{\"sort_index\":", index, "}},\n");
  }
  for (const TraceEvent& e : events) {
    AppendEvent(&out, e);
    if (out.size() > (1 << 20)) {
      sink(out);
      out.clear();
    }
  }
  // JSON allows no trailing comma: close with one last metadata event.
  absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":", kDevicePid,
                  ",\"args\":{\"sort_index\":0}}\n]}\n");
  sink(out);
}

// Whether a TraceSession is open in this process.
std::atomic<bool> session_open{false};

}  // namespace

std::string ChromeTraceJson(const std::vector<TraceEvent>& events, uint64_t dropped) {
  std::string all;
  WriteTrace(events, dropped, [&all](const std::string& piece) { all += piece; });
  return all;
}

absl::StatusOr<std::unique_ptr<TraceSession>> TraceSession::Start(std::string path) {
  if (path.empty()) return absl::InvalidArgumentError("trace: no file named");
  // Check now that the file can be written, not after the work is done.
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("trace: cannot write '", path, "': ", std::strerror(errno)));
  }
  std::fclose(f);
  if (session_open.exchange(true)) {
    return absl::FailedPreconditionError("trace: a trace session is already open in this process");
  }
  Tracer& tracer = Tracer::Get();
  (void)tracer.Take();
  tracer.Enable(true);
  return std::unique_ptr<TraceSession>(new TraceSession(std::move(path)));
}

absl::Status TraceSession::Finish() {
  if (finished_) return absl::OkStatus();
  finished_ = true;
  Tracer& tracer = Tracer::Get();
  tracer.Enable(false);
  uint64_t dropped = tracer.dropped();
  std::vector<TraceEvent> events = tracer.Take();
  session_open = false;
  std::FILE* f = std::fopen(path_.c_str(), "w");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat("trace: cannot write '", path_, "': ", std::strerror(errno)));
  }
  bool ok = true;
  WriteTrace(events, dropped, [&](const std::string& piece) {
    ok = ok && std::fwrite(piece.data(), 1, piece.size(), f) == piece.size();
  });
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return absl::UnavailableError(absl::StrCat("trace: writing '", path_, "' failed"));
  return absl::OkStatus();
}

TraceSession::~TraceSession() {
  absl::Status s = Finish();
  if (!s.ok()) std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
}

}  // namespace causeway
