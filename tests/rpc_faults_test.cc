// PLACEHOLDER: being written; must be replaced before commit.
#include <doctest/doctest.h>
TEST_CASE("placeholder ${n}") { CHECK(true); }
