// A SIGBUS inside a guarded file mapping (its file was cut short under a running model) becomes one
// error line on stderr and exit status 1, instead of a silent crash (SIGBUS, status 135).
//
//   slot = torch.ops.gatherlens.guard_mapping(begin, length, "Error: ...\n")   // the mapping's bytes
//   torch.ops.gatherlens.unguard_mapping(slot)                                  // once it is unmapped
//
// The fault happens inside whatever reads the mapping (a C++ kernel, numpy, memcpy), on any thread;
// a Python signal handler would only run between two bytecodes, which that thread never reaches.
// So the handler is C and uses only async-signal-safe calls: write(2), _exit(2), sigaction, raise.
// A fault outside every guarded range (not ours) goes to the handler that was there before.
#include <torch/library.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>

namespace {

constexpr int kSlots = 16;         // mappings guarded at once (a server keeps at most a few models)
constexpr size_t kMessage = 1024;  // bytes of one slot's message (longer ones are cut)

struct Guard {
  std::atomic<int> state{0};  // 0 free, 1 being filled, 2 guarding
  uintptr_t begin = 0;
  uintptr_t end = 0;
  size_t size = 0;
  char message[kMessage];
};

Guard guards[kSlots];
std::atomic<int> reporting{0};  // set by the first faulting thread: the line is written once
struct sigaction previous;
std::once_flag installed;

void say(const char* text, size_t n) {
  while (n > 0) {
    ssize_t put = write(STDERR_FILENO, text, n);
    if (put <= 0) {
      return;
    }
    text += put;
    n -= static_cast<size_t>(put);
  }
}

void on_sigbus(int sig, siginfo_t* info, void*) {
  const auto at = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Guard& g : guards) {
    if (g.state.load(std::memory_order_acquire) == 2 && at >= g.begin && at < g.end) {
      if (reporting.exchange(1) != 0) {
        for (;;) {
          pause();  // another thread faulted first and is writing the line: its _exit ends us all
        }
      }
      say(g.message, g.size);
      _exit(1);
    }
  }
  sigaction(sig, &previous, nullptr);  // not a guarded mapping: the previous handler takes it
  raise(sig);                          // pending until this handler returns, then delivered
}

void install() {
  struct sigaction act;
  std::memset(&act, 0, sizeof(act));
  act.sa_sigaction = on_sigbus;
  act.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&act.sa_mask);
  sigaction(SIGBUS, &act, &previous);
}

int64_t guard_mapping(int64_t begin, int64_t length, c10::string_view message) {
  TORCH_CHECK(begin > 0 && length > 0, "guard_mapping: begin and length must be > 0");
  std::call_once(installed, install);
  for (int i = 0; i < kSlots; ++i) {
    int free = 0;
    Guard& g = guards[i];
    if (!g.state.compare_exchange_strong(free, 1)) {
      continue;
    }
    g.size = std::min(message.size(), kMessage);
    std::memcpy(g.message, message.data(), g.size);
    g.begin = static_cast<uintptr_t>(begin);
    g.end = g.begin + static_cast<uintptr_t>(length);
    g.state.store(2, std::memory_order_release);
    return i;
  }
  return -1;  // every slot taken: this mapping goes unguarded (its per-step check still runs)
}

void unguard_mapping(int64_t slot) {
  if (slot >= 0 && slot < kSlots) {
    guards[slot].state.store(0, std::memory_order_release);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens, m) {
  m.def("guard_mapping(int begin, int length, str message) -> int", &guard_mapping);
  m.def("unguard_mapping(int slot) -> ()", &unguard_mapping);
}
