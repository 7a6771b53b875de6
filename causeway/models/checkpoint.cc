#include "causeway/models/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "causeway/base/checked_size.h"
#include "causeway/base/fault_injection.h"
#include "causeway/base/status.h"

namespace causeway::models {
namespace {

constexpr char kFileMagic[] = "causeway-checkpoint 1";
constexpr char kManifestMagic[] = "causeway-checkpoint-manifest 1";
constexpr char kManifest[] = "MANIFEST";
// "crc32c 0123abcd\n"
constexpr size_t kTrailerBytes = 16;
constexpr size_t kChunk = size_t{1} << 20;

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

absl::Status ErrnoError(const std::string& what, const std::string& path, int err) {
  const std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

std::string FloatText(float f) { return absl::StrFormat("%a", f); }

// The header's lines (without the magic line and "end").
std::string HeaderLines(const CheckpointState& s, uint64_t payload) {
  const TransformerConfig& c = s.config;
  std::string layout = s.layout;
  for (char& ch : layout) {
    if (ch == '\n' || ch == '\r') ch = ' ';
  }
  return absl::StrCat("step ", s.step, "\nmodel vocab ", c.vocab, " d_model ", c.d_model, " heads ", c.heads,
                      " d_ff ", c.d_ff, " layers ", c.layers, " seq_len ", c.seq_len, " ln_eps ",
                      FloatText(c.ln_eps), "\nparameters ", c.ParameterCount(), "\nvocabulary ",
                      absl::BytesToHexString(s.vocabulary), "\nadam lr ", FloatText(s.adam.lr), " beta1 ",
                      FloatText(s.adam.beta1), " beta2 ", FloatText(s.adam.beta2), " eps ",
                      FloatText(s.adam.eps), " weight_decay ", FloatText(s.adam.weight_decay), "\nseed ",
                      s.seed, "\ndata ", s.data_state, "\nbatch ", s.batch, "\nlayout ", layout, "\ntensors ",
                      s.weights.size(), "\npayload ", payload, "\n");
}

// Key -> rest of line, from "key rest" lines up to "end" (or the end).
// `consumed` gets the bytes up to and including "end\n".
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseLines(absl::string_view text,
                                                                         const std::string& path,
                                                                         absl::string_view magic,
                                                                         size_t* consumed) {
  absl::flat_hash_map<std::string, std::string> fields;
  size_t at = 0;
  bool first = true;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    if (nl == absl::string_view::npos) break;
    const absl::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    if (first) {
      if (line != magic) {
        return absl::DataLossError(
            absl::StrCat(path, ": not a Causeway checkpoint (expected '", magic, "' on the first line)"));
      }
      first = false;
      continue;
    }
    if (line == "end") {
      if (consumed != nullptr) *consumed = at;
      return fields;
    }
    const size_t space = line.find(' ');
    const std::string key(line.substr(0, space));
    const std::string value(space == absl::string_view::npos ? "" : line.substr(space + 1));
    if (!fields.emplace(key, value).second) {
      return absl::DataLossError(absl::StrCat(path, ": '", key, "' appears twice"));
    }
  }
  if (first) return absl::DataLossError(absl::StrCat(path, ": empty or not a Causeway checkpoint"));
  if (consumed != nullptr) return absl::DataLossError(absl::StrCat(path, ": the header has no 'end' line"));
  return fields;
}

absl::StatusOr<std::string> Field(const absl::flat_hash_map<std::string, std::string>& fields,
                                  const std::string& key, const std::string& path) {
  auto it = fields.find(key);
  if (it == fields.end()) return absl::DataLossError(absl::StrCat(path, ": no '", key, "' line"));
  return it->second;
}

absl::StatusOr<uint64_t> UintField(const absl::flat_hash_map<std::string, std::string>& fields,
                                   const std::string& key, const std::string& path, uint64_t max) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::string text, Field(fields, key, path));
  uint64_t v = 0;
  if (!absl::SimpleAtoi(text, &v) || v > max) {
    return absl::DataLossError(
        absl::StrCat(path, ": '", key, "' must be a number up to ", max, ", got '", text, "'"));
  }
  return v;
}

// "k1 v1 k2 v2 ..." of `line` into `out`, each key required.
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> Pairs(const std::string& line,
                                                                    const std::string& key,
                                                                    const std::string& path) {
  std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
  if (words.size() % 2 != 0) return absl::DataLossError(absl::StrCat(path, ": malformed '", key, "' line"));
  absl::flat_hash_map<std::string, std::string> out;
  for (size_t i = 0; i < words.size(); i += 2) out[words[i]] = words[i + 1];
  return out;
}

absl::StatusOr<uint32_t> PairUint(const absl::flat_hash_map<std::string, std::string>& pairs,
                                  const std::string& key, const std::string& line, const std::string& path,
                                  uint32_t max) {
  auto it = pairs.find(key);
  uint32_t v = 0;
  if (it == pairs.end() || !absl::SimpleAtoi(it->second, &v) || v == 0 || v > max) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": '", line, "' needs ", key, " in 1..", max));
  }
  return v;
}

absl::StatusOr<float> PairFloat(const absl::flat_hash_map<std::string, std::string>& pairs,
                                const std::string& key, const std::string& line, const std::string& path) {
  auto it = pairs.find(key);
  if (it != pairs.end()) {
    const char* begin = it->second.c_str();
    char* end = nullptr;
    errno = 0;
    const float f = std::strtof(begin, &end);
    if (end != begin && *end == '\0' && errno == 0) return f;
  }
  return absl::DataLossError(absl::StrCat(path, ": '", line, "' needs a number for ", key));
}

// The state a header describes, tensors empty.
absl::StatusOr<CheckpointState> ParseHeader(const absl::flat_hash_map<std::string, std::string>& f,
                                            const std::string& path, uint64_t* payload) {
  CheckpointState s;
  CAUSEWAY_ASSIGN_OR_RETURN(s.step, UintField(f, "step", path, UINT64_MAX));
  CAUSEWAY_ASSIGN_OR_RETURN(s.seed, UintField(f, "seed", path, UINT64_MAX));
  CAUSEWAY_ASSIGN_OR_RETURN(s.data_state, UintField(f, "data", path, UINT64_MAX));
  CAUSEWAY_ASSIGN_OR_RETURN(uint64_t batch, UintField(f, "batch", path, 65536));
  s.batch = static_cast<uint32_t>(batch);
  CAUSEWAY_ASSIGN_OR_RETURN(s.layout, Field(f, "layout", path));
  CAUSEWAY_ASSIGN_OR_RETURN(std::string model, Field(f, "model", path));
  CAUSEWAY_ASSIGN_OR_RETURN(auto m, Pairs(model, "model", path));
  TransformerConfig& c = s.config;
  // The bounds of `causeway train`'s flags.
  CAUSEWAY_ASSIGN_OR_RETURN(c.vocab, PairUint(m, "vocab", model, path, 65536));
  CAUSEWAY_ASSIGN_OR_RETURN(c.d_model, PairUint(m, "d_model", model, path, 8192));
  CAUSEWAY_ASSIGN_OR_RETURN(c.heads, PairUint(m, "heads", model, path, 1024));
  CAUSEWAY_ASSIGN_OR_RETURN(c.d_ff, PairUint(m, "d_ff", model, path, 65536));
  CAUSEWAY_ASSIGN_OR_RETURN(c.layers, PairUint(m, "layers", model, path, 256));
  CAUSEWAY_ASSIGN_OR_RETURN(c.seq_len, PairUint(m, "seq_len", model, path, 4096));
  CAUSEWAY_ASSIGN_OR_RETURN(c.ln_eps, PairFloat(m, "ln_eps", model, path));
  if (absl::Status valid = c.Validate(); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", valid.message()));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(std::string adam, Field(f, "adam", path));
  CAUSEWAY_ASSIGN_OR_RETURN(auto a, Pairs(adam, "adam", path));
  CAUSEWAY_ASSIGN_OR_RETURN(s.adam.lr, PairFloat(a, "lr", adam, path));
  CAUSEWAY_ASSIGN_OR_RETURN(s.adam.beta1, PairFloat(a, "beta1", adam, path));
  CAUSEWAY_ASSIGN_OR_RETURN(s.adam.beta2, PairFloat(a, "beta2", adam, path));
  CAUSEWAY_ASSIGN_OR_RETURN(s.adam.eps, PairFloat(a, "eps", adam, path));
  CAUSEWAY_ASSIGN_OR_RETURN(s.adam.weight_decay, PairFloat(a, "weight_decay", adam, path));
  CAUSEWAY_ASSIGN_OR_RETURN(std::string hex, Field(f, "vocabulary", path));
  if (hex.size() % 2 != 0 || hex.size() > 2 * 65536 || !std::all_of(hex.begin(), hex.end(), [](char ch) {
        return std::isxdigit(static_cast<unsigned char>(ch));
      })) {
    return absl::DataLossError(absl::StrCat(path, ": the vocabulary is not hex"));
  }
  s.vocabulary = absl::HexStringToBytes(hex);
  if (s.vocabulary.size() > c.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", s.vocabulary.size(), " characters for a vocabulary of ", c.vocab));
  }
  const std::vector<ParameterInfo> params = Parameters(c);
  CAUSEWAY_ASSIGN_OR_RETURN(uint64_t tensors, UintField(f, "tensors", path, UINT64_MAX));
  if (tensors != params.size()) {
    return absl::DataLossError(absl::StrCat(path, ": ", tensors, " tensors; the model has ", params.size()));
  }
  uint64_t elements = 0;
  for (const ParameterInfo& p : params) {
    CAUSEWAY_ASSIGN_OR_RETURN(uint64_t n, CheckedElementCount(p.shape));
    CAUSEWAY_ASSIGN_OR_RETURN(elements, CheckedAdd(elements, n, "a checkpoint's parameters"));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(uint64_t bytes,
                            CheckedMul(elements, 3 * sizeof(float), "a checkpoint's payload"));
  CAUSEWAY_ASSIGN_OR_RETURN(*payload, UintField(f, "payload", path, UINT64_MAX));
  if (*payload != bytes) {
    return absl::DataLossError(absl::StrCat(path, ": a payload of ", *payload,
                                            " bytes; the model's tensors and ", "moments take ", bytes));
  }
  return s;
}

// Reads all of `path` (at most `max` bytes; NotFound naming it if missing).
absl::StatusOr<std::string> ReadWhole(const std::string& path, uint64_t max) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoError("reading", path, errno);
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is not a file"));
  if (static_cast<uint64_t>(st.st_size) > max) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", st.st_size, " bytes, more than the ", max, " expected"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError("reading", path, errno);
  std::string data(static_cast<size_t>(st.st_size), '\0');
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  if (in.gcount() != static_cast<std::streamsize>(data.size())) {
    return absl::DataLossError(
        absl::StrCat(path, ": could read only ", in.gcount(), " of ", data.size(), " bytes"));
  }
  return data;
}

// Writes `data` to `path` through a temporary file, flushed, renamed into
// place; the directory is flushed too. On an error nothing is left behind.
absl::Status WriteAtomically(const std::string& dir, const std::string& name, absl::string_view data) {
  const std::string path = absl::StrCat(dir, "/", name);
  const std::string tmp = absl::StrCat(dir, "/.", name, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("creating", tmp, errno);
  absl::Status status;
  for (size_t at = 0; at < data.size() && status.ok();) {
    const size_t n = std::min(kChunk, data.size() - at);
    if (ShouldInjectFault(FaultPoint::kFileWrite)) {
      status = ErrnoError("writing", tmp, ENOSPC);
      status = InjectedFaultError(status.code(), FaultPoint::kFileWrite, status.message());
      break;
    }
    const ssize_t wrote = ::write(fd, data.data() + at, n);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      status = ErrnoError("writing", tmp, errno);
      break;
    }
    at += static_cast<size_t>(wrote);
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError("flushing", tmp, errno);
  if (::close(fd) != 0 && status.ok()) status = ErrnoError("closing", tmp, errno);
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    status = ErrnoError("renaming into", path, errno);
  if (!status.ok()) {
    ::unlink(tmp.c_str());
    return status;
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

std::string Trailer(uint32_t crc) { return absl::StrFormat("crc32c %08x\n", crc); }

absl::StatusOr<uint32_t> ParseCrc(absl::string_view text, const std::string& path) {
  uint32_t crc = 0;
  if (!absl::StartsWith(text, "crc32c ") || text.size() != kTrailerBytes - 1 ||
      !absl::SimpleHexAtoi(text.substr(7), &crc)) {
    return absl::DataLossError(absl::StrCat(path, ": no checksum at its end (truncated?)"));
  }
  return crc;
}

// The checkpoint file `path`, checked against the manifest's size and
// checksum when given.
absl::StatusOr<CheckpointState> ReadFile(const std::string& path, const uint64_t* want_bytes,
                                         const uint32_t* want_crc) {
  // A file is at most the largest model's payload plus its header; the
  // header is checked before the payload is trusted.
  CAUSEWAY_ASSIGN_OR_RETURN(std::string data, ReadWhole(path, want_bytes ? *want_bytes : UINT64_MAX));
  if (want_bytes != nullptr && data.size() != *want_bytes) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", data.size(), " bytes; its manifest says ", *want_bytes, " (truncated?)"));
  }
  if (data.size() < kTrailerBytes)
    return absl::DataLossError(absl::StrCat(path, ": truncated (", data.size(), " bytes)"));
  const absl::string_view body(data.data(), data.size() - kTrailerBytes);
  CAUSEWAY_ASSIGN_OR_RETURN(uint32_t stored,
                            ParseCrc(absl::string_view(data).substr(body.size(), kTrailerBytes - 1), path));
  const uint32_t crc =
      Crc32c(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
  if (crc != stored || (want_crc != nullptr && *want_crc != stored)) {
    return absl::DataLossError(
        absl::StrFormat("%s: corrupt: its contents have CRC-32C %08x, its end says %08x%s", path, crc, stored,
                        want_crc ? absl::StrFormat(" and its manifest %08x", *want_crc) : ""));
  }
  size_t header = 0;
  CAUSEWAY_ASSIGN_OR_RETURN(auto fields, ParseLines(body, path, kFileMagic, &header));
  uint64_t payload = 0;
  CAUSEWAY_ASSIGN_OR_RETURN(CheckpointState s, ParseHeader(fields, path, &payload));
  if (body.size() - header != payload) {
    return absl::DataLossError(
        absl::StrCat(path, ": ", body.size() - header, " bytes of tensors; its header says ", payload));
  }
  const char* at = body.data() + header;
  for (auto* list : {&s.weights, &s.m, &s.v}) {
    for (const ParameterInfo& p : Parameters(s.config)) {
      std::vector<float> values(NumElements(p.shape));
      std::memcpy(values.data(), at, values.size() * sizeof(float));
      at += values.size() * sizeof(float);
      list->push_back(std::move(values));
    }
  }
  return s;
}

// The file names "step-*.ckpt" in `dir`.
std::vector<std::string> CheckpointFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StartsWith(name, "step-") && absl::EndsWith(name, ".ckpt")) out.push_back(name);
  }
  ::closedir(d);
  return out;
}

// The file the manifest of `dir` names, or "" if it has none.
std::string ManifestFile(const std::string& dir) {
  auto text = ReadWhole(absl::StrCat(dir, "/", kManifest), 1 << 20);
  if (!text.ok()) return "";
  auto fields = ParseLines(*text, dir, kManifestMagic, nullptr);
  if (!fields.ok()) return "";
  auto it = fields->find("file");
  return it == fields->end() ? "" : it->second;
}

}  // namespace

uint32_t Crc32c(absl::Span<const uint8_t> data, uint32_t crc) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  crc = ~crc;
  for (uint8_t b : data) crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

absl::Status CheckpointState::CheckTensors() const {
  const std::vector<ParameterInfo> params = Parameters(config);
  for (const auto& [name, list] : {std::pair{"weights", &weights}, std::pair{"m", &m}, std::pair{"v", &v}}) {
    if (list->size() != params.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: ", list->size(), " ", name, " tensors; the model has ", params.size()));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if ((*list)[i].size() != static_cast<size_t>(NumElements(params[i].shape))) {
        return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", name, " of ", params[i].name,
                                                       " holds ", (*list)[i].size(), " floats, expected ",
                                                       NumElements(params[i].shape)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteCheckpoint(const std::string& dir, const CheckpointState& state) {
  CAUSEWAY_RETURN_IF_ERROR(state.config.Validate());
  CAUSEWAY_RETURN_IF_ERROR(state.CheckTensors());
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoError("creating", dir, errno);
  uint64_t payload = 0;
  for (const auto* list : {&state.weights, &state.m, &state.v}) {
    for (const std::vector<float>& t : *list) payload += t.size() * sizeof(float);
  }
  const std::string lines = HeaderLines(state, payload);
  std::string data = absl::StrCat(kFileMagic, "\n", lines, "end\n");
  const size_t header = data.size();
  data.resize(header + payload);
  char* at = data.data() + header;
  for (const auto* list : {&state.weights, &state.m, &state.v}) {
    for (const std::vector<float>& t : *list) {
      std::memcpy(at, t.data(), t.size() * sizeof(float));
      at += t.size() * sizeof(float);
    }
  }
  const uint32_t crc =
      Crc32c(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(data.data()), data.size()));
  data += Trailer(crc);

  // A new name, never the file the manifest names now (rewriting it in
  // place would leave a manifest that no longer matches).
  const std::string previous = ManifestFile(dir);
  std::string name = absl::StrFormat("step-%08u.ckpt", state.step);
  for (int n = 1; name == previous || ::access(absl::StrCat(dir, "/", name).c_str(), F_OK) == 0; ++n) {
    name = absl::StrFormat("step-%08u.%d.ckpt", state.step, n);
  }
  CAUSEWAY_RETURN_IF_ERROR(WriteAtomically(dir, name, data));
  const std::string manifest = absl::StrCat(kManifestMagic, "\nfile ", name, "\nbytes ", data.size(), "\n",
                                            Trailer(crc), lines, "end\n");
  if (absl::Status s = WriteAtomically(dir, kManifest, manifest); !s.ok()) {
    ::unlink(absl::StrCat(dir, "/", name).c_str());
    return s;
  }
  // Keep the new checkpoint and the one before it.
  for (const std::string& file : CheckpointFiles(dir)) {
    if (file != name && file != previous) ::unlink(absl::StrCat(dir, "/", file).c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointState> ReadCheckpoint(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return ErrnoError("no checkpoint at", path, errno);
  }
  if (!S_ISDIR(st.st_mode)) return ReadFile(path, nullptr, nullptr);
  const std::string manifest_path = absl::StrCat(path, "/", kManifest);
  absl::StatusOr<std::string> text = ReadWhole(manifest_path, 1 << 20);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(absl::StrCat("no checkpoint in ", path, ": ", manifest_path, " is missing"));
    }
    return text.status();
  }
  CAUSEWAY_ASSIGN_OR_RETURN(auto fields, ParseLines(*text, manifest_path, kManifestMagic, nullptr));
  CAUSEWAY_ASSIGN_OR_RETURN(std::string file, Field(fields, "file", manifest_path));
  if (file.empty() || absl::StrContains(file, "/") || file[0] == '.') {
    return absl::DataLossError(absl::StrCat(manifest_path, ": bad file name '", file, "'"));
  }
  CAUSEWAY_ASSIGN_OR_RETURN(uint64_t bytes, UintField(fields, "bytes", manifest_path, UINT64_MAX));
  CAUSEWAY_ASSIGN_OR_RETURN(std::string crc_text, Field(fields, "crc32c", manifest_path));
  CAUSEWAY_ASSIGN_OR_RETURN(uint32_t crc, ParseCrc(absl::StrCat("crc32c ", crc_text), manifest_path));
  const std::string file_path = absl::StrCat(path, "/", file);
  CAUSEWAY_ASSIGN_OR_RETURN(CheckpointState s, ReadFile(file_path, &bytes, &crc));
  CAUSEWAY_ASSIGN_OR_RETURN(uint64_t step, UintField(fields, "step", manifest_path, UINT64_MAX));
  if (step != s.step) {
    return absl::DataLossError(
        absl::StrCat(file_path, ": step ", s.step, "; its manifest ", manifest_path, " says ", step));
  }
  return s;
}

}  // namespace causeway::models
