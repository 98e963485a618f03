# planted_tree.cmake: check_layering.cmake must fail on a tree with upward includes, and
# name each one. It writes a small tree (every folder of Note [The layering] in
# check_layering.cmake, one upward include per rule of resolution, allowed includes beside
# them), runs the checker on it and fails unless the checker fails with exactly the
# planted lines.
#   cmake -DCHECKER=<check_layering.cmake> -DWORK_DIR=<scratch folder> -P planted_tree.cmake
cmake_minimum_required(VERSION 3.24)

set(tree "${WORK_DIR}/planted")
file(REMOVE_RECURSE "${tree}")
# plant(<path> <line>...): a file of those lines.
function(plant path)
  string(REPLACE ";" "\n" text "${ARGN}")
  file(WRITE "${tree}/${path}" "${text}\n")
endfunction()

# Allowed: core/ includes itself, planner/ and allocator/ include core/, tools/ includes
# runtime/ through angle brackets, tests/ includes anything, a neighbour by its bare name,
# a commented-out include, a system header.
plant(core/error.h "#pragma once" "#include <string>")
plant(core/bytes.cpp "#include \"core/error.h\"")
plant(planner/x.h "#pragma once" "#include \"core/error.h\"")
plant(planner/model/profile.h "#pragma once")
plant(allocator/cuda_prim.h "#pragma once" "#include \"core/error.h\"")
plant(runtime/engine/e.h "#pragma once" "#include \"planner/x.h\"" "#include \"cuda_prim.h\"")
plant(tools/cli/command.h "#pragma once" "#include <runtime/engine/e.h>")
plant(tests/common/test_paths.h "#pragma once" "#include \"tools/cli/command.h\"")
# planner/'s rooms: solvers/ and simulator/ over model/, plots/ over all three, and a folder
# above planner/ (runtime/) reaching any room.
plant(planner/model/plan.h "#pragma once" "#include \"profile.h\"" "#include \"core/error.h\"")
plant(planner/solvers/lp.h "#pragma once" "#include \"planner/model/plan.h\"")
plant(planner/simulator/sim.h "#pragma once" "#include \"planner/model/plan.h\"")
plant(planner/plots/svg.cpp "#include \"planner/solvers/lp.h\"" "#include \"../simulator/sim.h\"")
plant(runtime/engine/uses_planner.cpp "#include \"planner/solvers/lp.h\"" "#include \"planner/simulator/sim.h\"")
# Upward, one per rule: a folder-qualified name (rule 2) from core/ and a bare name found
# through an include directory (rule 3) each way between the sibling planner/ and
# allocator/, a relative path (rule 1), and a product file reaching into tests/.
plant(core/bad.h "#pragma once" "" "#include \"planner/x.h\"")
plant(planner/uses_cuda.cpp "#include \"x.h\"" "#include \"cuda_prim.h\"")
plant(allocator/pool.cpp "#include \"cuda_prim.h\"" "// #include \"planner/x.h\""
      "  #  include \"profile.h\"")
plant(runtime/engine/e.cpp "#include \"e.h\"" "#include \"../../tools/cli/command.h\"")
plant(kernels/k.cu "#include \"test_paths.h\"")
# Upward inside planner/: a room including its sibling (rule 2), model/ including a room
# above it by a relative path (rule 1) and by a bare name (rule 3), and a room reaching the
# CUDA layer.
plant(planner/simulator/sim.cpp "#include \"sim.h\"" "#include \"planner/solvers/lp.h\"")
plant(planner/model/plan.cpp "#include \"plan.h\"" "#include \"../plots/svg.h\"" "#include \"lp.h\"")
plant(planner/plots/svg.h "#pragma once")
plant(planner/solvers/lp.cpp "#include \"lp.h\"" "#include \"allocator/cuda_prim.h\"")

execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${tree} -P ${CHECKER}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message("${out}")
if(rc EQUAL 0)
  message(FATAL_ERROR "check_layering.cmake passed a tree with upward includes")
endif()
set(expected
  "core/bad.h:3: #include \"planner/x.h\": core/ may include no other folder, not planner/"
  "planner/uses_cuda.cpp:2: #include \"cuda_prim.h\": planner/ may include core/, not allocator/"
  "allocator/pool.cpp:3: #include \"profile.h\": allocator/ may include core/, not planner/model/"
  "runtime/engine/e.cpp:2: #include \"../../tools/cli/command.h\": runtime/ may include core/ planner/ allocator/, not tools/"
  "kernels/k.cu:1: #include \"test_paths.h\": kernels/ may include core/ planner/ allocator/ runtime/, not tests/"
  "planner/simulator/sim.cpp:2: #include \"planner/solvers/lp.h\": planner/simulator/ may include core/ planner/model/, not planner/solvers/"
  "planner/model/plan.cpp:2: #include \"../plots/svg.h\": planner/model/ may include core/, not planner/plots/"
  "planner/model/plan.cpp:3: #include \"lp.h\": planner/model/ may include core/, not planner/solvers/"
  "planner/solvers/lp.cpp:2: #include \"allocator/cuda_prim.h\": planner/solvers/ may include core/ planner/model/, not allocator/"
  ", 9 upward")
foreach(line IN LISTS expected)
  string(FIND "${out}" "${line}" at)
  if(at LESS 0)
    message(FATAL_ERROR "check_layering.cmake did not report: ${line}")
  endif()
endforeach()
message("planted tree: the 9 upward includes reported, nothing else")
