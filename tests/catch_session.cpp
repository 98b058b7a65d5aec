// Catch2's implementation, for every test program (catch_session.hpp). Not
// our code: built quickly and without the sanitizers (tests/CMakeLists.txt).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

int test::run_catch(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
