# Test registration helpers.
#
# Note [cpu and gpu variants of one test binary]
# A suite that talks to the CUDA runtime is built once and registered twice:
#   <name>.cpu  label cpu: LD_LIBRARY_PATH puts the project's test double of
#               libcudart.so.13 (tests/cudart_double) ahead of the real runtime; the
#               binary's RUNPATH lets it. STASH_TEST_RUNTIME=double makes the shared test
#               main fail loudly if the double did not load.
#   <name>.gpu  label gpu: the real runtime. Without a device, the shared test main skips
#               every test (GTEST_SKIP) and ctest reports the test as skipped through
#               SKIP_REGULAR_EXPRESSION; with one, the same suite runs on the GPU.
# Pure CPU suites (planner) are registered once, label cpu.

set(STASH_DOUBLE_DIR ${CMAKE_BINARY_DIR}/cudart_double)
set(STASH_SKIP_REGEX "\\[ STASH NO DEVICE \\]")

# Note [The installed test set]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# `cmake --install <build> --prefix <P> --component tests` (never part of a plain install)
# puts every suite registered below, both variants, and the gpu-labelled Python tests under
# <P>/libexec/stash/tests, with the test double and a CTestTestfile.cmake of their own:
#   ctest --test-dir <P>/libexec/stash/tests -L gpu
# runs on a machine that has the prefix (with a plain install into it too: the tests use
# its libraries, CLI, header and profiles) and nothing else, no build tree and no sources;
# `-L cpu` runs the .cpu variants on the installed double, and `-L figures` the benchmarks a
# GPU machine records (Note [The figures tests] in tests/gpu/CMakeLists.txt).
# tests/gpu/carry.sh carries a build to a GPU machine that way, as rmm carries its installed gtests. Nothing in that CTestTestfile.cmake names
# the build machine: ctest reads it in its own folder, its working directory (`pwd -P`
# there, since CMake 4 resolves no relative path in a CTestTestfile), and every program,
# library and file is found from there. The programs' RUNPATH
# is $ORIGIN/<tests to lib>; the files a test runs or reads are named by environment
# variables (Note [Test programs' paths] in tests/common/test_paths.h). A sanitizer build
# installs no tests: its programs need the sanitizer runtime of the build machine.
include(GNUInstallDirs)
set(STASH_TESTS_INSTALL_DIR ${CMAKE_INSTALL_LIBEXECDIR}/stash/tests)
file(RELATIVE_PATH STASH_TESTS_TO_LIB "/${STASH_TESTS_INSTALL_DIR}" "/${CMAKE_INSTALL_LIBDIR}")
set_property(GLOBAL PROPERTY STASH_INSTALLED_TESTS "")

# stash_install_test_program(<target>): a program of the installed test set.
function(stash_install_test_program target)
  if(STASH_SANITIZE)
    return()
  endif()
  set_target_properties(${target} PROPERTIES INSTALL_RPATH "$ORIGIN/${STASH_TESTS_TO_LIB}")
  install(TARGETS ${target} DESTINATION ${STASH_TESTS_INSTALL_DIR} COMPONENT tests
          EXCLUDE_FROM_ALL)
endfunction()

# A value as CMake quotes its own in a CTestTestfile.cmake: backslashes and quotes escaped,
# a list as "a;b"; then @TESTS@, @PREFIX@, @PYTHON@, @PYTHONPATH@ and @OUT@ become the
# variables its header sets (tests/CMakeLists.txt).
function(_stash_quote var value)
  string(REPLACE "\\" "\\\\" q "${value}")
  string(REPLACE "\"" "\\\"" q "${q}")
  string(REPLACE "@TESTS@" "\${_tests}" q "${q}")
  string(REPLACE "@PREFIX@" "\${_prefix}" q "${q}")
  string(REPLACE "@PYTHONPATH@" "\${_pythonpath}" q "${q}")
  string(REPLACE "@PYTHON@" "\${_python}" q "${q}")
  string(REPLACE "@OUT@" "\${_out}" q "${q}")
  set(${var} "\"${q}\"" PARENT_SCOPE)
endfunction()

# stash_installed_test(<name> COMMAND <program> [args...] [LABELS ...] [TIMEOUT s]
#                      [ENVIRONMENT VAR=value...] [SKIP_RETURN_CODE n] [SKIP_REGEX]):
# a test of the installed CTestTestfile.cmake. In the command and the environment,
# @TESTS@ is the installed test folder and @PREFIX@ the prefix, both absolute when ctest
# runs, @PYTHON@ the GPU Python tests' interpreter ($STASH_GPU_PYTHON, else python3),
# @PYTHONPATH@ the installed package's folder followed by $PYTHONPATH (wheels carried to
# the machine), and @OUT@ where the figures tests write (Note [The figures tests] in
# tests/gpu/CMakeLists.txt); SKIP_REGEX skips on STASH_SKIP_REGEX, as the .gpu variants do.
function(stash_installed_test name)
  cmake_parse_arguments(ARG "SKIP_REGEX" "TIMEOUT;SKIP_RETURN_CODE" "COMMAND;LABELS;ENVIRONMENT"
                        ${ARGN})
  if(STASH_SANITIZE)
    return()
  endif()
  set(words "")
  foreach(w IN LISTS ARG_COMMAND)
    _stash_quote(q "${w}")
    string(APPEND words " ${q}")
  endforeach()
  _stash_quote(labels "${ARG_LABELS}")
  set(props "LABELS ${labels} TIMEOUT \"${ARG_TIMEOUT}\"")
  if(ARG_ENVIRONMENT)
    _stash_quote(env "${ARG_ENVIRONMENT}")
    string(APPEND props " ENVIRONMENT ${env}")
  endif()
  if(DEFINED ARG_SKIP_RETURN_CODE)
    string(APPEND props " SKIP_RETURN_CODE \"${ARG_SKIP_RETURN_CODE}\"")
  endif()
  if(ARG_SKIP_REGEX)
    _stash_quote(re "${STASH_SKIP_REGEX}")
    string(APPEND props " SKIP_REGULAR_EXPRESSION ${re}")
  endif()
  set(text "add_test([=[${name}]=]${words})\nset_tests_properties([=[${name}]=] PROPERTIES ${props})\n")
  set_property(GLOBAL APPEND_STRING PROPERTY STASH_INSTALLED_TESTS "${text}")
endfunction()

# The installed test environment of one suite: the files Note [Test programs' paths] names.
set(STASH_INSTALLED_TEST_ENV
  "STASH_CLI=@PREFIX@/${CMAKE_INSTALL_BINDIR}/stash"
  "STASH_HEADER=@PREFIX@/${CMAKE_INSTALL_INCLUDEDIR}/stash.h"
  "STASH_PROFILES_DIR=@PREFIX@/${CMAKE_INSTALL_DATADIR}/stash/profiles"
  "STASH_INJECT_PROBE=@TESTS@/measure_inject_probe"
  "STASH_WORKLOAD=@TESTS@/measure_workload")

# Note [A temporary folder per test]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Suites write their files under ::testing::TempDir(), which is $TEST_TMPDIR when set and
# /tmp/ otherwise, with fixed names. Each test registered here gets a folder of its own in
# the build tree as $TEST_TMPDIR, so that two ctest runs at once (two checkouts, or the
# .cpu and .gpu variants under -j) never write each other's files.
function(_stash_tmpdir out name)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/tmp/${name})
  file(MAKE_DIRECTORY ${dir})
  set(${out} "TEST_TMPDIR=${dir}/" PARENT_SCOPE)
endfunction()

# stash_add_cpu_test(<target> [LABELS extra...] [TIMEOUT s])
function(stash_add_cpu_test target)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${target} COMMAND ${target})
  _stash_tmpdir(tmp ${target})
  set_tests_properties(${target} PROPERTIES LABELS "cpu;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "${tmp}")
endfunction()

# _stash_add_variant(<target> <cpu|gpu> [LABELS extra...] [TIMEOUT s] [SKIP_RETURN_CODE n]):
# <target>.cpu or <target>.gpu (Note [cpu and gpu variants of one test binary]), in the
# build tree and in the installed test set.
function(_stash_add_variant target variant)
  cmake_parse_arguments(ARG "" "TIMEOUT;SKIP_RETURN_CODE" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(name ${target}.${variant})
  set(installed "")
  if(variant STREQUAL "cpu")
    set(env "LD_LIBRARY_PATH=${STASH_DOUBLE_DIR};STASH_TEST_RUNTIME=double")
    set(installed_env LD_LIBRARY_PATH=@TESTS@/double STASH_TEST_RUNTIME=double)
  else()
    set(env "STASH_TEST_RUNTIME=real")
    set(installed_env STASH_TEST_RUNTIME=real)
    list(APPEND installed SKIP_REGEX)
  endif()
  add_test(NAME ${name} COMMAND ${target})
  _stash_tmpdir(tmp ${name})
  set_tests_properties(${name} PROPERTIES LABELS "${variant};${ARG_LABELS}"
                       TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${env};${tmp}")
  if(variant STREQUAL "gpu")
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "${STASH_SKIP_REGEX}")
  endif()
  if(DEFINED ARG_SKIP_RETURN_CODE)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${ARG_SKIP_RETURN_CODE})
    list(APPEND installed SKIP_RETURN_CODE ${ARG_SKIP_RETURN_CODE})
  endif()
  stash_installed_test(${name} COMMAND @TESTS@/${target} LABELS ${variant} ${ARG_LABELS}
    TIMEOUT ${ARG_TIMEOUT} ${installed}
    ENVIRONMENT ${installed_env} ${STASH_INSTALLED_TEST_ENV})
endfunction()

# stash_add_runtime_test(<target> [LABELS extra...] [TIMEOUT s] [SKIP_RETURN_CODE n])
function(stash_add_runtime_test target)
  _stash_add_variant(${target} cpu ${ARGN})
  stash_add_gpu_test(${target} ${ARGN})
  if(TARGET cudart_double)
    add_dependencies(${target} cudart_double)
  endif()
endfunction()

# stash_add_gpu_test(<target> [LABELS extra...] [TIMEOUT s] [SKIP_RETURN_CODE n]): suites
# that launch kernels, which no CPU test double can run; registered under label gpu only,
# skipping cleanly without a device.
function(stash_add_gpu_test target)
  _stash_add_variant(${target} gpu ${ARGN})
  stash_install_test_program(${target})
endfunction()
