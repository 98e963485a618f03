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

# stash_add_cpu_test(<target> [LABELS extra...] [TIMEOUT s])
function(stash_add_cpu_test target)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${target} COMMAND ${target})
  set_tests_properties(${target} PROPERTIES LABELS "cpu;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT})
endfunction()

# stash_add_runtime_test(<target> [LABELS extra...] [TIMEOUT s])
function(stash_add_runtime_test target)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${target}.cpu COMMAND ${target})
  set_tests_properties(${target}.cpu PROPERTIES
    LABELS "cpu;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "LD_LIBRARY_PATH=${STASH_DOUBLE_DIR};STASH_TEST_RUNTIME=double")
  stash_add_gpu_test(${target} LABELS ${ARG_LABELS} TIMEOUT ${ARG_TIMEOUT})
  if(TARGET cudart_double)
    add_dependencies(${target} cudart_double)
  endif()
endfunction()

# stash_add_gpu_test(<target> [LABELS extra...] [TIMEOUT s]): suites that launch kernels,
# which no CPU test double can run; registered under label gpu only, skipping cleanly
# without a device.
function(stash_add_gpu_test target)
  cmake_parse_arguments(ARG "" "TIMEOUT" "LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${target}.gpu COMMAND ${target})
  set_tests_properties(${target}.gpu PROPERTIES
    LABELS "gpu;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "STASH_TEST_RUNTIME=real"
    SKIP_REGULAR_EXPRESSION "${STASH_SKIP_REGEX}")
endfunction()
