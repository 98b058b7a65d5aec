// Catch2's session, compiled once (catch_session.cpp) and linked into every
// test program, whose own main decides whether to run it: the framework's
// implementation takes longer to compile than most test files.
#pragma once

namespace test {

// Runs the tests the command line selects; the number failed (at most 255),
// or Catch2's code for a command line it rejects.
int run_catch(int argc, char* argv[]);

}  // namespace test
