// The wire formats' field writer and reader (causeway/transport/bytes.h): byte order
// fixed as little-endian whatever the host's, and a reader that never reads
// past its end nor takes anything on a short read.
#include "causeway/transport/bytes.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace causeway::transport {
namespace {

using ::testing::ElementsAre;

// Tests that integers are written least significant byte first, at every
// width, and bytes and text are appended as they are.
TEST(ByteWriterTest, WritesLittleEndianAndAppends) {
  std::vector<uint8_t> out = {0xee};
  ByteWriter writer(&out);
  writer.PutInt<uint8_t>(0x01);
  writer.PutInt<uint16_t>(0x0302);
  writer.PutInt<uint32_t>(0x07060504u);
  writer.PutInt<uint64_t>(0x0f0e0d0c0b0a0908ull);
  writer.PutBytes(std::vector<uint8_t>{0xaa, 0xbb});
  writer.PutBytes(absl::string_view("hi"));
  writer.PutBytes(absl::Span<const uint8_t>());
  EXPECT_THAT(out, ElementsAre(0xee, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c,
                               0x0d, 0x0e, 0x0f, 0xaa, 0xbb, 'h', 'i'));
}

// Tests that the reader takes back what the writer wrote, field by field,
// and counts what is left.
TEST(ByteReaderTest, ReadsWhatTheWriterWrote) {
  const std::vector<uint8_t> in = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a,
                                   0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xaa, 0xbb, 'h',  'i',  0xff};
  ByteReader reader(in);
  EXPECT_EQ(reader.remaining(), 20u);
  uint8_t u8 = 0;
  uint16_t u16 = 0;
  uint32_t u32 = 0;
  uint64_t u64 = 0;
  ASSERT_TRUE(reader.GetInt(&u8));
  ASSERT_TRUE(reader.GetInt(&u16));
  ASSERT_TRUE(reader.GetInt(&u32));
  ASSERT_TRUE(reader.GetInt(&u64));
  EXPECT_EQ(u8, 0x01);
  EXPECT_EQ(u16, 0x0302);
  EXPECT_EQ(u32, 0x07060504u);
  EXPECT_EQ(u64, 0x0f0e0d0c0b0a0908ull);
  uint8_t two[2] = {};
  ASSERT_TRUE(reader.GetBytes(absl::MakeSpan(two)));
  EXPECT_THAT(two, ElementsAre(0xaa, 0xbb));
  absl::string_view text;
  ASSERT_TRUE(reader.GetText(2, &text));
  EXPECT_EQ(text, "hi");
  // The text views the reader's input.
  EXPECT_EQ(static_cast<const void*>(text.data()), static_cast<const void*>(&in[17]));
  EXPECT_EQ(reader.remaining(), 1u);
  ASSERT_TRUE(reader.GetBytes(absl::Span<uint8_t>()));  // nothing asked, nothing taken
  EXPECT_EQ(reader.remaining(), 1u);
}

// Tests that a read longer than what is left fails, leaves its output as it
// was and takes nothing, so the next shorter read still sees the same bytes.
TEST(ByteReaderTest, ShortReadsFailAndTakeNothing) {
  const std::vector<uint8_t> in = {0x11, 0x22, 0x33};
  ByteReader reader(in);
  uint32_t u32 = 0xdeadbeef;
  EXPECT_FALSE(reader.GetInt(&u32));
  EXPECT_EQ(u32, 0xdeadbeefu);
  uint8_t four[4] = {9, 9, 9, 9};
  EXPECT_FALSE(reader.GetBytes(absl::MakeSpan(four)));
  EXPECT_THAT(four, ElementsAre(9, 9, 9, 9));
  absl::string_view text = "untouched";
  EXPECT_FALSE(reader.GetText(4, &text));
  EXPECT_EQ(text, "untouched");
  EXPECT_EQ(reader.remaining(), 3u);
  uint16_t u16 = 0;
  ASSERT_TRUE(reader.GetInt(&u16));
  EXPECT_EQ(u16, 0x2211);
  uint8_t u8 = 0;
  ASSERT_TRUE(reader.GetInt(&u8));
  EXPECT_EQ(u8, 0x33);
  EXPECT_FALSE(reader.GetInt(&u8));
  EXPECT_EQ(reader.remaining(), 0u);
}

// Tests the byte-order helpers on their own at the extremes of each width.
TEST(LittleEndianTest, StoreAndLoadExtremes) {
  uint8_t bytes[8];
  StoreLittleEndian<uint64_t>(0x8000000000000001ull, bytes);
  EXPECT_THAT(bytes, ElementsAre(0x01, 0, 0, 0, 0, 0, 0, 0x80));
  EXPECT_EQ(LoadLittleEndian<uint64_t>(bytes), 0x8000000000000001ull);
  StoreLittleEndian<uint32_t>(0xffffffffu, bytes);
  EXPECT_EQ(LoadLittleEndian<uint32_t>(bytes), 0xffffffffu);
  const uint8_t two[] = {0x00, 0x80};
  EXPECT_EQ(LoadLittleEndian<uint16_t>(two), 0x8000);
}

}  // namespace
}  // namespace causeway::transport
