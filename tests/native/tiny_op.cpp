// The smallest native kernel for tests/test_faults.py: one operator on plain ints (no tensors),
// so a build costs seconds, not a minute.   torch.ops.gatherlens_test.twice(21) -> 42
#include <cstdint>

#include <torch/library.h>

namespace {
int64_t twice(int64_t x) { return 2 * x; }
}  // namespace

TORCH_LIBRARY_FRAGMENT(gatherlens_test, m) {
  m.def("twice(int x) -> int", &twice);
}
