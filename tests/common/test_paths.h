// test_paths.h: where a test finds the programs it runs and the files it reads.
//
// Note [Test programs' paths]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// Each such path is a compile definition naming the file in the build tree (STASH_CLI is
// $<TARGET_FILE:stash>); an environment variable of the same name, when set, takes its
// place. The installed test set sets those variables to the installed files (Note [The
// installed test set] in cmake/StashTesting.cmake), so one binary runs from either place.
#pragma once

#include <cstdlib>
#include <string>

namespace stash::test {

inline std::string test_path(const char* name, const char* built) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : std::string(built);
}

}  // namespace stash::test

// STASH_TEST_PATH(STASH_CLI): $STASH_CLI if set, else the compiled-in STASH_CLI.
#define STASH_TEST_PATH(name) ::stash::test::test_path(#name, name)
