# install_test.cmake: the test install.consumer (tests/install/CMakeLists.txt).
#   1. cmake --install the build into a fresh prefix, WORK_DIR/prefix;
#   2. the prefix holds exactly the layout of cmake/StashInstall.cmake;
#   3. every RUNPATH there is $ORIGIN-relative (Note [Installed RUNPATHs]), and the CMake
#      package names neither the build nor the source tree;
#   4. consumer/ configured with CMAKE_PREFIX_PATH=prefix finds this very package, compiles
#      the README's example with the prefix's stash.h and links the prefix's libstash.so,
#      twice: once with CUDA::cudart named, once (app_stash_only) linking stash::stash alone
#      (Note [stash::stash carries the CUDA runtime] in cmake/stashConfig.cmake.in);
#   5. the example runs on the CPU test double and exits 0 (the double has a device, so its
#      77, "no device", is a failure here), and the installed CLI runs, from the prefix's
#      libstash.so, and finds its injection library.
# Any failed step fails the test.
cmake_minimum_required(VERSION 3.24)
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR CONSUMER_SOURCE EXAMPLE DOUBLE_DIR GENERATOR C_COMPILER
          VERSION BINDIR LIBDIR INCLUDEDIR DATADIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_test.cmake: -D${v}=... is missing")
  endif()
endforeach()
find_program(READELF readelf REQUIRED)
find_program(LDD ldd REQUIRED)
set(prefix ${WORK_DIR}/prefix)
set(consumer ${WORK_DIR}/consumer)

include(${CMAKE_CURRENT_LIST_DIR}/steps.cmake)

# --- 1. install ---------------------------------------------------------------------------
file(REMOVE_RECURSE ${prefix} ${consumer})
step("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})

# --- 2. the layout ------------------------------------------------------------------------
file(GLOB profiles RELATIVE ${SOURCE_DIR}/tools/demo/profiles ${SOURCE_DIR}/tools/demo/profiles/*.json)
list(TRANSFORM profiles PREPEND "${DATADIR}/stash/profiles/")
# GNUInstallDirs' folders: bin, include, lib (lib64 or lib/<multiarch> on some systems), share.
set(expected
  ${BINDIR}/stash
  ${INCLUDEDIR}/stash.h
  ${LIBDIR}/cmake/stash/stashConfig.cmake
  ${LIBDIR}/cmake/stash/stashConfigVersion.cmake
  ${LIBDIR}/cmake/stash/stashTargets.cmake
  ${LIBDIR}/libstash.so
  ${LIBDIR}/libstash_inject.so
  ${LIBDIR}/libstash_preload.so
  ${LIBDIR}/libstash_torch.so
  ${profiles})
file(GLOB_RECURSE installed LIST_DIRECTORIES false RELATIVE ${prefix} ${prefix}/*)
# The per-configuration half of the export (stashTargets-relwithdebinfo.cmake, ...).
list(FILTER installed EXCLUDE REGEX "/cmake/stash/stashTargets-[a-z]+\\.cmake$")
list(SORT installed)
list(SORT expected)
if(NOT installed STREQUAL expected)
  set(extra ${installed})
  list(REMOVE_ITEM extra ${expected})
  set(missing ${expected})
  list(REMOVE_ITEM missing ${installed})
  message(FATAL_ERROR "install test: the prefix's layout differs from cmake/StashInstall.cmake's"
                      "\n  missing: ${missing}\n  unexpected: ${extra}")
endif()
file(GLOB per_config ${prefix}/${LIBDIR}/cmake/stash/stashTargets-*.cmake)
if(NOT per_config)
  message(FATAL_ERROR "install test: no ${LIBDIR}/cmake/stash/stashTargets-<config>.cmake")
endif()
message(STATUS "install test: layout as expected (${prefix})")

# --- 3. RUNPATHs and the package ----------------------------------------------------------
foreach(f ${LIBDIR}/libstash.so ${LIBDIR}/libstash_preload.so ${LIBDIR}/libstash_torch.so
          ${LIBDIR}/libstash_inject.so ${BINDIR}/stash)
  capture(dyn ${READELF} -d ${prefix}/${f})
  if(NOT dyn MATCHES "\\(RUNPATH\\)[^\n]*\\[([^]\n]*)\\]")
    message(FATAL_ERROR "install test: ${f} has no RUNPATH (RPATH instead?):\n${dyn}")
  endif()
  set(runpath "${CMAKE_MATCH_1}")
  string(REPLACE ":" ";" entries "${runpath}")
  foreach(e IN LISTS entries)
    if(NOT e MATCHES "^\\$ORIGIN(/|$)")
      message(FATAL_ERROR "install test: ${f}'s RUNPATH ${runpath} has ${e}, not relative to "
                          "$ORIGIN (Note [Installed RUNPATHs])")
    endif()
  endforeach()
  if(f STREQUAL "${LIBDIR}/libstash.so" AND NOT "$ORIGIN" IN_LIST entries)
    message(FATAL_ERROR "install test: libstash.so's RUNPATH ${runpath} lacks $ORIGIN")
  endif()
  message(STATUS "install test: ${f}: RUNPATH ${runpath}")
endforeach()
file(GLOB package_files ${prefix}/${LIBDIR}/cmake/stash/*.cmake)
foreach(f IN LISTS package_files)
  file(READ ${f} text)
  foreach(tree ${BUILD_DIR} ${SOURCE_DIR})
    string(FIND "${text}" "${tree}" at)
    if(NOT at EQUAL -1)
      message(FATAL_ERROR "install test: ${f} names ${tree}; the package must be relocatable")
    endif()
  endforeach()
endforeach()

# --- 4. a separate project against the prefix ----------------------------------------------
set(configure ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${consumer} -G ${GENERATOR}
    -DCMAKE_C_COMPILER=${C_COMPILER} -DCMAKE_PREFIX_PATH=${prefix}
    -DSTASH_EXAMPLE=${EXAMPLE} -DCMAKE_EXPORT_COMPILE_COMMANDS=ON)
if(BUILD_TYPE)
  list(APPEND configure -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
endif()
if(CUDA_ROOT)
  list(APPEND configure -DCUDAToolkit_ROOT=${CUDA_ROOT})
endif()
step("configure consumer/ with CMAKE_PREFIX_PATH=${prefix}" ${configure})
file(STRINGS ${consumer}/CMakeCache.txt stash_dir REGEX "^stash_DIR:")
if(NOT stash_dir STREQUAL "stash_DIR:PATH=${prefix}/${LIBDIR}/cmake/stash")
  message(FATAL_ERROR "install test: consumer/ found another stash package: ${stash_dir}")
endif()
step("build consumer/" ${CMAKE_COMMAND} --build ${consumer})
# stash.h from the prefix (example.c's own folder, tests/bindings, has none, and neither has
# the toolkit's include folder).
file(READ ${consumer}/compile_commands.json commands)
string(FIND "${commands}" "${prefix}/${INCLUDEDIR}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "install test: example.c was not compiled with ${prefix}/${INCLUDEDIR}:\n${commands}")
endif()

# --- 5. run on the CPU test double ----------------------------------------------------------
# The double first, as stash_add_runtime_test's .cpu variants do; the toolkit's folder after
# it for what the double does not replace (the CLI's libcublas.so.13), as a user's
# environment would provide it: the installed RUNPATHs do not (Note [Installed RUNPATHs]).
set(ld_path ${DOUBLE_DIR})
if(CUDA_LIBRARY_DIR)
  string(APPEND ld_path ":${CUDA_LIBRARY_DIR}")
endif()
set(env ${CMAKE_COMMAND} -E env --unset=STASH_INJECT_LIBRARY LD_LIBRARY_PATH=${ld_path})
# expect_loads(<binary> <soname> <file>): ldd resolves <soname> of <binary> to <file>.
function(expect_loads bin soname file)
  capture(libs ${env} ${LDD} ${bin})
  string(REPLACE "." "\\." so_re "${soname}")
  set(found "")
  if(libs MATCHES "[\t ]${so_re} => ([^ \n]+)")
    get_filename_component(found "${CMAKE_MATCH_1}" REALPATH)
  endif()
  get_filename_component(want "${file}" REALPATH)
  if(NOT found STREQUAL want)
    message(FATAL_ERROR "install test: ${bin} loads ${soname} from '${found}', not ${want}:\n${libs}")
  endif()
endfunction()
foreach(bin ${consumer}/app ${consumer}/app_stash_only ${prefix}/${BINDIR}/stash)
  expect_loads(${bin} libstash.so ${prefix}/${LIBDIR}/libstash.so)
  expect_loads(${bin} libcudart.so.13 ${DOUBLE_DIR}/libcudart.so.13)
endforeach()
# Linked shared, never the static runtime: the program's libcudart is libstash.so's.
capture(dyn ${READELF} -d ${consumer}/app_stash_only)
if(NOT dyn MATCHES "\\(NEEDED\\)[^\n]*\\[libcudart\\.so\\.13\\]")
  message(FATAL_ERROR "install test: app_stash_only does not need libcudart.so.13:\n${dyn}")
endif()

foreach(app app app_stash_only)
  message(STATUS "install test: run the example (${app}) on the CPU test double")
  execute_process(COMMAND ${env} ${consumer}/${app} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  message("${out}")
  if(rc EQUAL 77)
    message(FATAL_ERROR "install test: ${app} found no device (77), but the test double "
                        "has one: it did not load ${DOUBLE_DIR}/libcudart.so.13")
  elseif(NOT rc EQUAL 0)
    message(FATAL_ERROR "install test: ${app} failed (${rc})")
  endif()
  if(NOT out MATCHES "^stash ${VERSION}: [0-9]+ bytes pinned")
    message(FATAL_ERROR "install test: ${app}'s output is not its report line")
  endif()
endforeach()

capture(out ${env} ${prefix}/${BINDIR}/stash --version)
if(NOT out MATCHES "^stash ${VERSION}")
  message(FATAL_ERROR "install test: stash --version printed: ${out}")
endif()
# `stash profile` without CUPTI still runs the command and says why it did not profile; the
# reason must not be a missing injection library (Note [Finding the injection library]).
execute_process(COMMAND ${env} ${prefix}/${BINDIR}/stash profile -o ${consumer}/profile.json --
                        ${CMAKE_COMMAND} -E true
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(out MATCHES "libstash_inject\\.so not found")
  message(FATAL_ERROR "install test: stash does not find ${prefix}/${LIBDIR}/libstash_inject.so")
endif()
message(STATUS "install test: passed")
