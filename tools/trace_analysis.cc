// Reading trace files (docs/trace-format.md, written by causeway/base/trace.cc) and
// the analyses of the causeway tool.
//
// The reader is a SAX handler: it holds one event at a time as JSON, so a
// trace of millions of events is read in the memory of its ParsedTrace. It
// also sees each number's text, so `ts` and `dur` become exact nanoseconds
// (a double holds only 15-16 digits: a CLOCK_MONOTONIC of months in µs with
// three decimals needs more).
#include "tools/trace_analysis.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace causeway::cli {
namespace {

using json = nlohmann::json;
// (accelerator, submission): a submission's name throughout a trace.
using SubmissionKey = std::pair<int, uint64_t>;

// Bounds on indices the reader keeps vectors by, so that a corrupt file
// cannot make it allocate without limit.
constexpr int kMaxAccelerators = 1 << 16;
constexpr int kMaxNamedThreads = 1 << 16;
// Microseconds whose ns still fit an int64 with room for a span's end.
constexpr double kMaxMicros = 4e15;

// A JSON value for messages, shortened.
std::string Show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = absl::StrCat(s.substr(0, 37), "...");
  return s;
}

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::binary:
      return "binary";
    case json::value_t::discarded:
      return "nothing";
    default:
      return "a number";
  }
}

// The text of a JSON number of µs as ns, exactly (rounded half away from zero
// past the third decimal); nullopt when it has an exponent or too many
// digits, for the caller to fall back on the double.
std::optional<int64_t> ExactNs(absl::string_view raw) {
  size_t i = 0;
  bool negative = false;
  if (i < raw.size() && raw[i] == '-') {
    negative = true;
    ++i;
  }
  int64_t v = 0;
  int digits = 0;
  int frac = -1;  // digits seen after the point; -1 before it
  bool round_up = false;
  for (; i < raw.size(); ++i) {
    char c = raw[i];
    if (c == '.') {
      if (frac >= 0) return std::nullopt;
      frac = 0;
      continue;
    }
    if (c < '0' || c > '9') return std::nullopt;
    if (frac >= 3) {
      if (frac == 3) round_up = c >= '5';
      ++frac;
      continue;
    }
    if (++digits > 18) return std::nullopt;
    v = v * 10 + (c - '0');
    if (frac >= 0) ++frac;
  }
  if (digits == 0) return std::nullopt;
  int kept = frac < 0 ? 0 : std::min(frac, 3);
  if (digits + 3 - kept > 18) return std::nullopt;
  for (int k = kept; k < 3; ++k) v *= 10;
  if (round_up) ++v;
  return negative ? -v : v;
}

// One event being read: its fields, with errors that name the event, the
// field and what was wrong.
class Event {
 public:
  Event(size_t index, const json& e, const std::optional<std::string>& raw_ts,
        const std::optional<std::string>& raw_dur)
      : index_(index), e_(e), raw_ts_(raw_ts), raw_dur_(raw_dur) {}

  const json& value() const { return e_; }

  // Sets what the event is called in messages, once its ph and name are known.
  void Describe(const std::string& ph, const std::string& name) {
    what_ = name.empty() ? absl::StrCat(" (ph \"", ph, "\")")
                         : absl::StrCat(" (ph \"", ph, "\", \"", name, "\")");
  }

  absl::Status Error(absl::string_view field, absl::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat("event ", index_, what_, ": \"", field, "\" ", why));
  }

  // obj[key], or null when absent. `obj` is the event or a part of it.
  static const json* Find(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  absl::StatusOr<const json*> Object(const json& obj, const std::string& path, const char* key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Error(Path(path, key), "is missing");
    if (!v->is_object()) return Error(Path(path, key), absl::StrCat("must be an object, got ", TypeName(*v)));
    return v;
  }

  absl::StatusOr<std::string> String(const json& obj, const std::string& path, const char* key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Error(Path(path, key), "is missing");
    if (!v->is_string()) return Error(Path(path, key), absl::StrCat("must be a string, got ", Show(*v)));
    return v->get<std::string>();
  }

  absl::StatusOr<int64_t> Int(const json& obj, const std::string& path, const char* key, int64_t lo,
                              int64_t hi) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Error(Path(path, key), "is missing");
    bool in_range;
    int64_t n = 0;
    if (v->is_number_unsigned()) {
      uint64_t u = v->get<uint64_t>();
      in_range = u <= static_cast<uint64_t>(hi);
      n = static_cast<int64_t>(std::min<uint64_t>(u, static_cast<uint64_t>(hi)));
    } else if (v->is_number_integer()) {
      n = v->get<int64_t>();
      in_range = n >= lo && n <= hi;
    } else {
      return Error(Path(path, key), absl::StrCat("must be an integer, got ", Show(*v)));
    }
    if (!in_range) return Error(Path(path, key), absl::StrCat("must be ", lo, "..", hi, ", got ", Show(*v)));
    return n;
  }

  absl::StatusOr<uint64_t> Uint(const json& obj, const std::string& path, const char* key) const {
    const json* v = Find(obj, key);
    if (v == nullptr) return Error(Path(path, key), "is missing");
    if (v->is_number_unsigned()) return v->get<uint64_t>();
    if (v->is_number_integer()) {
      return Error(Path(path, key), absl::StrCat("must not be negative, got ", Show(*v)));
    }
    return Error(Path(path, key), absl::StrCat("must be a non-negative integer, got ", Show(*v)));
  }

  // `ts` or `dur` (µs) in ns.
  absl::StatusOr<int64_t> Micros(const char* key) const {
    const json* v = Find(e_, key);
    if (v == nullptr) return Error(key, "is missing");
    if (!v->is_number()) return Error(key, absl::StrCat("must be a number (µs), got ", Show(*v)));
    double d = v->get<double>();
    if (!(std::fabs(d) <= kMaxMicros)) return Error(key, absl::StrCat("is out of range: ", Show(*v), " µs"));
    const std::optional<std::string>& raw = absl::string_view(key) == "ts" ? raw_ts_ : raw_dur_;
    if (v->is_number_float() && raw.has_value()) {
      if (std::optional<int64_t> ns = ExactNs(*raw); ns.has_value()) return *ns;
    }
    if (v->is_number_unsigned()) return static_cast<int64_t>(v->get<uint64_t>()) * 1000;
    if (v->is_number_integer()) return v->get<int64_t>() * 1000;
    return static_cast<int64_t>(std::llround(d * 1000));
  }

 private:
  static std::string Path(const std::string& path, const char* key) { return absl::StrCat(path, key); }

  size_t index_;
  const json& e_;
  const std::optional<std::string>& raw_ts_;
  const std::optional<std::string>& raw_dur_;
  std::string what_;
};

// A span's times; `dur` must not be negative.
absl::Status ReadTimes(const Event& ev, ParsedTrace::Span* span) {
  auto ts = ev.Micros("ts");
  if (!ts.ok()) return ts.status();
  auto dur = ev.Micros("dur");
  if (!dur.ok()) return dur.status();
  if (*dur < 0)
    return ev.Error("dur", absl::StrCat("must not be negative, got ", Show(*Event::Find(ev.value(), "dur"))));
  span->begin_ns = *ts;
  span->end_ns = *ts + *dur;
  return absl::OkStatus();
}

absl::Status AddHostSpan(const Event& ev, const std::string& name, ParsedTrace* out) {
  ParsedTrace::Span span;
  span.name = name;
  const json& e = ev.value();
  auto tid = ev.Int(e, "", "tid", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  if (!tid.ok()) return tid.status();
  span.track = static_cast<int>(*tid);
  if (absl::Status s = ReadTimes(ev, &span); !s.ok()) return s;
  if (name == "submit") {
    auto args = ev.Object(e, "", "args");
    if (!args.ok()) return args.status();
    auto acc = ev.Int(**args, "args.", "accelerator", 0, kMaxAccelerators - 1);
    if (!acc.ok()) return acc.status();
    auto value = ev.Uint(**args, "args.", "submission");
    if (!value.ok()) return value.status();
    span.accelerator = static_cast<int>(*acc);
    span.submission = *value;
    if (const json* waits = Event::Find(**args, "waits"); waits != nullptr) {
      if (!waits->is_array())
        return ev.Error("args.waits", absl::StrCat("must be a list, got ", Show(*waits)));
      for (size_t i = 0; i < waits->size(); ++i) {
        const json& w = (*waits)[i];
        std::string path = absl::StrCat("args.waits[", i, "]");
        if (!w.is_object()) return ev.Error(path, absl::StrCat("must be an object, got ", Show(w)));
        path += ".";
        if (const json* host = Event::Find(w, "host"); host != nullptr) {
          if (!host->is_boolean() || !host->get<bool>()) {
            return ev.Error(path + "host", absl::StrCat("must be true, got ", Show(*host)));
          }
          span.waits.push_back({-1, 0});
          continue;
        }
        auto wacc = ev.Int(w, path, "accelerator", 0, kMaxAccelerators - 1);
        if (!wacc.ok()) return wacc.status();
        auto wvalue = ev.Uint(w, path, "submission");
        if (!wvalue.ok()) return wvalue.status();
        span.waits.push_back({static_cast<int>(*wacc), *wvalue});
      }
    }
  }
  out->host.push_back(std::move(span));
  return absl::OkStatus();
}

absl::Status AddDeviceSpan(const Event& ev, const std::string& name, ParsedTrace* out) {
  ParsedTrace::Span span;
  span.name = name;
  const json& e = ev.value();
  auto tid = ev.Int(e, "", "tid", 0, kMaxAccelerators - 1);
  if (!tid.ok()) return tid.status();
  span.track = span.accelerator = static_cast<int>(*tid);
  if (absl::Status s = ReadTimes(ev, &span); !s.ok()) return s;
  auto args = ev.Object(e, "", "args");
  if (!args.ok()) return args.status();
  auto value = ev.Uint(**args, "args.", "submission");
  if (!value.ok()) return value.status();
  span.submission = *value;
  if (Event::Find(**args, "list") != nullptr) {
    auto list = ev.String(**args, "args.", "list");
    if (!list.ok()) return list.status();
    span.list = *std::move(list);
  }
  if (Event::Find(**args, "command") != nullptr) {
    auto command = ev.Int(**args, "args.", "command", 0, std::numeric_limits<int>::max());
    if (!command.ok()) return command.status();
    span.command = static_cast<int>(*command);
  }
  out->device.push_back(std::move(span));
  return absl::OkStatus();
}

absl::Status AddGangCall(const Event& ev, ParsedTrace* out) {
  const json& e = ev.value();
  ParsedTrace::GangCall call;
  auto ts = ev.Micros("ts");
  if (!ts.ok()) return ts.status();
  call.ns = *ts;
  auto args = ev.Object(e, "", "args");
  if (!args.ok()) return args.status();
  const json& a = **args;
  // The island is a name; a number is taken as its text.
  if (const json* island = Event::Find(a, "island"); island != nullptr && island->is_number_integer()) {
    call.island = island->dump();
  } else {
    auto name = ev.String(a, "args.", "island");
    if (!name.ok()) return name.status();
    call.island = *std::move(name);
  }
  if (Event::Find(a, "instance") != nullptr) {
    auto instance = ev.Uint(a, "args.", "instance");
    if (!instance.ok()) return instance.status();
    call.instance = *instance;
  }
  auto sequence = ev.Uint(a, "args.", "sequence");
  if (!sequence.ok()) return sequence.status();
  call.sequence = *sequence;
  if (Event::Find(a, "client") != nullptr) {
    auto client = ev.Uint(a, "args.", "client");
    if (!client.ok()) return client.status();
    call.client = *client;
  }
  auto node = ev.String(a, "args.", "node");
  if (!node.ok()) return node.status();
  call.node = *std::move(node);
  const json* subs = Event::Find(a, "submissions");
  if (subs == nullptr) return ev.Error("args.submissions", "is missing");
  if (!subs->is_array())
    return ev.Error("args.submissions", absl::StrCat("must be a list, got ", Show(*subs)));
  for (size_t i = 0; i < subs->size(); ++i) {
    const json& s = (*subs)[i];
    std::string path = absl::StrCat("args.submissions[", i, "]");
    if (!s.is_object()) return ev.Error(path, absl::StrCat("must be an object, got ", Show(s)));
    path += ".";
    ParsedTrace::GangCall::Submission sub;
    auto acc = ev.Int(s, path, "accelerator", 0, kMaxAccelerators - 1);
    if (!acc.ok()) return acc.status();
    auto value = ev.Uint(s, path, "submission");
    if (!value.ok()) return value.status();
    auto commands = ev.Int(s, path, "commands", 0, std::numeric_limits<int>::max());
    if (!commands.ok()) return commands.status();
    sub.accelerator = static_cast<int>(*acc);
    sub.value = *value;
    sub.commands = static_cast<int>(*commands);
    call.submissions.push_back(sub);
  }
  out->gang_calls.push_back(std::move(call));
  return absl::OkStatus();
}

// thread_name metadata: host threads (pid 1) and accelerators (pid 2).
// Others (process names, sort indices, other processes) are not needed.
absl::Status AddName(const Event& ev, ParsedTrace* out) {
  const json& e = ev.value();
  const json* pid = Event::Find(e, "pid");
  if (pid == nullptr || !pid->is_number_integer()) return absl::OkStatus();
  int64_t p = pid->get<int64_t>();
  if (p != 1 && p != 2) return absl::OkStatus();
  auto tid = ev.Int(e, "", "tid", std::numeric_limits<int>::min(), std::numeric_limits<int>::max());
  if (!tid.ok()) return tid.status();
  auto args = ev.Object(e, "", "args");
  if (!args.ok()) return args.status();
  auto name = ev.String(**args, "args.", "name");
  if (!name.ok()) return name.status();
  std::vector<std::string>& names = p == 1 ? out->thread_names : out->accelerator_names;
  const int64_t limit = p == 1 ? kMaxNamedThreads : kMaxAccelerators;
  if (*tid < 0 || *tid >= limit) return absl::OkStatus();  // a name nothing is kept by
  if (names.size() <= static_cast<size_t>(*tid)) names.resize(*tid + 1);
  names[*tid] = *std::move(name);
  return absl::OkStatus();
}

absl::Status AddEvent(Event& ev, ParsedTrace* out) {
  const json& e = ev.value();
  const json* ph = Event::Find(e, "ph");
  if (ph == nullptr) return ev.Error("ph", "(the event's kind) is missing");
  if (!ph->is_string()) return ev.Error("ph", absl::StrCat("must be a string, got ", Show(*ph)));
  const std::string& kind = ph->get_ref<const std::string&>();
  std::string name, cat;
  if (const json* n = Event::Find(e, "name"); n != nullptr && n->is_string()) name = n->get<std::string>();
  if (const json* c = Event::Find(e, "cat"); c != nullptr && c->is_string()) cat = c->get<std::string>();
  ev.Describe(kind, name);
  if (kind == "X" && (cat == "host" || cat == "device")) {
    auto checked = ev.String(e, "", "name");
    if (!checked.ok()) return checked.status();
    return cat == "host" ? AddHostSpan(ev, name, out) : AddDeviceSpan(ev, name, out);
  }
  if ((kind == "i" || kind == "I") && cat == "gang" && name == "gang call") return AddGangCall(ev, out);
  if (kind == "M" && name == "thread_name") return AddName(ev, out);
  return absl::OkStatus();  // another kind of event: not needed here
}

// Builds one JSON value from SAX calls (iteratively: no recursion on depth).
class ValueBuilder {
 public:
  void Reset() {
    root_ = json();
    stack_.clear();
    key_.clear();
  }
  json& root() { return root_; }
  size_t depth() const { return stack_.size(); }
  const std::string& key() const { return key_; }
  void Key(std::string key) { key_ = std::move(key); }
  void Put(json v) { (void)Place(std::move(v)); }
  void Open(json v) { stack_.push_back(Place(std::move(v))); }
  void Close() { stack_.pop_back(); }

 private:
  json* Place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *stack_.back();
    if (parent.is_array()) {
      parent.push_back(std::move(v));
      return &parent.back();
    }
    json& slot = parent[key_];
    slot = std::move(v);
    return &slot;
  }

  json root_;
  // The open containers, outermost first. Pointers stay valid: a container
  // only grows while it is the innermost open one.
  std::vector<json*> stack_;
  std::string key_;
};

// The SAX handler (nlohmann's interface) that reads a trace.
class TraceReader {
 public:
  using number_integer_t = json::number_integer_t;
  using number_unsigned_t = json::number_unsigned_t;
  using number_float_t = json::number_float_t;
  using string_t = json::string_t;
  using binary_t = json::binary_t;

  explicit TraceReader(ParsedTrace* out) : out_(out) {}

  bool null() { return Scalar(json(nullptr)); }
  bool boolean(bool v) { return Scalar(json(v)); }
  bool number_integer(number_integer_t v) { return Scalar(json(v)); }
  bool number_unsigned(number_unsigned_t v) { return Scalar(json(v)); }
  bool number_float(number_float_t v, const string_t& raw) {
    if (capture_ == Capture::kEvent && builder_.depth() == 1) {
      if (builder_.key() == "ts") raw_ts_ = raw;
      if (builder_.key() == "dur") raw_dur_ = raw;
    }
    return Scalar(json(v));
  }
  bool string(string_t& v) { return Scalar(json(std::move(v))); }
  bool binary(binary_t& v) { return Scalar(json(nullptr)); }
  bool key(string_t& k) {
    if (capture_ == Capture::kEvent || capture_ == Capture::kOtherData) {
      builder_.Key(std::move(k));
    } else if (capture_ == Capture::kNone && depth_ == 1) {
      top_key_ = std::move(k);
    }
    return true;
  }
  bool start_object(std::size_t) { return Open(json::object()); }
  bool start_array(std::size_t) { return Open(json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool parse_error(std::size_t position, const std::string& last_token, const json::exception& ex) {
    std::string message = ex.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..."
    if (size_t close = message.find("] ");
        message.rfind("[json.exception.", 0) == 0 && close != std::string::npos) {
      message = message.substr(close + 2);
    }
    json_error_ = std::move(message);
    json_error_at_ = position;
    return false;
  }

  size_t json_error_at() const { return json_error_at_; }

  // After the parse: the first error, or whether it was a trace.
  // `input_ended`: the parse read all its input (so a JSON error there means
  // the file ends early).
  absl::Status Finish(bool parsed, bool input_ended) {
    if (!error_.ok()) return error_;
    if (!json_error_.empty()) {
      if (input_ended && json_error_at_ <= 1)
        return absl::InvalidArgumentError("not a trace: the file is empty");
      const bool truncated = input_ended || absl::StrContains(json_error_, "end of input");
      return absl::InvalidArgumentError(absl::StrCat(
          "not valid JSON", truncated ? " (the file ends early: truncated?)" : "", ": ", json_error_));
    }
    if (!parsed) return absl::InvalidArgumentError("not valid JSON");
    if (!saw_events_) {
      return absl::InvalidArgumentError(
          "not a trace: no \"traceEvents\" list (a Chrome trace is {\"traceEvents\": [...]} or a list of "
          "events)");
    }
    if (other_data_.is_object()) {
      if (const json* format = Event::Find(other_data_, "format"); format != nullptr) {
        if (!format->is_string() || format->get<std::string>() != "causeway-trace") {
          return absl::InvalidArgumentError(absl::StrCat("not a causeway trace: otherData.format is ",
                                                         Show(*format), ", expected \"causeway-trace\""));
        }
        if (const json* version = Event::Find(other_data_, "version");
            version != nullptr && !(version->is_number_integer() && version->get<int64_t>() == 1)) {
          return absl::InvalidArgumentError(absl::StrCat("causeway trace version ", Show(*version),
                                                         " is not one this tool reads (it reads version 1)"));
        }
      }
      if (const json* dropped = Event::Find(other_data_, "dropped_events");
          dropped != nullptr && dropped->is_number_unsigned()) {
        out_->dropped_events = dropped->get<uint64_t>();
      }
    }
    return absl::OkStatus();
  }

 private:
  enum class Capture {
    kNone,       // at the top level or in the events list
    kSkip,       // inside a value nobody needs
    kEvent,      // inside one event
    kOtherData,  // inside otherData
  };

  // Where a value that starts now belongs, when nothing is being captured.
  enum class Slot { kTop, kEvents, kOtherData, kEventList, kElsewhere };
  Slot Here() const {
    if (depth_ == 0) return Slot::kTop;
    if (events_depth_ >= 0 && depth_ == events_depth_) return Slot::kEvents;
    if (depth_ == 1 && top_is_object_ && top_key_ == "traceEvents") return Slot::kEventList;
    if (depth_ == 1 && top_is_object_ && top_key_ == "otherData") return Slot::kOtherData;
    return Slot::kElsewhere;
  }

  bool Fail(absl::Status s) {
    error_ = std::move(s);
    return false;
  }

  bool Scalar(json v) {
    if (capture_ == Capture::kEvent || capture_ == Capture::kOtherData) {
      builder_.Put(std::move(v));
      return true;
    }
    if (capture_ == Capture::kSkip) return true;
    switch (Here()) {
      case Slot::kTop:
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("not a trace: the file holds ", TypeName(v), ", not {\"traceEvents\": [...]}")));
      case Slot::kEvents:
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("event ", events_, " is ", TypeName(v), " (", Show(v), "), not an object")));
      case Slot::kEventList:
        return Fail(absl::InvalidArgumentError(
            absl::StrCat("not a trace: \"traceEvents\" is ", TypeName(v), ", not a list")));
      default:
        return true;
    }
  }

  bool Open(json container) {
    const bool is_object = container.is_object();
    if (capture_ == Capture::kEvent || capture_ == Capture::kOtherData) {
      builder_.Open(std::move(container));
      ++depth_;
      return true;
    }
    if (capture_ == Capture::kSkip) {
      ++depth_;
      return true;
    }
    switch (Here()) {
      case Slot::kTop:
        top_is_object_ = is_object;
        if (!is_object) {  // the array form: the file is the list of events
          saw_events_ = true;
          events_depth_ = 1;
        }
        break;
      case Slot::kEventList:
        if (is_object) {
          return Fail(absl::InvalidArgumentError("not a trace: \"traceEvents\" is an object, not a list"));
        }
        saw_events_ = true;
        events_depth_ = 2;
        break;
      case Slot::kEvents:
        if (!is_object) {
          return Fail(
              absl::InvalidArgumentError(absl::StrCat("event ", events_, " is a list, not an object")));
        }
        Begin(Capture::kEvent, std::move(container));
        break;
      case Slot::kOtherData:
        Begin(is_object ? Capture::kOtherData : Capture::kSkip, std::move(container));
        break;
      case Slot::kElsewhere:
        Begin(Capture::kSkip, std::move(container));
        break;
    }
    ++depth_;
    return true;
  }

  void Begin(Capture what, json container) {
    capture_ = what;
    capture_depth_ = depth_;
    builder_.Reset();
    raw_ts_.reset();
    raw_dur_.reset();
    if (what != Capture::kSkip) builder_.Open(std::move(container));
  }

  bool Close() {
    --depth_;
    if (capture_ == Capture::kNone) {
      if (events_depth_ >= 0 && depth_ == events_depth_ - 1) events_depth_ = -1;  // the list ended
      return true;
    }
    if (capture_ != Capture::kSkip) builder_.Close();
    if (depth_ != capture_depth_) return true;
    Capture done = capture_;
    capture_ = Capture::kNone;
    if (done == Capture::kOtherData) {
      other_data_ = std::move(builder_.root());
    } else if (done == Capture::kEvent) {
      Event ev(events_, builder_.root(), raw_ts_, raw_dur_);
      if (absl::Status s = AddEvent(ev, out_); !s.ok()) return Fail(std::move(s));
      ++events_;
    }
    return true;
  }

  ParsedTrace* out_;
  absl::Status error_;      // what is wrong with the trace
  std::string json_error_;  // what is wrong with the JSON
  size_t json_error_at_ = 0;
  int depth_ = 0;  // containers open
  bool top_is_object_ = false;
  std::string top_key_;    // the last key of the top-level object
  int events_depth_ = -1;  // the depth of the events list's elements; -1 outside it
  bool saw_events_ = false;
  size_t events_ = 0;  // events read
  Capture capture_ = Capture::kNone;
  int capture_depth_ = 0;  // depth_ where the captured value began
  ValueBuilder builder_;
  std::optional<std::string> raw_ts_, raw_dur_;
  json other_data_;
};

}  // namespace

absl::StatusOr<ParsedTrace> ParseTrace(const std::string& text) {
  ParsedTrace trace;
  TraceReader reader(&trace);
  bool parsed = json::sax_parse(text, &reader);
  // A JSON error at the end: nlohmann counts the end as one more character.
  if (absl::Status s = reader.Finish(parsed, reader.json_error_at() > text.size()); !s.ok()) return s;
  return trace;
}

absl::StatusOr<ParsedTrace> ReadTraceFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot read trace '", path, "': ", std::strerror(errno)));
  }
  ParsedTrace trace;
  TraceReader reader(&trace);
  bool parsed = json::sax_parse(f, &reader);
  const bool read_error = std::ferror(f) != 0;
  const bool ended = std::feof(f) != 0;
  std::fclose(f);
  if (read_error) return absl::DataLossError(absl::StrCat("reading trace '", path, "' failed"));
  if (absl::Status s = reader.Finish(parsed, ended); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("trace '", path, "': ", s.message()));
  }
  return trace;
}

// ---------------------------------------------------------------------------
// The order check.

namespace {

std::string Us(int64_t ns) {
  return absl::StrFormat("%s%d.%03d µs", ns < 0 ? "-" : "", std::abs(ns / 1000), std::abs(ns % 1000));
}

std::string CallName(const ParsedTrace::GangCall& call) {
  return absl::StrCat("call ", call.sequence, " (node '", call.node, "')");
}

}  // namespace

std::vector<OrderViolation> CheckOrder(const ParsedTrace& trace) {
  // Which instance of its island each call belongs to: args.instance where
  // the trace has it; otherwise an island's sequence starting again (a
  // sequence seen twice) means a process made a new island of the same name.
  // The orders of two instances are separate.
  std::vector<std::string> island_of(trace.gang_calls.size());
  bool instances_given = !trace.gang_calls.empty();
  for (const auto& call : trace.gang_calls) instances_given &= call.instance != 0;
  if (instances_given) {
    absl::flat_hash_map<std::string, absl::flat_hash_set<uint64_t>> seen;
    for (const auto& call : trace.gang_calls) seen[call.island].insert(call.instance);
    for (size_t c = 0; c < trace.gang_calls.size(); ++c) {
      const auto& call = trace.gang_calls[c];
      island_of[c] = seen[call.island].size() == 1
                         ? absl::StrCat("'", call.island, "'")
                         : absl::StrCat("'", call.island, "' (instance ", call.instance, ")");
    }
  } else {
    struct Instance {
      int number = 1;
      absl::flat_hash_set<uint64_t> sequences;
    };
    absl::flat_hash_map<std::string, Instance> instances;
    for (size_t c = 0; c < trace.gang_calls.size(); ++c) {
      const auto& call = trace.gang_calls[c];
      Instance& instance = instances[call.island];
      if (!instance.sequences.insert(call.sequence).second) {
        ++instance.number;
        instance.sequences = {call.sequence};
      }
      island_of[c] = instance.number == 1 ? absl::StrCat("'", call.island, "'")
                                          : absl::StrCat("'", call.island, "' #", instance.number);
    }
  }
  // (accelerator, submission) -> the gang call that made it.
  absl::flat_hash_map<SubmissionKey, size_t> call_of;
  for (size_t c = 0; c < trace.gang_calls.size(); ++c) {
    for (const auto& sub : trace.gang_calls[c].submissions)
      call_of.emplace(SubmissionKey{sub.accelerator, sub.value}, c);
  }
  // Each call's time on each accelerator: its first span's start to its
  // last span's end.
  struct Run {
    int64_t begin_ns, end_ns;
  };
  std::map<std::pair<int, size_t>, Run> runs;  // (accelerator, call) -> run
  absl::flat_hash_map<SubmissionKey, bool> has_span;
  for (const auto& span : trace.device) {
    SubmissionKey key{span.track, span.submission};
    auto it = call_of.find(key);
    if (it == call_of.end()) continue;  // an upload, download or copy outside programs
    has_span[key] = true;
    auto [run, inserted] = runs.try_emplace({span.track, it->second}, Run{span.begin_ns, span.end_ns});
    if (!inserted) {
      run->second.begin_ns = std::min(run->second.begin_ns, span.begin_ns);
      run->second.end_ns = std::max(run->second.end_ns, span.end_ns);
    }
  }
  // Per (accelerator, island), in sequence order: each call must start no
  // earlier than every call before it in the order has ended.
  struct Entry {
    uint64_t sequence;
    size_t call;
    Run run;
  };
  std::map<std::pair<int, std::string>, std::vector<Entry>> lanes;
  for (const auto& [key, run] : runs) {
    const auto& call = trace.gang_calls[key.second];
    lanes[{key.first, island_of[key.second]}].push_back({call.sequence, key.second, run});
  }
  std::vector<OrderViolation> out;
  for (auto& [lane, entries] : lanes) {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.sequence != b.sequence ? a.sequence < b.sequence : a.run.begin_ns < b.run.begin_ns;
    });
    // The call of a smaller sequence that ended last, over the groups of
    // sequences done so far.
    const Entry* latest = nullptr;
    for (size_t i = 0; i < entries.size();) {
      size_t j = i;
      while (j < entries.size() && entries[j].sequence == entries[i].sequence) ++j;
      for (size_t k = i; k < j; ++k) {
        const Entry& e = entries[k];
        if (latest == nullptr || e.run.begin_ns >= latest->run.end_ns) continue;
        const auto& call = trace.gang_calls[e.call];
        const auto& before = trace.gang_calls[latest->call];
        std::string when = e.run.end_ns <= latest->run.begin_ns
                               ? absl::StrCat("ran from ", Us(e.run.begin_ns), " to ", Us(e.run.end_ns),
                                              ", entirely before ", CallName(before), ", which ran from ",
                                              Us(latest->run.begin_ns), " to ", Us(latest->run.end_ns))
                               : absl::StrCat("started at ", Us(e.run.begin_ns), ", before ",
                                              CallName(before), " ended at ", Us(latest->run.end_ns));
        out.push_back({call.island, lane.first,
                       absl::StrCat("accelerator ", lane.first, ": island ", lane.second, " ", CallName(call),
                                    " ", when)});
      }
      for (size_t k = i; k < j; ++k) {
        if (latest == nullptr || entries[k].run.end_ns > latest->run.end_ns) latest = &entries[k];
      }
      i = j;
    }
  }
  for (size_t c = 0; c < trace.gang_calls.size(); ++c) {
    const auto& call = trace.gang_calls[c];
    for (const auto& sub : call.submissions) {
      if (sub.commands <= 0 || has_span.contains(SubmissionKey{sub.accelerator, sub.value})) continue;
      out.push_back(
          {call.island, sub.accelerator,
           absl::StrCat("accelerator ", sub.accelerator, ": island ", island_of[c], " ", CallName(call),
                        " submitted ", sub.commands, sub.commands == 1 ? " command" : " commands",
                        " as submission ", sub.value, ", which has no device span")});
    }
  }
  return out;
}

// ---------------------------------------------------------------------------
// The summary.

namespace {

// Nearest rank: the value at rank ceil(p * n / 100) of the sorted values.
int64_t Percentile(const std::vector<int64_t>& sorted, int p) {
  if (sorted.empty()) return 0;
  size_t rank = (static_cast<size_t>(p) * sorted.size() + 99) / 100;
  return sorted[std::max<size_t>(rank, 1) - 1];
}

double Mean(int64_t total, int64_t count) {
  return count == 0 ? 0.0 : static_cast<double>(total) / static_cast<double>(count);
}

// The 1-2-5 bucket edges in ns: 1, 2, 5, 10, ... up to beyond any int64 ns
// a trace holds.
const std::vector<int64_t>& BucketEdges() {
  static const std::vector<int64_t>* edges = [] {
    auto* v = new std::vector<int64_t>;
    for (int64_t decade = 1; decade <= int64_t{1'000'000'000'000'000}; decade *= 10) {
      for (int64_t m : {1, 2, 5}) v->push_back(decade * m);
    }
    return v;
  }();
  return *edges;
}

Distribution Distribute(std::vector<int64_t> values) {
  Distribution d;
  if (values.empty()) return d;
  std::sort(values.begin(), values.end());
  d.count = static_cast<int64_t>(values.size());
  d.min_ns = values.front();
  d.max_ns = values.back();
  d.p50_ns = Percentile(values, 50);
  d.p90_ns = Percentile(values, 90);
  d.p99_ns = Percentile(values, 99);
  int64_t total = 0;
  for (int64_t v : values) total += v;
  d.mean_ns = Mean(total, d.count);
  // Bucket b holds [edges[b-1], edges[b]); bucket 0 is [0, 1); negative
  // values (clocks placed apart) go to one bucket below.
  const std::vector<int64_t>& edges = BucketEdges();
  std::map<int, int64_t> counts;  // bucket -> count; -1: negative
  for (int64_t v : values) {
    int b = v < 0 ? -1 : static_cast<int>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin());
    ++counts[b];
  }
  int first = counts.begin()->first, last = counts.rbegin()->first;
  for (int b = first; b <= last; ++b) {
    Distribution::Bucket bucket;
    if (b < 0) {
      bucket.lower_ns = d.min_ns;
      bucket.upper_ns = 0;
    } else {
      bucket.lower_ns = b == 0 ? 0 : edges[b - 1];
      bucket.upper_ns = b < static_cast<int>(edges.size()) ? edges[b] : std::numeric_limits<int64_t>::max();
    }
    auto it = counts.find(b);
    bucket.count = it == counts.end() ? 0 : it->second;
    d.histogram.push_back(bucket);
  }
  return d;
}

}  // namespace

const char* GapCauseName(TraceSummary::GapCause cause) {
  switch (cause) {
    case TraceSummary::GapCause::kDispatch:
      return "dispatch";
    case TraceSummary::GapCause::kAccelerator:
      return "accelerator";
    case TraceSummary::GapCause::kHostGate:
      return "host gate";
    case TraceSummary::GapCause::kQueue:
      return "queue";
    case TraceSummary::GapCause::kUnknown:
      break;
  }
  return "unknown";
}

TraceSummary Summarize(const ParsedTrace& trace, const SummaryOptions& options) {
  TraceSummary summary;
  summary.dropped_events = trace.dropped_events;
  summary.gang_calls = static_cast<int64_t>(trace.gang_calls.size());

  // Kernels.
  std::map<std::string, std::vector<int64_t>> by_kernel;
  for (const auto& span : trace.device) by_kernel[span.name].push_back(span.end_ns - span.begin_ns);
  for (auto& [name, times] : by_kernel) {
    std::sort(times.begin(), times.end());
    TraceSummary::Kernel k;
    k.name = name;
    k.count = static_cast<int64_t>(times.size());
    for (int64_t t : times) k.total_ns += t;
    k.mean_ns = Mean(k.total_ns, k.count);
    k.p50_ns = Percentile(times, 50);
    k.p99_ns = Percentile(times, 99);
    summary.kernels.push_back(std::move(k));
  }
  std::stable_sort(summary.kernels.begin(), summary.kernels.end(),
                   [](const auto& a, const auto& b) { return a.total_ns > b.total_ns; });

  // What each submission is: its device spans' extent and last kernel, its
  // submit span, its gang call.
  struct SubmissionInfo {
    int64_t first_begin_ns = std::numeric_limits<int64_t>::max();
    int64_t last_end_ns = std::numeric_limits<int64_t>::min();
    std::string last_kernel;
    const ParsedTrace::Span* submit = nullptr;
    const ParsedTrace::GangCall* call = nullptr;
  };
  absl::flat_hash_map<SubmissionKey, SubmissionInfo> subs;
  std::map<int, std::vector<const ParsedTrace::Span*>> by_accelerator;
  if (!trace.device.empty()) {
    summary.wall_begin_ns = std::numeric_limits<int64_t>::max();
    summary.wall_end_ns = std::numeric_limits<int64_t>::min();
  }
  for (const auto& span : trace.device) {
    summary.wall_begin_ns = std::min(summary.wall_begin_ns, span.begin_ns);
    summary.wall_end_ns = std::max(summary.wall_end_ns, span.end_ns);
    SubmissionInfo& info = subs[{span.track, span.submission}];
    info.first_begin_ns = std::min(info.first_begin_ns, span.begin_ns);
    if (span.end_ns >= info.last_end_ns) {
      info.last_end_ns = span.end_ns;
      info.last_kernel = span.name;
    }
    by_accelerator[span.track].push_back(&span);
  }
  absl::flat_hash_map<SubmissionKey, const ParsedTrace::Span*> submits;
  for (const auto& span : trace.host) {
    if (span.name == "submit") submits.emplace(SubmissionKey{span.accelerator, span.submission}, &span);
  }
  for (const auto& call : trace.gang_calls) {
    for (const auto& sub : call.submissions) {
      auto it = subs.find(SubmissionKey{sub.accelerator, sub.value});
      if (it != subs.end() && it->second.call == nullptr) it->second.call = &call;
    }
  }

  // Dispatch latency.
  std::vector<int64_t> latencies;
  for (const auto& [key, submit] : submits) {
    auto it = subs.find(key);
    if (it != subs.end()) latencies.push_back(it->second.first_begin_ns - submit->begin_ns);
  }
  summary.dispatch_latency = Distribute(std::move(latencies));

  // What a gap before submission `next` on accelerator `acc` waited on.
  auto attribute = [&](TraceSummary::Gap& gap, int acc) {
    auto submit_it = submits.find(SubmissionKey{acc, gap.submission});
    if (submit_it == submits.end()) {
      gap.cause = TraceSummary::GapCause::kUnknown;
      gap.waited_on = "unknown";
      return;
    }
    const ParsedTrace::Span& submit = *submit_it->second;
    if (submit.begin_ns > gap.begin_ns) {
      gap.cause = TraceSummary::GapCause::kDispatch;
      gap.waited_on = "dispatch";
      return;
    }
    // The wait that ended last within the gap; failing that (clocks of two
    // accelerators are placed on the host's separately, so a wait may seem
    // to end a little after the gap), the one that ended first after it.
    const SubmissionKey* within = nullptr;
    const SubmissionKey* after = nullptr;
    int64_t within_end = 0, after_end = 0;
    bool host_gate = false;
    for (const auto& wait : submit.waits) {
      if (wait.first < 0) {
        host_gate = true;
        continue;
      }
      if (wait.first == acc) continue;
      auto it = subs.find(wait);
      if (it == subs.end()) continue;
      int64_t end = it->second.last_end_ns;
      if (end <= gap.begin_ns) continue;
      if (end <= gap.end_ns) {
        if (within == nullptr || end > within_end) within = &wait, within_end = end;
      } else if (after == nullptr || end < after_end) {
        after = &wait, after_end = end;
      }
    }
    const SubmissionKey* waited = within != nullptr ? within : after;
    if (waited != nullptr) {
      const SubmissionInfo& info = subs.at(*waited);
      gap.cause = TraceSummary::GapCause::kAccelerator;
      gap.waited_accelerator = waited->first;
      gap.waited_submission = waited->second;
      gap.waited_on =
          absl::StrCat("accelerator ", waited->first, " (",
                       info.call != nullptr ? absl::StrCat(info.call->node, "/") : "", info.last_kernel, ")");
    } else if (host_gate) {
      gap.cause = TraceSummary::GapCause::kHostGate;
      gap.waited_on = "host gate (a receive, relay or host future)";
    } else {
      gap.cause = TraceSummary::GapCause::kQueue;
      gap.waited_on = "queue (submitted, nothing to wait for)";
    }
  };

  // Accelerators: busy time, gaps.
  std::map<int, TraceSummary::Accelerator> accelerators;
  for (size_t i = 0; i < trace.accelerator_names.size(); ++i) {
    if (trace.accelerator_names[i].empty()) continue;
    accelerators[static_cast<int>(i)].name = trace.accelerator_names[i];
  }
  const int64_t wall = summary.wall_ns();
  for (auto& [acc, spans] : by_accelerator) {
    std::sort(spans.begin(), spans.end(), [](const auto* a, const auto* b) {
      return a->begin_ns != b->begin_ns ? a->begin_ns < b->begin_ns : a->end_ns < b->end_ns;
    });
    TraceSummary::Accelerator& a = accelerators[acc];
    a.device_spans = static_cast<int64_t>(spans.size());
    std::vector<TraceSummary::Gap> gaps;
    int64_t end = spans.front()->end_ns;
    uint64_t end_submission = spans.front()->submission;  // the submission of the span that ends at `end`
    a.busy_ns = end - spans.front()->begin_ns;
    for (size_t i = 1; i < spans.size(); ++i) {
      const ParsedTrace::Span& s = *spans[i];
      if (s.begin_ns > end && s.submission != end_submission) {
        TraceSummary::Gap gap;
        gap.begin_ns = end;
        gap.end_ns = s.begin_ns;
        gap.submission = s.submission;
        attribute(gap, acc);
        gaps.push_back(std::move(gap));
      }
      if (s.end_ns > end) {
        a.busy_ns += s.end_ns - std::max(s.begin_ns, end);
        end = s.end_ns;
        end_submission = s.submission;
      }
    }
    a.utilization = wall > 0 ? static_cast<double>(a.busy_ns) / static_cast<double>(wall) : 0.0;
    a.gap_count = static_cast<int64_t>(gaps.size());
    std::map<std::string, TraceSummary::CauseTotal> causes;
    for (const auto& gap : gaps) {
      a.gap_total_ns += gap.end_ns - gap.begin_ns;
      TraceSummary::CauseTotal& c = causes[gap.waited_on];
      c.waited_on = gap.waited_on;
      c.cause = gap.cause;
      ++c.count;
      c.total_ns += gap.end_ns - gap.begin_ns;
    }
    for (auto& [unused, c] : causes) a.gaps_by_cause.push_back(std::move(c));
    std::stable_sort(a.gaps_by_cause.begin(), a.gaps_by_cause.end(),
                     [](const auto& x, const auto& y) { return x.total_ns > y.total_ns; });
    std::stable_sort(gaps.begin(), gaps.end(), [](const auto& x, const auto& y) {
      return x.end_ns - x.begin_ns > y.end_ns - y.begin_ns;
    });
    if (gaps.size() > static_cast<size_t>(std::max(0, options.top_gaps)))
      gaps.resize(std::max(0, options.top_gaps));
    a.largest_gaps = std::move(gaps);
  }
  for (auto& [index, a] : accelerators) {
    a.index = index;
    summary.accelerators.push_back(std::move(a));
  }

  // Host spans.
  std::map<std::string, TraceSummary::HostSpanTotal> host;
  for (const auto& span : trace.host) {
    TraceSummary::HostSpanTotal& h = host[span.name];
    h.name = span.name;
    ++h.count;
    h.total_ns += span.end_ns - span.begin_ns;
  }
  for (auto& [unused, h] : host) summary.host_spans.push_back(std::move(h));
  std::stable_sort(summary.host_spans.begin(), summary.host_spans.end(),
                   [](const auto& a, const auto& b) { return a.total_ns > b.total_ns; });
  return summary;
}

namespace {

// A duration for people: 850 ns, 12.3 µs, 4.567 ms, 1.234 s.
std::string Duration(double ns) {
  double a = std::fabs(ns);
  if (a < 1e3) return absl::StrFormat("%.0f ns", ns);
  if (a < 1e6) return absl::StrFormat("%.1f µs", ns / 1e3);
  if (a < 1e9) return absl::StrFormat("%.3f ms", ns / 1e6);
  return absl::StrFormat("%.3f s", ns / 1e9);
}

// Display width of UTF-8 text (µ is two bytes, one column).
size_t Width(const std::string& s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

// Rows of cells as aligned columns; `right[c]` right-aligns column c.
std::string Table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                  const std::string& indent) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size());
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], Width(row[c]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t c = 0; c < row.size(); ++c) {
      std::string pad(widths[c] - Width(row[c]), ' ');
      bool r = c < right.size() && right[c];
      if (c > 0) line += "  ";
      line += r ? pad + row[c] : (c + 1 == row.size() ? row[c] : row[c] + pad);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string BucketEdge(int64_t ns) {
  return ns == std::numeric_limits<int64_t>::max() ? "inf" : Duration(static_cast<double>(ns));
}

}  // namespace

std::string SummaryText(const TraceSummary& s) {
  std::string out;
  absl::StrAppend(&out, "wall ", Duration(static_cast<double>(s.wall_ns())), " (first to last device span), ",
                  s.accelerators.size(), " accelerators, ", s.gang_calls, " gang calls");
  if (s.dropped_events > 0)
    absl::StrAppend(&out, ", ", s.dropped_events, " events dropped (the trace is partial)");
  out += "\n";

  out += "\nkernels (device time)\n";
  if (s.kernels.empty()) {
    out += "  no device spans\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"kernel", "count", "total", "mean", "p50", "p99"}};
    for (const auto& k : s.kernels) {
      rows.push_back({k.name, absl::StrCat(k.count), Duration(static_cast<double>(k.total_ns)),
                      Duration(k.mean_ns), Duration(static_cast<double>(k.p50_ns)),
                      Duration(static_cast<double>(k.p99_ns))});
    }
    out += Table(rows, {false, true, true, true, true, true}, "  ");
  }

  out += "\naccelerators (utilization: busy over the wall time)\n";
  if (s.accelerators.empty()) {
    out += "  none\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"#", "busy", "util", "gaps", "idle in gaps", "name"}};
    for (const auto& a : s.accelerators) {
      rows.push_back({absl::StrCat(a.index), Duration(static_cast<double>(a.busy_ns)),
                      absl::StrFormat("%.1f%%", 100 * a.utilization), absl::StrCat(a.gap_count),
                      Duration(static_cast<double>(a.gap_total_ns)), a.name});
    }
    out += Table(rows, {true, true, true, true, true, false}, "  ");
    for (const auto& a : s.accelerators) {
      if (a.gap_count == 0) continue;
      absl::StrAppend(&out, "\n  accelerator ", a.index, ": idle gaps by what they waited on\n");
      std::vector<std::vector<std::string>> causes;
      for (const auto& c : a.gaps_by_cause) {
        causes.push_back({c.waited_on, absl::StrCat(c.count), Duration(static_cast<double>(c.total_ns))});
      }
      out += Table(causes, {false, true, true}, "    ");
      absl::StrAppend(&out, "  accelerator ", a.index, ": largest gaps (times from the start of the wall)\n");
      std::vector<std::vector<std::string>> gaps;
      for (const auto& g : a.largest_gaps) {
        gaps.push_back({Duration(static_cast<double>(g.end_ns - g.begin_ns)),
                        absl::StrCat("at ", Duration(static_cast<double>(g.begin_ns - s.wall_begin_ns))),
                        absl::StrCat("before submission ", g.submission), g.waited_on});
      }
      out += Table(gaps, {true, false, false, false}, "    ");
    }
  }

  const Distribution& d = s.dispatch_latency;
  absl::StrAppend(&out, "\nhost dispatch latency (submit start to first device span start), ", d.count,
                  " submissions\n");
  if (d.count > 0) {
    out += Table({{"min", "p50", "p90", "p99", "max", "mean"},
                  {Duration(static_cast<double>(d.min_ns)), Duration(static_cast<double>(d.p50_ns)),
                   Duration(static_cast<double>(d.p90_ns)), Duration(static_cast<double>(d.p99_ns)),
                   Duration(static_cast<double>(d.max_ns)), Duration(d.mean_ns)}},
                 {true, true, true, true, true, true}, "  ");
    out += "\n";
    int64_t most = 0;
    for (const auto& b : d.histogram) most = std::max(most, b.count);
    std::vector<std::vector<std::string>> rows;
    for (const auto& b : d.histogram) {
      int bar = most == 0 ? 0 : static_cast<int>((b.count * 40 + most - 1) / most);
      rows.push_back({BucketEdge(b.lower_ns), "to", BucketEdge(b.upper_ns), std::string(bar, '#'),
                      absl::StrCat(b.count)});
    }
    out += Table(rows, {true, false, true, false, true}, "  ");
  }

  out += "\nhost spans\n";
  if (s.host_spans.empty()) {
    out += "  none\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"name", "count", "total"}};
    for (const auto& h : s.host_spans) {
      rows.push_back({h.name, absl::StrCat(h.count), Duration(static_cast<double>(h.total_ns))});
    }
    out += Table(rows, {false, true, true}, "  ");
  }
  return out;
}

std::string SummaryJson(const TraceSummary& s) {
  using ojson = nlohmann::ordered_json;
  ojson j;
  j["wall_begin_ns"] = s.wall_begin_ns;
  j["wall_end_ns"] = s.wall_end_ns;
  j["wall_ns"] = s.wall_ns();
  j["dropped_events"] = s.dropped_events;
  j["gang_calls"] = s.gang_calls;
  ojson kernels = ojson::array();
  for (const auto& k : s.kernels) {
    kernels.push_back({{"name", k.name},
                       {"count", k.count},
                       {"total_ns", k.total_ns},
                       {"mean_ns", k.mean_ns},
                       {"p50_ns", k.p50_ns},
                       {"p99_ns", k.p99_ns}});
  }
  j["kernels"] = std::move(kernels);
  ojson accelerators = ojson::array();
  for (const auto& a : s.accelerators) {
    ojson gaps = ojson::array();
    for (const auto& g : a.largest_gaps) {
      ojson gap = {{"begin_ns", g.begin_ns},
                   {"end_ns", g.end_ns},
                   {"duration_ns", g.end_ns - g.begin_ns},
                   {"submission", g.submission},
                   {"cause", GapCauseName(g.cause)},
                   {"waited_on", g.waited_on}};
      if (g.cause == TraceSummary::GapCause::kAccelerator) {
        gap["waited_accelerator"] = g.waited_accelerator;
        gap["waited_submission"] = g.waited_submission;
      }
      gaps.push_back(std::move(gap));
    }
    ojson causes = ojson::array();
    for (const auto& c : a.gaps_by_cause) {
      causes.push_back({{"waited_on", c.waited_on},
                        {"cause", GapCauseName(c.cause)},
                        {"count", c.count},
                        {"total_ns", c.total_ns}});
    }
    accelerators.push_back({{"accelerator", a.index},
                            {"name", a.name},
                            {"device_spans", a.device_spans},
                            {"busy_ns", a.busy_ns},
                            {"utilization", a.utilization},
                            {"gap_count", a.gap_count},
                            {"gap_total_ns", a.gap_total_ns},
                            {"gaps_by_cause", std::move(causes)},
                            {"largest_gaps", std::move(gaps)}});
  }
  j["accelerators"] = std::move(accelerators);
  const Distribution& d = s.dispatch_latency;
  ojson histogram = ojson::array();
  for (const auto& b : d.histogram) {
    histogram.push_back({{"lower_ns", b.lower_ns}, {"upper_ns", b.upper_ns}, {"count", b.count}});
  }
  j["dispatch_latency"] = {{"count", d.count},     {"min_ns", d.min_ns},
                           {"p50_ns", d.p50_ns},   {"p90_ns", d.p90_ns},
                           {"p99_ns", d.p99_ns},   {"max_ns", d.max_ns},
                           {"mean_ns", d.mean_ns}, {"histogram", std::move(histogram)}};
  ojson host = ojson::array();
  for (const auto& h : s.host_spans)
    host.push_back({{"name", h.name}, {"count", h.count}, {"total_ns", h.total_ns}});
  j["host_spans"] = std::move(host);
  return j.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
}

}  // namespace causeway::cli
