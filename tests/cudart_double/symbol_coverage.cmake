# symbol_coverage.cmake: every cuda*/__cuda* symbol that a cpu-labelled binary imports
# from libcudart.so.13 must be exported by the test double under that version node;
# otherwise the .cpu run of that binary would fail to load (or bind lazily and abort).
# Also checks that the double exports nothing but cuda*, __cuda* and stashdbl_* names.
#
#   cmake -DBUILD_DIR=<build> -DDOUBLE=<libcudart.so.13 of the double> -DCTEST=<ctest>
#         [-DBINARIES=<file;file...>] -P symbol_coverage.cmake
#
# Binaries checked: the executables of the tests labelled cpu (from `ctest --show-only`)
# that need libcudart.so.13, plus the shared libraries of this build tree they need
# (transitively) that need it. BINARIES replaces that list (to test the script by hand).
cmake_minimum_required(VERSION 3.19)

find_program(NM nm REQUIRED)
find_program(READELF readelf REQUIRED)

# Sets <out> to the NEEDED sonames of an ELF file (empty when not ELF).
function(elf_needed file out)
  execute_process(COMMAND ${READELF} -d ${file} OUTPUT_VARIABLE o ERROR_QUIET
                  RESULT_VARIABLE rc)
  set(needed "")
  if(rc EQUAL 0)
    string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*\\[[^]\n]+\\]" lines "${o}")
    foreach(l IN LISTS lines)
      string(REGEX REPLACE ".*\\[([^]]+)\\]" "\\1" so "${l}")
      list(APPEND needed ${so})
    endforeach()
  endif()
  set(${out} "${needed}" PARENT_SCOPE)
endfunction()

function(elf_soname file out)
  execute_process(COMMAND ${READELF} -d ${file} OUTPUT_VARIABLE o ERROR_QUIET)
  set(so "")
  if(o MATCHES "\\(SONAME\\)[^\n]*\\[([^]\n]+)\\]")
    set(so ${CMAKE_MATCH_1})
  endif()
  set(${out} "${so}" PARENT_SCOPE)
endfunction()

# --- what the double exports ------------------------------------------------------------
execute_process(COMMAND ${NM} -D --defined-only ${DOUBLE} OUTPUT_VARIABLE exports_raw
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cannot read the double's symbols: ${DOUBLE}")
endif()
string(REGEX MATCHALL "[ \t](cuda|__cuda)[A-Za-z0-9_]*@@libcudart\\.so\\.13" exports "${exports_raw}")
list(TRANSFORM exports REPLACE "^[ \t]([^@]+)@@.*" "\\1")
list(LENGTH exports n_exports)
if(n_exports EQUAL 0)
  message(FATAL_ERROR "the double exports no cuda* symbol under libcudart.so.13: ${DOUBLE}")
endif()
# And nothing else: every other defined dynamic symbol is the version node itself.
string(REGEX MATCHALL "[^\n]+" export_lines "${exports_raw}")
foreach(line IN LISTS export_lines)
  if(NOT line MATCHES "[ \t](cuda|__cuda|stashdbl_)[A-Za-z0-9_]*@@libcudart\\.so\\.13$" AND
     NOT line MATCHES "[ \t]libcudart\\.so\\.13$")
    message(SEND_ERROR "the double exports more than the runtime's names: ${line}")
    set(leaked TRUE)
  endif()
endforeach()
if(leaked)
  message(FATAL_ERROR "fix the version script or visibility of ${DOUBLE}")
endif()

# --- which binaries ---------------------------------------------------------------------
if(NOT BINARIES)
  execute_process(COMMAND ${CTEST} --show-only=json-v1 -L cpu
                  WORKING_DIRECTORY ${BUILD_DIR} OUTPUT_VARIABLE json RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctest --show-only failed in ${BUILD_DIR}")
  endif()
  string(JSON n_tests LENGTH "${json}" tests)
  set(executables "")
  if(n_tests GREATER 0)
    math(EXPR last "${n_tests} - 1")
    foreach(i RANGE ${last})
      string(JSON cmd ERROR_VARIABLE err GET "${json}" tests ${i} command 0)
      if(NOT err AND EXISTS "${cmd}")
        list(APPEND executables "${cmd}")
      endif()
    endforeach()
  endif()
  list(REMOVE_DUPLICATES executables)

  # Shared libraries built here, by soname (the double's own directory excluded).
  file(GLOB_RECURSE libs LIST_DIRECTORIES false "${BUILD_DIR}/*.so" "${BUILD_DIR}/*.so.*")
  get_filename_component(double_dir ${DOUBLE} DIRECTORY)
  foreach(lib IN LISTS libs)
    get_filename_component(dir ${lib} DIRECTORY)
    if(dir STREQUAL double_dir OR IS_SYMLINK ${lib})
      continue()
    endif()
    elf_soname(${lib} so)
    if(so)
      set(lib_by_soname_${so} ${lib})
    endif()
  endforeach()

  # Walk NEEDED edges from the executables through libraries of this build.
  set(queue ${executables})
  set(seen "")
  set(BINARIES "")
  while(queue)
    list(POP_FRONT queue file)
    if(file IN_LIST seen)
      continue()
    endif()
    list(APPEND seen ${file})
    elf_needed(${file} needed)
    if("libcudart.so.13" IN_LIST needed)
      list(APPEND BINARIES ${file})
    endif()
    foreach(so IN LISTS needed)
      if(DEFINED lib_by_soname_${so})
        list(APPEND queue ${lib_by_soname_${so}})
      endif()
    endforeach()
  endwhile()
endif()

list(LENGTH BINARIES n_binaries)
if(n_binaries EQUAL 0)
  message(FATAL_ERROR "no cpu-labelled binary that needs libcudart.so.13 was found in "
                      "${BUILD_DIR}; the discovery is broken")
endif()

# --- check each ---------------------------------------------------------------------------
set(failed FALSE)
foreach(bin IN LISTS BINARIES)
  execute_process(COMMAND ${NM} -D --undefined-only ${bin} OUTPUT_VARIABLE imports_raw
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "cannot read the symbols of ${bin}")
    set(failed TRUE)
    continue()
  endif()
  # Versioned imports from libcudart.so.13, and unversioned cuda* ones.
  string(REGEX MATCHALL "[ \t](cuda|__cuda)[A-Za-z0-9_]*(@libcudart\\.so\\.13)?\n" imports
         "${imports_raw}\n")
  list(TRANSFORM imports REPLACE "^[ \t]([^@\n]+).*" "\\1")
  list(REMOVE_DUPLICATES imports)
  set(missing "")
  foreach(sym IN LISTS imports)
    if(NOT sym IN_LIST exports)
      list(APPEND missing ${sym})
    endif()
  endforeach()
  list(LENGTH imports n_imports)
  if(missing)
    list(JOIN missing " " missing_text)
    message(SEND_ERROR "${bin}: the double lacks ${missing_text}")
    set(failed TRUE)
  else()
    message(STATUS "ok: ${bin} (${n_imports} runtime symbols)")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "the test double of libcudart.so.13 (${DOUBLE}) does not export every "
                      "runtime symbol that cpu-labelled binaries import")
endif()
message(STATUS "all ${n_binaries} binaries covered by the ${n_exports} symbols of the double")
