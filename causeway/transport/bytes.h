// Little-endian fields of the wire formats (frame headers, handshake
// messages): a writer that appends them to a byte vector and a reader that
// takes them from a span and never reads past its end.
#ifndef CAUSEWAY_TRANSPORT_BYTES_H_
#define CAUSEWAY_TRANSPORT_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace causeway::transport {

// Stores `value` little-endian in the sizeof(T) bytes at `out`.
template <typename T>
void StoreLittleEndian(T value, uint8_t* out) {
  static_assert(std::is_unsigned_v<T>);
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

// The little-endian value of the sizeof(T) bytes at `in`.
template <typename T>
T LoadLittleEndian(const uint8_t* in) {
  static_assert(std::is_unsigned_v<T>);
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(in[i]) << (8 * i);
  return value;
}

// Appends fields to `out`, integers little-endian whatever the host order.
class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}

  template <typename T>
  void PutInt(T value) {
    out_->resize(out_->size() + sizeof(T));
    StoreLittleEndian(value, out_->data() + out_->size() - sizeof(T));
  }
  void PutBytes(absl::Span<const uint8_t> bytes) { out_->insert(out_->end(), bytes.begin(), bytes.end()); }
  void PutBytes(absl::string_view text) { out_->insert(out_->end(), text.begin(), text.end()); }

 private:
  std::vector<uint8_t>* out_;
};

// Takes fields from the front of a span. A read that would pass the end
// returns false and takes nothing; the parsers turn that into an error that
// names the message.
class ByteReader {
 public:
  explicit ByteReader(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}

  template <typename T>
  bool GetInt(T* value) {
    if (bytes_.size() < sizeof(T)) return false;
    *value = LoadLittleEndian<T>(bytes_.data());
    bytes_.remove_prefix(sizeof(T));
    return true;
  }
  // Copies exactly `out.size()` bytes.
  bool GetBytes(absl::Span<uint8_t> out) {
    if (bytes_.size() < out.size()) return false;
    if (!out.empty()) std::memcpy(out.data(), bytes_.data(), out.size());
    bytes_.remove_prefix(out.size());
    return true;
  }
  // The next `n` bytes as text, viewing the reader's span.
  bool GetText(size_t n, absl::string_view* out) {
    if (bytes_.size() < n) return false;
    *out = absl::string_view(reinterpret_cast<const char*>(bytes_.data()), n);
    bytes_.remove_prefix(n);
    return true;
  }

  // Bytes not read yet.
  size_t remaining() const { return bytes_.size(); }

 private:
  absl::Span<const uint8_t> bytes_;
};

}  // namespace causeway::transport

#endif  // CAUSEWAY_TRANSPORT_BYTES_H_
