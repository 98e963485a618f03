# check_layering.cmake: every #include in the product folders points down the layering.
#   cmake -DROOT=<source tree> -P check_layering.cmake
# Exit 0 when every include is allowed, 1 with each upward one listed as
#   <file>:<line>: #include "<name>": <folder>/ may include <allowed>, not <target>/
#
# Note [The layering]
# ~~~~~~~~~~~~~~~~~~~
# The folders, bottom first (CONTRIBUTING.md, the folder rule); each may include itself and
# the folders named after it here, and nothing else:
#   core/       nothing: the error model, byte and budget syntax, json_file, stats
#   planner/    core/                   (pure C++, no CUDA)
#   allocator/  core/                   (CUDA; it never includes the planner)
#   runtime/    core/ planner/ allocator/
#   kernels/    core/ planner/ allocator/ runtime/
#   bindings/   core/ ... kernels/
#   tools/      core/ ... bindings/
#   tests/      anything (not scanned; a product file that includes a test file is upward)
# planner/ and allocator/ are siblings over core/, not a chain: the planner is pure C++ and
# may not include the CUDA layer, and the allocator may not include the planner. A linear
# order would allow one of the two.
# Inside planner/, its rooms are layers of their own, bottom first:
#   planner/model/      core/                        (profile, plan, cost model, schedule,
#                                                    analytic profiles, trace format)
#   planner/solvers/    core/ planner/model/         (LP, greedy/ILP, MIP, make_plan, pareto)
#   planner/simulator/  core/ planner/model/         (a sibling of solvers/: neither includes
#                                                    the other)
#   planner/plots/      core/ planner/model/ planner/solvers/ planner/simulator/
# A folder above planner/ may include any of them ("planner/" stands for all four). A file's
# layer is the longest of these folders its path starts with.
#
# How an include is resolved, as the compiler's quoted search would find it:
#  1. relative to the including file's folder, when that file exists ("../x.h", a
#     neighbour "block_map.h"): the folder it lies in;
#  2. else a name whose first component is a folder above ("planner/model/plan.h"): that
#     folder (its layer: planner/model/);
#  3. else (a bare "cuda_prim.h" found through a target's include directories) every
#     folder holding a file whose path ends with that name; the include is upward only
#     when none of them is allowed (the build's include path picks one, this script cannot
#     know which). A name held by no folder (a system or generated header) is not checked.
# Angle-bracket includes are checked by rule 2 only: <nlohmann/json.hpp> names no folder.
# Lines are matched where the directive starts them; a commented-out include is skipped.
cmake_minimum_required(VERSION 3.24)

if(NOT DEFINED ROOT OR NOT IS_DIRECTORY "${ROOT}")
  message(FATAL_ERROR "usage: cmake -DROOT=<source tree> -P check_layering.cmake")
endif()
file(REAL_PATH "${ROOT}" root)

# Note [The layering]: the folders bottom first, and what each may include.
set(folders core planner allocator runtime kernels bindings tools tests)
# The layers: the folders and planner/'s rooms, longest first for layer_of.
set(layers planner/model planner/solvers planner/simulator planner/plots ${folders})
set(allowed_core "")
set(allowed_planner core)
set(allowed_planner/model core)
set(allowed_planner/solvers core planner/model)
set(allowed_planner/simulator core planner/model)
set(allowed_planner/plots core planner/model planner/solvers planner/simulator)
set(allowed_allocator core)
set(allowed_runtime core planner allocator)
set(allowed_kernels core planner allocator runtime)
set(allowed_bindings core planner allocator runtime kernels)
set(allowed_tools core planner allocator runtime kernels bindings)
set(scanned core planner allocator runtime kernels bindings tools)
set(source_globs *.h *.hpp *.hh *.inl *.c *.cc *.cpp *.cu *.cuh)

# Index every source file of every folder by its file name, for rule 3.
set(all_names "")
foreach(folder IN LISTS folders)
  if(NOT IS_DIRECTORY "${root}/${folder}")
    continue()
  endif()
  set(globs "")
  foreach(g IN LISTS source_globs)
    list(APPEND globs "${root}/${folder}/${g}")
  endforeach()
  file(GLOB_RECURSE files RELATIVE "${root}" ${globs})
  set(files_${folder} ${files})
  foreach(f IN LISTS files)
    get_filename_component(name "${f}" NAME)
    list(APPEND by_name_${name} "${f}")
  endforeach()
endforeach()

# first_component(<var> <path>): the path's first component, "" for a bare name.
function(first_component var path)
  string(FIND "${path}" "/" slash)
  if(slash LESS 1)
    set(${var} "" PARENT_SCOPE)
  else()
    string(SUBSTRING "${path}" 0 ${slash} head)
    set(${var} "${head}" PARENT_SCOPE)
  endif()
endfunction()

# layer_of(<var> <path>): the layer a path relative to the root lies in, "" for none.
function(layer_of var path)
  foreach(layer IN LISTS layers)
    string(LENGTH "${layer}/" n)
    string(LENGTH "${path}" m)
    if(m GREATER n OR m EQUAL n)
      string(SUBSTRING "${path}" 0 ${n} head)
      if(head STREQUAL "${layer}/")
        set(${var} "${layer}" PARENT_SCOPE)
        return()
      endif()
    endif()
  endforeach()
  set(${var} "" PARENT_SCOPE)
endfunction()

# may_include(<var> <from layer> <to layer>): TRUE when the layering allows it: the same
# layer, one it names, or a room of a folder it names (planner/model/ for planner/).
function(may_include var from to)
  set(ok FALSE)
  if(to STREQUAL from)
    set(ok TRUE)
  endif()
  foreach(a IN LISTS allowed_${from})
    string(LENGTH "${a}/" n)
    string(LENGTH "${to}" m)
    if(to STREQUAL a)
      set(ok TRUE)
    elseif(m GREATER n)
      string(SUBSTRING "${to}" 0 ${n} head)
      if(head STREQUAL "${a}/")
        set(ok TRUE)
      endif()
    endif()
  endforeach()
  set(${var} ${ok} PARENT_SCOPE)
endfunction()

set(upward 0)
set(checked 0)
set(scanned_files 0)
set(report "")
foreach(folder IN LISTS scanned)
  foreach(f IN LISTS files_${folder})
    math(EXPR scanned_files "${scanned_files} + 1")
    layer_of(from "${f}")
    get_filename_component(dir "${root}/${f}" DIRECTORY)
    file(READ "${root}/${f}" text)
    if(NOT text MATCHES "#[ \t]*include")
      continue()
    endif()
    # One list element per line: the characters that CMake's lists treat specially
    # (; separates, [ ] group, \ escapes the next ;) are blanked first, so that every
    # newline, and only a newline, splits.
    string(REGEX REPLACE "[][;\\\\]" "_" text "${text}")
    string(REPLACE "\n" ";" lines "${text}")
    set(line_no 0)
    foreach(line IN LISTS lines)
      math(EXPR line_no "${line_no} + 1")
      if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\"")
        set(quoted TRUE)
      elseif(line MATCHES "^[ \t]*#[ \t]*include[ \t]*<([^>]+)>")
        set(quoted FALSE)
      else()
        continue()
      endif()
      set(name "${CMAKE_MATCH_1}")
      set(targets "")
      first_component(head "${name}")
      if(quoted AND EXISTS "${dir}/${name}")                                  # rule 1
        file(REAL_PATH "${dir}/${name}" target)
        file(RELATIVE_PATH rel "${root}" "${target}")
        layer_of(target_layer "${rel}")
        set(targets "${target_layer}")
      elseif(NOT head STREQUAL "" AND head IN_LIST folders)                   # rule 2
        layer_of(target_layer "${name}")
        set(targets "${target_layer}")
      elseif(quoted)                                                          # rule 3
        get_filename_component(base "${name}" NAME)
        foreach(candidate IN LISTS by_name_${base})
          string(LENGTH "${candidate}" n)
          string(LENGTH "/${name}" m)
          if(n GREATER_EQUAL m)
            math(EXPR start "${n} - ${m}")
            string(SUBSTRING "${candidate}" ${start} ${m} tail)
            if(tail STREQUAL "/${name}")
              layer_of(target_layer "${candidate}")
              list(APPEND targets "${target_layer}")
            endif()
          endif()
        endforeach()
        list(REMOVE_DUPLICATES targets)
      endif()
      if(NOT targets)
        continue()
      endif()
      math(EXPR checked "${checked} + 1")
      set(ok FALSE)
      foreach(t IN LISTS targets)
        may_include(this "${from}" "${t}")
        if(this)
          set(ok TRUE)
        endif()
      endforeach()
      if(NOT ok)
        math(EXPR upward "${upward} + 1")
        if(allowed_${from})
          string(REPLACE ";" "/ " may "${allowed_${from}}/")
        else()
          set(may "no other folder")
        endif()
        string(REPLACE ";" "/ or " found "${targets}")
        string(APPEND report
               "${f}:${line_no}: #include \"${name}\": ${from}/ may include ${may}, not ${found}/\n")
      endif()
    endforeach()
  endforeach()
endforeach()

message("${report}${scanned_files} files, ${checked} includes into the folders, ${upward} upward")
if(upward GREATER 0)
  message(FATAL_ERROR "includes point up the layering (Note [The layering] in "
                      "tests/layering/check_layering.cmake)")
endif()
