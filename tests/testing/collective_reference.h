// CPU references for collectives and the checks their tests share: what
// every position of a group holds after each collective, random inputs, and
// element comparisons that say what differs.
#ifndef CAUSEWAY_TESTS_TESTING_COLLECTIVE_REFERENCE_H_
#define CAUSEWAY_TESTS_TESTING_COLLECTIVE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/status.h"
#include "causeway/kernels/reference.h"
#include "causeway/scheduler/array.h"
#include "causeway/scheduler/collectives.h"

namespace causeway::testing {

// f32 sums may add in another order than the reference (the ring does):
// |got - want| <= kSumTolerance * max(1, |want|). Everything else is exact.
inline constexpr double kSumTolerance = 1e-5;

// Element by element over positions: sum (f32 in double, integers in int64)
// or max.
template <typename T>
std::vector<T> Reduce(const std::vector<std::vector<T>>& shards, ReduceOp op) {
  using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
  std::vector<T> out(shards[0].size());
  for (size_t i = 0; i < out.size(); ++i) {
    if (op == ReduceOp::kSum) {
      Acc acc = 0;
      for (const auto& s : shards) acc += static_cast<Acc>(s[i]);
      out[i] = static_cast<T>(acc);
    } else {
      T acc = shards[0][i];
      for (const auto& s : shards) acc = std::max(acc, s[i]);
      out[i] = acc;
    }
  }
  return out;
}

template <typename T>
std::vector<T> Concat(const std::vector<std::vector<T>>& parts) {
  std::vector<T> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// What each position p of a mesh of shards.size() holds after the collective
// on `shards` (row-major; a split along axis 0 is a contiguous block).
template <typename T>
std::vector<std::vector<T>> Reference(CollectiveKind kind, const CollectiveOptions& o,
                                      const std::vector<std::vector<T>>& shards) {
  const size_t n = shards.size();
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return std::vector<std::vector<T>>(n, Reduce(shards, o.op));
    case CollectiveKind::kAllGather:
      return std::vector<std::vector<T>>(n, Concat(shards));
    case CollectiveKind::kReduceScatter: {
      std::vector<T> full = Reduce(shards, o.op);
      const size_t block = full.size() / n;
      std::vector<std::vector<T>> out;
      for (size_t p = 0; p < n; ++p)
        out.emplace_back(full.begin() + p * block, full.begin() + (p + 1) * block);
      return out;
    }
    case CollectiveKind::kBroadcast:
      return std::vector<std::vector<T>>(n, shards[o.root]);
    case CollectiveKind::kPermute: {
      std::vector<std::vector<T>> out(n, std::vector<T>(shards[0].size(), T{0}));
      for (const auto& [source, target] : o.pairs) out[target] = shards[source];
      return out;
    }
  }
  return {};
}

// Distinct values per seed: floats in [-1, 1); i32 in [-2^27, 2^27] (sums of
// 8 fit, and are not exact in f32); f16 as raw bits, never inf or NaN.
template <typename T>
std::vector<T> RandomValues(size_t count, uint32_t seed) {
  if constexpr (std::is_same_v<T, float>) {
    return reference::RandomFloats(count, seed);
  } else {
    std::mt19937 gen(seed);
    std::vector<T> out(count);
    if constexpr (std::is_same_v<T, uint16_t>) {
      std::uniform_int_distribution<int> bits(0, 0xFFFF);
      for (T& v : out) {
        v = static_cast<uint16_t>(bits(gen));
        if ((v & 0x7C00) == 0x7C00) v &= ~0x4000;  // exponent all ones: inf or NaN
      }
    } else {
      std::uniform_int_distribution<T> values(-(T{1} << 27), T{1} << 27);
      for (T& v : out) v = values(gen);
    }
    return out;
  }
}

template <typename T>
std::string Show(T v) {
  if constexpr (std::is_same_v<T, float>) return absl::StrFormat("%.9g", v);
  if constexpr (std::is_same_v<T, uint16_t>) return absl::StrFormat("0x%04x", v);
  return absl::StrCat(v);
}

// "" when `got` equals `want` (within kSumTolerance where `tolerant`, else
// bit for bit); else how many elements differ and the first few.
template <typename T>
std::string Mismatch(const std::vector<T>& got, const std::vector<T>& want, bool tolerant) {
  if (got.size() != want.size()) return absl::StrCat(got.size(), " elements, want ", want.size());
  size_t bad = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i) {
    bool same;
    if (tolerant) {
      const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
      same = std::abs(g - w) <= kSumTolerance * std::max(1.0, std::abs(w));
    } else {
      same = std::memcmp(&got[i], &want[i], sizeof(T)) == 0;
    }
    if (!same && ++bad <= 4)
      absl::StrAppend(&first, " [", i, "] got ", Show(got[i]), " want ", Show(want[i]), ";");
  }
  return bad == 0 ? "" : absl::StrCat(bad, " of ", got.size(), " elements differ:", first);
}

// Device d's shard of `a`, read back from that device after its last write;
// DeadlineExceeded after `timeout` (a hung device).
template <typename T>
absl::StatusOr<std::vector<T>> ShardOf(const Array& a, int d, absl::Duration timeout = absl::Seconds(20)) {
  CAUSEWAY_ASSIGN_OR_RETURN(std::shared_ptr<Buffer> buffer, a.shard(d));
  auto out = std::make_shared<std::vector<T>>(a.shard_bytes() / sizeof(T));
  Future<> done = a.mesh()->device(d)->Download(buffer, out->data(), a.shard_bytes(), 0, {a.ShardReady(d)});
  done.OnReady([out](const absl::Status&) {});  // keeps `out` alive past a timeout
  CAUSEWAY_RETURN_IF_ERROR(done.AwaitStatus(absl::Now() + timeout));
  return *out;
}

}  // namespace causeway::testing

#endif  // CAUSEWAY_TESTS_TESTING_COLLECTIVE_REFERENCE_H_
