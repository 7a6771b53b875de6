#include "causeway/transport/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"
#include "tests/transport/loopback.h"

namespace causeway::transport {
namespace {

using testing::AsBytes;

constexpr absl::string_view kGoodSecret = "0123456789abcdef0123456789abcdef";

std::string Hex(absl::Span<const uint8_t> bytes) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::string Text(absl::Span<const uint8_t> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A file in the test's temporary directory with exactly `mode`, whatever the
// umask; removed when the test ends.
class SecretFile {
 public:
  SecretFile(absl::string_view name, absl::string_view contents, mode_t mode)
      : path_(absl::StrCat(::testing::TempDir(), "/", name, ".", getpid())) {
    unlink(path_.c_str());
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << path_;
    EXPECT_EQ(write(fd, contents.data(), contents.size()), static_cast<ssize_t>(contents.size()));
    EXPECT_EQ(fchmod(fd, mode), 0);
    close(fd);
  }
  ~SecretFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Tests HMAC-SHA256 against RFC 4231 (cases 1, 2 and 6: a short key, a key
// shorter than the digest, a key longer than the block), with the message cut
// into pieces in several ways.
TEST(HmacTest, MatchesRfc4231) {
  const std::vector<uint8_t> key1(20, 0x0b);
  ASSERT_OK_AND_ASSIGN(Digest case1, HmacSha256(key1, {AsBytes("Hi There")}));
  EXPECT_EQ(Hex(case1), "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");

  const std::string expected2 = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
  ASSERT_OK_AND_ASSIGN(Digest whole, HmacSha256(AsBytes("Jefe"), {AsBytes("what do ya want for nothing?")}));
  EXPECT_EQ(Hex(whole), expected2);
  ASSERT_OK_AND_ASSIGN(Digest pieces,
                       HmacSha256(AsBytes("Jefe"), {AsBytes("what do ya"), AsBytes(""), AsBytes(" want for "),
                                                    AsBytes("nothing?")}));
  EXPECT_EQ(Hex(pieces), expected2);

  // An empty key and message (a value computed with Python's hmac module).
  ASSERT_OK_AND_ASSIGN(Digest empty, HmacSha256({}, {}));
  EXPECT_EQ(Hex(empty), "b613679a0814d9ec772f95d778c35fc5ff1697c493715653c6c712144292c5ad");

  const std::vector<uint8_t> key6(131, 0xaa);
  ASSERT_OK_AND_ASSIGN(Digest case6,
                       HmacSha256(key6, {AsBytes("Test Using Larger Than Block-Size Key - Hash Key First")}));
  EXPECT_EQ(Hex(case6), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST(HmacTest, ConstantTimeEqualsComparesBytesAndLengths) {
  EXPECT_TRUE(ConstantTimeEquals(AsBytes("abcdef"), AsBytes("abcdef")));
  EXPECT_TRUE(ConstantTimeEquals(AsBytes(""), AsBytes("")));
  EXPECT_FALSE(ConstantTimeEquals(AsBytes("abcdef"), AsBytes("abcdeg")));
  EXPECT_FALSE(ConstantTimeEquals(AsBytes("abcdef"), AsBytes("Abcdef")));
  EXPECT_FALSE(ConstantTimeEquals(AsBytes("abcdef"), AsBytes("abcde")));
}

// Tests that nonces are random: two draws differ and neither is all zeros.
TEST(RandomTest, FillRandomGivesFreshBytes) {
  std::vector<uint8_t> a(32, 0);
  std::vector<uint8_t> b(32, 0);
  ASSERT_OK(FillRandom(absl::MakeSpan(a)));
  ASSERT_OK(FillRandom(absl::MakeSpan(b)));
  EXPECT_NE(a, b);
  EXPECT_NE(a, std::vector<uint8_t>(32, 0));
}

// Tests a good secret file, with and without a trailing newline.
TEST(SecretTest, ReadsAPrivateFile) {
  for (absl::string_view ending : {"", "\n", "\r\n"}) {
    SCOPED_TRACE(absl::CHexEscape(ending));
    SecretFile file("secret", absl::StrCat(kGoodSecret, ending), 0600);
    ASSERT_OK_AND_ASSIGN(Secret secret, Secret::FromFile(file.path()));
    EXPECT_EQ(Text(secret.bytes()), kGoodSecret);
  }
  SecretFile read_only("secret_ro", kGoodSecret, 0400);
  ASSERT_OK_AND_ASSIGN(Secret secret, Secret::FromFile(read_only.path()));
  EXPECT_EQ(Text(secret.bytes()), kGoodSecret);
}

// Tests that a file others can read or write is refused, saying how to fix it.
TEST(SecretTest, RefusesAFileOthersCanUse) {
  for (mode_t mode : {0644, 0640, 0604, 0620, 0602, 0660}) {
    SecretFile file("secret_shared", kGoodSecret, mode);
    char octal[8];
    snprintf(octal, sizeof(octal), "%04o", mode);
    EXPECT_ERROR(Secret::FromFile(file.path()).status(), absl::StatusCode::kFailedPrecondition,
                 absl::StrCat("secret file '", file.path(), "' has mode ", octal),
                 "must not be accessible to group or others", "chmod 600");
  }
}

// Tests that a file owned by another user is refused (it takes root to make
// one).
TEST(SecretTest, RefusesAFileOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "making a file owned by another user needs root";
  SecretFile file("secret_owned", kGoodSecret, 0600);
  ASSERT_EQ(chown(file.path().c_str(), 65534, 65534), 0);
  EXPECT_ERROR(Secret::FromFile(file.path()).status(), absl::StatusCode::kFailedPrecondition,
               "is owned by user 65534; it must be owned by this process's user, 0");
}

// Tests the size limits: empty, too short to be safe, larger than 4 KiB.
TEST(SecretTest, RefusesEmptyShortAndHugeFiles) {
  SecretFile empty("secret_empty", "", 0600);
  EXPECT_ERROR(Secret::FromFile(empty.path()).status(), absl::StatusCode::kInvalidArgument, "is empty");
  SecretFile newline_only("secret_newline", "\n", 0600);
  EXPECT_ERROR(Secret::FromFile(newline_only.path()).status(), absl::StatusCode::kInvalidArgument,
               "is empty");
  SecretFile short_one("secret_short", "hunter2", 0600);
  EXPECT_ERROR(Secret::FromFile(short_one.path()).status(), absl::StatusCode::kInvalidArgument,
               "holds 7 bytes; a secret needs at least 16");
  SecretFile largest("secret_largest", std::string(4096, 's'), 0600);
  ASSERT_OK_AND_ASSIGN(Secret secret, Secret::FromFile(largest.path()));
  EXPECT_EQ(secret.bytes().size(), 4096u);
  SecretFile huge("secret_huge", std::string(4097, 's'), 0600);
  EXPECT_ERROR(Secret::FromFile(huge.path()).status(), absl::StatusCode::kInvalidArgument,
               "holds 4097 bytes; a secret has at most 4096");
}

TEST(SecretTest, RefusesMissingFilesAndDirectories) {
  const std::string missing = absl::StrCat(::testing::TempDir(), "/no_such_secret");
  EXPECT_ERROR(Secret::FromFile(missing).status(), absl::StatusCode::kNotFound,
               absl::StrCat("cannot open secret file '", missing, "'"));
  EXPECT_ERROR(Secret::FromFile(::testing::TempDir()).status(), absl::StatusCode::kFailedPrecondition,
               "is not a regular file");
}

TEST(SecretTest, ReadsTheEnvironment) {
  constexpr char kName[] = "CAUSEWAY_TEST_SECRET_VARIABLE";
  unsetenv(kName);
  EXPECT_ERROR(Secret::FromEnvironment(kName).status(), absl::StatusCode::kNotFound,
               "environment variable CAUSEWAY_TEST_SECRET_VARIABLE is not set");
  setenv(kName, "", 1);
  EXPECT_ERROR(Secret::FromEnvironment(kName).status(), absl::StatusCode::kNotFound, "is empty");
  setenv(kName, "short", 1);
  EXPECT_ERROR(Secret::FromEnvironment(kName).status(), absl::StatusCode::kInvalidArgument,
               "environment variable CAUSEWAY_TEST_SECRET_VARIABLE holds 5 bytes");
  setenv(kName, std::string(kGoodSecret).c_str(), 1);
  ASSERT_OK_AND_ASSIGN(Secret secret, Secret::FromEnvironment(kName));
  EXPECT_EQ(Text(secret.bytes()), kGoodSecret);
  unsetenv(kName);
}

// Tests that copies and moves keep the bytes, and a moved-from secret is
// empty.
TEST(SecretTest, CopiesAndMovesKeepTheBytes) {
  ASSERT_OK_AND_ASSIGN(Secret original, Secret::FromBytes(kGoodSecret));
  Secret copy = original;
  EXPECT_EQ(Text(copy.bytes()), kGoodSecret);
  Secret moved = std::move(original);
  EXPECT_EQ(Text(moved.bytes()), kGoodSecret);
  EXPECT_TRUE(original.bytes().empty());  // NOLINT(bugprone-use-after-move): the contract under test
  ASSERT_OK_AND_ASSIGN(Secret other, Secret::FromBytes(std::string(20, 'z')));
  copy = other;
  EXPECT_EQ(Text(copy.bytes()), std::string(20, 'z'));
}

}  // namespace
}  // namespace causeway::transport
