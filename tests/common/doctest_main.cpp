// The main() of every unit test executable (pactrain_add_unit_test), compiled once: doctest's
// implementation costs about 6 s of a 2-core machine per translation unit in the sanitizer
// build, and there are over a dozen unit tests.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
