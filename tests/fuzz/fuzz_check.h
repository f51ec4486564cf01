// FUZZ_CHECK: the invariant checks of the fuzz targets. A failed check aborts,
// which libFuzzer reports as a crash and a replay test as a failure.
#ifndef NIBBLE_TESTS_FUZZ_FUZZ_CHECK_H_
#define NIBBLE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition)                                          \
  do {                                                                 \
    if (!(condition)) {                                                \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK failed: %s\n", __FILE__, \
                   __LINE__, #condition);                              \
      std::abort();                                                    \
    }                                                                  \
  } while (false)

#endif  // NIBBLE_TESTS_FUZZ_FUZZ_CHECK_H_
