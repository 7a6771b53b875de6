// The CLI's flag parser (tools/flags.h): the three ways of giving a flag,
// booleans and their --no- forms, positional arguments, defaults, numbers,
// the runtime flags' options, the secret's sources, and the errors that each
// kind of bad command line gives.
#include "tools/flags.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_support.h"

namespace causeway::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Flags TestFlags() {
  return Flags({{"name", "who", "world"},
                {"count", "how many", "3"},
                {"empty", "no default", ""},
                {"verbose", "say more", "", true},
                {"color", "use color", "true", true}});
}

// Tests --name=value, --name value and positional arguments, in order, and
// that Has tells given flags from defaults.
TEST(FlagsTest, ParsesValuesBothWaysAndKeepsPositionals) {
  Flags flags = TestFlags();
  ASSERT_OK(flags.Parse({"first", "--name=ada", "second", "--count", "7", "-", "third"}));
  EXPECT_EQ(flags.Get("name"), "ada");
  ASSERT_OK_AND_ASSIGN(int64_t count, flags.Int("count"));
  EXPECT_EQ(count, 7);
  EXPECT_THAT(flags.positional(), ElementsAre("first", "second", "-", "third"));
  EXPECT_TRUE(flags.Has("name"));
  EXPECT_TRUE(flags.Has("count"));
  EXPECT_FALSE(flags.Has("empty"));
  EXPECT_FALSE(flags.Has("verbose"));
}

// Tests that an unset flag reads as its default ("" where it has none), and
// an unknown name as "".
TEST(FlagsTest, UnsetFlagsReadTheirDefaults) {
  Flags flags = TestFlags();
  ASSERT_OK(flags.Parse({}));
  EXPECT_EQ(flags.Get("name"), "world");
  EXPECT_EQ(flags.Get("empty"), "");
  EXPECT_EQ(flags.Get("not-a-flag"), "");
  EXPECT_FALSE(flags.Bool("verbose"));
  EXPECT_TRUE(flags.Bool("color"));
  ASSERT_OK_AND_ASSIGN(int64_t count, flags.Int("count"));
  EXPECT_EQ(count, 3);
}

// Tests a value that holds '=' and one that starts with "--" after a
// separate flag name: both are taken as they are.
TEST(FlagsTest, ValuesAreTakenVerbatim) {
  Flags flags = TestFlags();
  ASSERT_OK(flags.Parse({"--name=a=b", "--empty", "--count"}));
  EXPECT_EQ(flags.Get("name"), "a=b");
  EXPECT_EQ(flags.Get("empty"), "--count");
  EXPECT_TRUE(flags.positional().empty());
}

// Tests booleans: bare, with true/false/1/0, negated with --no-, and -h for
// --help; a later flag overrides an earlier one.
TEST(FlagsTest, Booleans) {
  Flags flags = TestFlags();
  ASSERT_OK(flags.Parse({"--verbose", "--no-color", "-h"}));
  EXPECT_TRUE(flags.Bool("verbose"));
  EXPECT_FALSE(flags.Bool("color"));
  EXPECT_TRUE(flags.Bool("help"));
  EXPECT_TRUE(flags.Has("color"));

  Flags values = TestFlags();
  ASSERT_OK(values.Parse({"--verbose=1", "--color=0"}));
  EXPECT_TRUE(values.Bool("verbose"));
  EXPECT_FALSE(values.Bool("color"));
  ASSERT_OK(values.Parse({"--verbose=false", "--color=true"}));
  EXPECT_FALSE(values.Bool("verbose"));
  EXPECT_TRUE(values.Bool("color"));
}

// Tests each kind of bad command line, each with its own message.
TEST(FlagsTest, BadCommandLines) {
  EXPECT_ERROR(TestFlags().Parse({"--bogus"}), absl::StatusCode::kInvalidArgument, "unknown flag --bogus");
  EXPECT_ERROR(TestFlags().Parse({"--bogus=1"}), absl::StatusCode::kInvalidArgument, "unknown flag --bogus");
  // --no- negates booleans only, and takes no value.
  EXPECT_ERROR(TestFlags().Parse({"--no-name"}), absl::StatusCode::kInvalidArgument,
               "unknown flag --no-name");
  EXPECT_ERROR(TestFlags().Parse({"--no-color=true"}), absl::StatusCode::kInvalidArgument,
               "unknown flag --no-color");
  EXPECT_ERROR(TestFlags().Parse({"--verbose=yes"}), absl::StatusCode::kInvalidArgument,
               "--verbose takes true or false, got 'yes'");
  EXPECT_ERROR(TestFlags().Parse({"x", "--name"}), absl::StatusCode::kInvalidArgument,
               "--name needs a value");

  Flags flags = TestFlags();
  ASSERT_OK(flags.Parse({"--count=12x"}));
  EXPECT_ERROR(flags.Int("count"), absl::StatusCode::kInvalidArgument, "--count wants a number, got '12x'");
  EXPECT_ERROR(flags.Int("empty"), absl::StatusCode::kInvalidArgument, "--empty wants a number, got ''");
}

// Tests that the help lists every flag, values with =VALUE, booleans bare,
// with defaults, and the --trace and --help every command has.
TEST(FlagsTest, HelpListsEveryFlag) {
  const std::string help = TestFlags().Help();
  EXPECT_THAT(help, HasSubstr("--name=VALUE"));
  EXPECT_THAT(help, HasSubstr("who (default world)"));
  EXPECT_THAT(help, HasSubstr("--verbose "));
  EXPECT_THAT(help, HasSubstr("--trace=VALUE"));
  EXPECT_THAT(help, HasSubstr("--help "));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("--verbose=VALUE")));
  EXPECT_THAT(help, ::testing::Not(HasSubstr("no default (default")));
}

// Tests that without --trace no trace session starts.
TEST(FlagsTest, NoTraceWithoutTheFlag) {
  Flags flags = TestFlags();
  ASSERT_OK(flags.Parse({}));
  ASSERT_OK_AND_ASSIGN(auto session, flags.StartTrace());
  EXPECT_EQ(session, nullptr);
}

// Tests that the runtime flags fill RuntimeOptions field by field, and that
// unset ones leave the defaults.
TEST(RuntimeFlagsTest, FillOptions) {
  Flags flags(RuntimeFlagSpecs());
  ASSERT_OK(flags.Parse({"--accelerators=3", "--device", "cpu", "--memory-budget=2MiB", "--ring-slots=5",
                         "--sharing=devices", "--validation", "--no-external-memory", "--copy-engine=off"}));
  ASSERT_OK_AND_ASSIGN(RuntimeOptions o, RuntimeOptionsFromFlags(flags));
  EXPECT_EQ(o.accelerators, 3);
  EXPECT_EQ(o.device, "cpu");
  EXPECT_EQ(o.memory_budget, 2u * 1024 * 1024);
  EXPECT_EQ(o.ring_capacity, 5u);
  EXPECT_EQ(o.sharing, "devices");
  EXPECT_TRUE(o.validation);
  EXPECT_FALSE(o.use_external_memory);
  EXPECT_EQ(o.copy_engine, "off");

  Flags unset(RuntimeFlagSpecs());
  ASSERT_OK(unset.Parse({}));
  ASSERT_OK_AND_ASSIGN(RuntimeOptions d, RuntimeOptionsFromFlags(unset));
  EXPECT_EQ(d.accelerators, 0);
  EXPECT_EQ(d.memory_budget, 0u);
  EXPECT_EQ(d.ring_capacity, 0u);
  EXPECT_EQ(d.sharing, "auto");
  EXPECT_FALSE(d.validation);
  EXPECT_TRUE(d.use_external_memory);
}

// Tests the runtime flags' range and format errors.
TEST(RuntimeFlagsTest, RefusesBadValues) {
  auto options = [](std::vector<std::string> args) -> absl::StatusOr<RuntimeOptions> {
    Flags flags(RuntimeFlagSpecs());
    CAUSEWAY_RETURN_IF_ERROR(flags.Parse(args));
    return RuntimeOptionsFromFlags(flags);
  };
  EXPECT_ERROR(options({"--accelerators=0"}), absl::StatusCode::kInvalidArgument,
               "--accelerators must be 1..256, got 0");
  EXPECT_ERROR(options({"--accelerators=257"}), absl::StatusCode::kInvalidArgument,
               "--accelerators must be 1..256, got 257");
  EXPECT_ERROR(options({"--accelerators=two"}), absl::StatusCode::kInvalidArgument,
               "--accelerators wants a number, got 'two'");
  EXPECT_ERROR(options({"--ring-slots=0"}), absl::StatusCode::kInvalidArgument,
               "--ring-slots must be 1..1048576");
  EXPECT_ERROR(options({"--ring-slots=1048577"}), absl::StatusCode::kInvalidArgument,
               "--ring-slots must be 1..1048576");
  EXPECT_ERROR(options({"--memory-budget=lots"}), absl::StatusCode::kInvalidArgument,
               "not a byte size: 'lots'");
}

// Sets an environment variable for a scope and restores it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A file holding `text` with `mode`, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& text, mode_t mode) {
    char name[] = "/tmp/flags_test_XXXXXX";
    const int fd = mkstemp(name);
    EXPECT_GE(fd, 0);
    path_ = name;
    EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    EXPECT_EQ(fchmod(fd, mode), 0);
    close(fd);
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string Text(const transport::Secret& secret) {
  return std::string(secret.bytes().begin(), secret.bytes().end());
}

// Tests the secret's sources: the file when --secret-file is given (over
// the variable), else CAUSEWAY_SECRET, else none; and that an unusable
// source is an error rather than no secret.
TEST(SecretFlagsTest, FileThenEnvironmentThenNone) {
  const std::vector<FlagSpec> specs = {{"secret-file", "the secret", ""}};
  const std::string from_env = "0123456789abcdef-env";
  const std::string from_file = "0123456789abcdef-file";
  TempFile file(from_file + "\n", 0600);
  {
    ScopedEnv env(transport::kSecretEnvironmentVariable, from_env.c_str());
    Flags with_file(specs);
    ASSERT_OK(with_file.Parse({"--secret-file", file.path()}));
    ASSERT_OK_AND_ASSIGN(std::optional<transport::Secret> secret, SecretFromFlags(with_file));
    ASSERT_TRUE(secret.has_value());
    EXPECT_EQ(Text(*secret), from_file);

    Flags without(specs);
    ASSERT_OK(without.Parse({}));
    ASSERT_OK_AND_ASSIGN(secret, SecretFromFlags(without));
    ASSERT_TRUE(secret.has_value());
    EXPECT_EQ(Text(*secret), from_env);
  }
  {
    ScopedEnv env(transport::kSecretEnvironmentVariable, nullptr);
    Flags without(specs);
    ASSERT_OK(without.Parse({}));
    ASSERT_OK_AND_ASSIGN(std::optional<transport::Secret> secret, SecretFromFlags(without));
    EXPECT_FALSE(secret.has_value());
  }
  {
    ScopedEnv env(transport::kSecretEnvironmentVariable, "short");
    Flags without(specs);
    ASSERT_OK(without.Parse({}));
    EXPECT_ERROR(SecretFromFlags(without), absl::StatusCode::kInvalidArgument,
                 "environment variable CAUSEWAY_SECRET holds 5 bytes; a secret needs at least 16");
  }
  TempFile open_to_all(from_file, 0644);
  Flags loose(specs);
  ASSERT_OK(loose.Parse({"--secret-file=" + open_to_all.path()}));
  EXPECT_ERROR(SecretFromFlags(loose), absl::StatusCode::kFailedPrecondition,
               "has mode 0644; it must not be accessible to group or others");
}

}  // namespace
}  // namespace causeway::cli
