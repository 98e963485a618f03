# installed_tests.cmake: the test install.tests (tests/install/CMakeLists.txt), for Note
# [The installed test set] in cmake/StashTesting.cmake.
#   1. cmake --install the build, and its tests component, into a fresh prefix; then move
#      the prefix, so that nothing can lean on the path it was installed to;
#   2. the installed CTestTestfile.cmake registers exactly the build tree's gpu-labelled
#      tests, by name (a suite that a GPU machine would silently not run fails here);
#   3. no RUNPATH in the installed test programs leaves the prefix;
#   4. its cpu-labelled tests pass there, on the installed test double, and its gpu ones
#      skip (this machine has no device) or pass (one that has).
cmake_minimum_required(VERSION 3.24)
foreach(v BUILD_DIR WORK_DIR TESTS_DIR TESTS_TO_LIB PYTHON)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "installed_tests.cmake: -D${v}=... is missing")
  endif()
endforeach()
find_program(READELF readelf REQUIRED)

include(${CMAKE_CURRENT_LIST_DIR}/steps.cmake)

# --- 1. install, then move ----------------------------------------------------------------
set(first ${WORK_DIR}/installed-first)
set(prefix ${WORK_DIR}/installed)
file(REMOVE_RECURSE ${first} ${prefix})
capture(o ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${first})
capture(o ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${first} --component tests)
file(RENAME ${first} ${prefix})
set(tests ${prefix}/${TESTS_DIR})

# --- 2. the same gpu tests as the build tree ----------------------------------------------
function(gpu_tests out dir)
  capture(o ${CMAKE_CTEST_COMMAND} --test-dir ${dir} -N -L gpu)
  string(REGEX MATCHALL "Test +#[0-9]+: [^\n]+" lines "${o}")
  list(TRANSFORM lines REPLACE "Test +#[0-9]+: " "")
  list(SORT lines)
  set(${out} "${lines}" PARENT_SCOPE)
endfunction()
gpu_tests(built ${BUILD_DIR})
gpu_tests(installed ${tests})
if(NOT built STREQUAL installed)
  message(FATAL_ERROR "installed tests: the gpu tests differ\n  build tree: ${built}\n"
                      "  installed:  ${installed}")
endif()
list(LENGTH built n)
message(STATUS "installed tests: the build tree's ${n} gpu tests, in ${tests}")

# --- 3. RUNPATHs --------------------------------------------------------------------------
file(GLOB programs LIST_DIRECTORIES false ${tests}/*)
list(FILTER programs EXCLUDE REGEX "CTestTestfile\\.cmake$")
foreach(p IN LISTS programs)
  capture(d ${READELF} -d ${p})
  if(d MATCHES "R(UN)?PATH\\)[^\n]*\\[([^]\n]*)\\]")
    if(NOT CMAKE_MATCH_2 STREQUAL "$ORIGIN/${TESTS_TO_LIB}")
      message(FATAL_ERROR "installed tests: ${p}'s RUNPATH is ${CMAKE_MATCH_2}")
    endif()
  else()
    message(FATAL_ERROR "installed tests: ${p} has no RUNPATH")
  endif()
endforeach()

# --- 4. run them --------------------------------------------------------------------------
# From another folder, so that only the file's own paths can make them pass. The Python
# ones need an interpreter with torch and pytest (STASH_GPU_PYTHON); without one they are
# left out, and the output says so.
set(ENV{STASH_GPU_PYTHON} ${PYTHON})
set(exclude "")
execute_process(COMMAND ${PYTHON} -c "import torch, pytest" RESULT_VARIABLE py_rc
                OUTPUT_QUIET ERROR_QUIET)
if(NOT py_rc EQUAL 0)
  message(STATUS "installed tests: ${PYTHON} lacks torch or pytest: the python.* tests are "
                 "left out")
  set(exclude -E "^python\\.")
endif()
execute_process(COMMAND ${CMAKE_CTEST_COMMAND} --test-dir ${tests} --output-on-failure ${exclude}
                WORKING_DIRECTORY ${WORK_DIR} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE o)
message("${o}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "installed tests: ctest in ${tests} failed (${rc})")
endif()
