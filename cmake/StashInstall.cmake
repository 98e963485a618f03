# `cmake --install <build> --prefix <P>`: the C API, the LD_PRELOAD interposer, the PyTorch
# allocator, the CLI and the CMake package (find_package(stash), target stash::stash).
#
#   include/stash.h
#   lib/libstash.so  lib/libstash_preload.so  lib/libstash_torch.so
#   lib/libstash_inject.so             what `stash profile` injects (see below)
#   lib/cmake/stash/stashConfig.cmake, stashConfigVersion.cmake, stashTargets*.cmake
#   bin/stash
#   share/stash/profiles/*.json        the shipped profiles `stash demo` reads
#
# Components: runtime (the libraries, the CLI and its data) and development (the header
# and the CMake package). tests/install/ installs into a fresh prefix, builds a separate
# project against it and runs that on the CPU test double.
#
# Note [Installed RUNPATHs]
# ~~~~~~~~~~~~~~~~~~~~~~~~~
# Installed files carry only $ORIGIN-relative RUNPATHs, so that the prefix can be moved:
# $ORIGIN for the libraries (libstash.so next to its siblings), $ORIGIN/<bin to lib> for
# bin/stash (it needs libstash.so). The build tree's RUNPATHs (CUDA::cudart's folder of the
# toolkit, bindings/ for the CLI) are dropped on install (CMake's default without
# CMAKE_INSTALL_RPATH_USE_LINK_PATH): libcudart.so.13 and libcublas.so.13 are found by the
# loader (ld.so.conf, LD_LIBRARY_PATH), which is also what lets LD_LIBRARY_PATH put the
# test double, or the CUDA runtime of a user's own toolkit, in their place.
#
# The Python wheel installs the same two libraries differently (bindings/CMakeLists.txt,
# `if(SKBUILD)`: component python, into stash/lib/, with a RUNPATH to torch's CUDA wheels).
# Those target properties can have one value only, so under SKBUILD none of the rules here
# exist: the wheel holds exactly stash/lib/libstash.so and stash/lib/libstash_torch.so.
if(SKBUILD)
  return()
endif()

include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# bin/ to lib/ as a relative path: GNUInstallDirs' lib is lib64 or lib/<multiarch> on some
# systems. The CLI looks for the injection library there too (Note [Finding the injection
# library] in tools/cli/cmd_profile.cpp).
file(RELATIVE_PATH STASH_BIN_TO_LIB "/${CMAKE_INSTALL_BINDIR}" "/${CMAKE_INSTALL_LIBDIR}")
target_compile_definitions(stash PRIVATE STASH_BIN_TO_LIB="${STASH_BIN_TO_LIB}")

# Note [Installed RUNPATHs].
set_target_properties(libstash stash_preload stash_torch stash_inject PROPERTIES
  INSTALL_RPATH "$ORIGIN")
set_target_properties(stash PROPERTIES INSTALL_RPATH "$ORIGIN/${STASH_BIN_TO_LIB}")
# The target is `libstash` only because `stash` is the CLI's; consumers see stash::stash.
set_target_properties(libstash PROPERTIES EXPORT_NAME stash)

# libstash's static parts (allocator, planner, engine, measure) are linked PRIVATE into the
# shared library, so the export set holds libstash alone and the installed interface is
# the header folder and CUDA::cudart (Note [stash::stash carries the CUDA runtime] in
# stashConfig.cmake.in).
install(TARGETS libstash EXPORT stashTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS stash_preload stash_torch stash_inject
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
install(TARGETS stash RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
# Note [Finding the shipped profiles] in tools/demo/cli/cmd_demo.cpp: <exe dir>/../share/stash.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tools/demo/profiles/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/stash/profiles COMPONENT runtime
  FILES_MATCHING PATTERN "*.json")
install(FILES ${PROJECT_SOURCE_DIR}/bindings/include/stash.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)

set(STASH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/stash)
install(EXPORT stashTargets NAMESPACE stash:: DESTINATION ${STASH_CMAKE_DIR}
  COMPONENT development)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/stashConfig.cmake.in
  ${CMAKE_BINARY_DIR}/stashConfig.cmake INSTALL_DESTINATION ${STASH_CMAKE_DIR})
# find_package(stash 0.3) accepts 0.3 and any newer 0.x: a program may run against a newer
# libstash.so than its stash.h ("Versioned structs" in stash.h), never an older one.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/stashConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${CMAKE_BINARY_DIR}/stashConfig.cmake ${CMAKE_BINARY_DIR}/stashConfigVersion.cmake
  DESTINATION ${STASH_CMAKE_DIR} COMPONENT development)
