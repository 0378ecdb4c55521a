// FUZZ_CHECK: the fuzz targets' assertion.  An oracle that fails must crash
// the run (libFuzzer keeps the input as a crash), in every build: assert()
// is gone under NDEBUG, and doctest is not linked into fuzz targets.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                               \
    }                                                                             \
  } while (0)
