// The subcommands of the causeway tool. Each takes its arguments (after the
// command name) and returns the process exit code.
#ifndef CAUSEWAY_TOOLS_COMMANDS_H_
#define CAUSEWAY_TOOLS_COMMANDS_H_

#include <string>
#include <vector>

namespace causeway::cli {

int DevicesCommand(const std::vector<std::string>& args);
int DemoCommand(const std::vector<std::string>& args);
int TrainCommand(const std::vector<std::string>& args);
int LaunchCommand(const std::vector<std::string>& args);
int IslandCommand(const std::vector<std::string>& args);
int RunCommand(const std::vector<std::string>& args);
int TraceCommand(const std::vector<std::string>& args);
int BenchCommand(const std::vector<std::string>& args);
int SoakCommand(const std::vector<std::string>& args);

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_COMMANDS_H_
