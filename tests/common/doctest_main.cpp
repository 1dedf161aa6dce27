// The main() of every unit test executable (pactrain_add_unit_test), with doctest's
// implementation from tests/common/doctest_impl.cpp.
#include <doctest/doctest.h>

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return context.run();
}
