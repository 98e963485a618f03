# steps.cmake: the two helpers of the install tests' scripts (install_test.cmake,
# installed_tests.cmake), each naming the script in its messages.
get_filename_component(stash_script ${CMAKE_SCRIPT_MODE_FILE} NAME)

# step(<what> COMMAND...): runs it, its output into the test's; stops the test on failure.
function(step what)
  message(STATUS "${stash_script}: ${what}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc COMMAND_ECHO STDOUT)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${stash_script}: ${what} failed (${rc})")
  endif()
endfunction()

# capture(<out> COMMAND...): like step, with the output in <out>.
function(capture out)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE o)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${stash_script}: ${ARGN} failed (${rc}):\n${o}")
  endif()
  set(${out} "${o}" PARENT_SCOPE)
endfunction()
