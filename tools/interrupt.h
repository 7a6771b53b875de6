// SIGINT, SIGTERM and SIGHUP for the commands that do not take them
// themselves (island and launch do). The signals are blocked in every thread
// and one thread waits for them. On one, it prints what each accelerator of
// the process was running (devices can be wedged: nothing waits for them),
// runs the command's hook (bench stops the suite it runs), and leaves at once
// with exit code 128 + SIG: 130 for SIGINT, 143 for SIGTERM. The process ends
// within 2 s of the signal whatever the devices do.
#ifndef CAUSEWAY_TOOLS_INTERRUPT_H_
#define CAUSEWAY_TOOLS_INTERRUPT_H_

#include <functional>
#include <string>

namespace causeway::cli {

// Call first in main, before any thread starts (threads inherit the mask).
void StopOnSignals(std::string command);

// Runs on the signal's thread before the process leaves; replaces the hook
// set before; null: none. Must not block for long.
void SetInterruptHook(std::function<void()> hook);

}  // namespace causeway::cli

#endif  // CAUSEWAY_TOOLS_INTERRUPT_H_
