# Builds and runs tests/consumer against pactrain, the way a downstream project would.
#
#   cmake -DMODE=package|subdirectory -DPACTRAIN_SOURCE_DIR=<src> -DPACTRAIN_BINARY_DIR=<build>
#         -DWORK_DIR=<scratch dir> -DEXPECTED_VERSION=<x.y.z> [-DWITH_MPI=ON|OFF]
#         [-DGENERATOR=<gen>] [-DCONFIG=<cfg>] [-DCXX_COMPILER=<c++>] [-DC_COMPILER=<cc>]
#         [-DWITH_NCCL=ON|OFF] [-DMPIEXEC=<mpiexec>] [-DMPIEXEC_FLAGS=<flag|flag...>] -P run_consumer.cmake
#
# package:      installs <build> into a fresh prefix under WORK_DIR, then the consumer uses
#               find_package(pactrain CONFIG REQUIRED COMPONENTS mpi); also checks that an
#               unknown component is rejected.
# subdirectory: the consumer add_subdirectory()s the source tree.
# Registered by tests/CMakeLists.txt as ctest tests consumer_package and consumer_subdirectory.

cmake_minimum_required(VERSION 3.25)

foreach(var MODE PACTRAIN_SOURCE_DIR PACTRAIN_BINARY_DIR WORK_DIR EXPECTED_VERSION)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED WITH_MPI)
  set(WITH_MPI ON)
endif()

# run(<description> <command>...): runs a command, fails the test with its output on error.
function(run description)
  execute_process(COMMAND ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "consumer ${MODE}: ${description} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

set(consumer_source "${CMAKE_CURRENT_LIST_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(configure_args)
if(GENERATOR)
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(C_COMPILER)
  list(APPEND configure_args "-DCMAKE_C_COMPILER=${C_COMPILER}")
endif()
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
if(WITH_MPI)
  list(APPEND configure_args -DPACTRAIN_CONSUMER_MPI=ON)
else()
  list(APPEND configure_args -DPACTRAIN_CONSUMER_MPI=OFF)
endif()
set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()

if(MODE STREQUAL "package")
  run("install into ${prefix}"
    "${CMAKE_COMMAND}" --install "${PACTRAIN_BINARY_DIR}" --prefix "${prefix}" ${config_args})
  list(APPEND configure_args -DPACTRAIN_CONSUME=package "-DCMAKE_PREFIX_PATH=${prefix}"
    # Only the fresh prefix may satisfy find_package(pactrain): not a user package registry,
    # not a system-wide install.
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
    -Dpactrain_ROOT=${prefix})

  # An unknown component must make find_package fail with a message.
  set(probe "${WORK_DIR}/unknown_component")
  file(WRITE "${probe}/CMakeLists.txt"
"cmake_minimum_required(VERSION 3.25)
project(pactrain_component_probe LANGUAGES CXX)
find_package(pactrain CONFIG COMPONENTS no_such_component)
if(pactrain_FOUND)
  message(FATAL_ERROR \"find_package(pactrain COMPONENTS no_such_component) succeeded\")
endif()
if(NOT pactrain_NOT_FOUND_MESSAGE MATCHES \"no_such_component\")
  message(FATAL_ERROR \"no message names the unknown component: '\${pactrain_NOT_FOUND_MESSAGE}'\")
endif()
")
  run("probe with an unknown component"
    "${CMAKE_COMMAND}" -S "${probe}" -B "${probe}/build" ${configure_args})

  # With CUDA and NCCL: COMPONENTS nccl gives pactrain::cuda and pactrain::nccl to a host
  # (C++ only) project, and a host source can include <pactrain/cuda/nccl.hpp>.
  if(WITH_NCCL)
    set(probe "${WORK_DIR}/nccl_component")
    file(WRITE "${probe}/probe.cpp" "#include <pactrain/cuda/nccl.hpp>\nint main() { return 0; }\n")
    file(WRITE "${probe}/CMakeLists.txt"
"cmake_minimum_required(VERSION 3.25)
project(pactrain_nccl_probe LANGUAGES CXX)
find_package(pactrain CONFIG REQUIRED COMPONENTS nccl)
if(NOT pactrain_cuda_FOUND OR NOT pactrain_nccl_FOUND OR NOT TARGET pactrain::cuda
   OR NOT TARGET pactrain::nccl)
  message(FATAL_ERROR \"COMPONENTS nccl did not provide pactrain::cuda and pactrain::nccl\")
endif()
add_library(probe OBJECT probe.cpp)
target_link_libraries(probe PRIVATE pactrain::nccl)
")
    run("probe with COMPONENTS nccl"
      "${CMAKE_COMMAND}" -S "${probe}" -B "${probe}/build" ${configure_args})
    run("build the nccl probe" "${CMAKE_COMMAND}" --build "${probe}/build" ${config_args})
  endif()
elseif(MODE STREQUAL "subdirectory")
  # The core's targets are what this mode checks. Without CUDA and LibTorch the configure
  # takes 3 s instead of 20 (most of it nvcc's identification); the package mode covers the
  # CUDA components.
  list(APPEND configure_args -DPACTRAIN_CONSUME=subdirectory
    "-DPACTRAIN_SOURCE_DIR=${PACTRAIN_SOURCE_DIR}" -DPACTRAIN_ENABLE_CUDA=OFF
    -DPACTRAIN_WITH_TORCH=OFF)
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be package or subdirectory, not '${MODE}'")
endif()

run("configure" "${CMAKE_COMMAND}" -S "${consumer_source}" -B "${build}" ${configure_args})
run("build" "${CMAKE_COMMAND}" --build "${build}" ${config_args})

# Find the executable (multi-config generators put it in a per-config folder).
file(GLOB_RECURSE exe LIST_DIRECTORIES false
  "${build}/pactrain_consumer" "${build}/pactrain_consumer.exe")
list(FILTER exe EXCLUDE REGEX "/CMakeFiles/")
list(GET exe 0 exe)
if(NOT EXISTS "${exe}")
  message(FATAL_ERROR "consumer ${MODE}: built executable not found under ${build}")
endif()

if(WITH_MPI AND MPIEXEC)
  string(REPLACE "|" ";" mpiexec_flags "${MPIEXEC_FLAGS}")
  run("run" "${MPIEXEC}" -n 1 ${mpiexec_flags} "${exe}")
else()
  run("run" "${exe}")
endif()

if(NOT last_output MATCHES "version ${EXPECTED_VERSION},.* syncs ok")
  message(FATAL_ERROR
    "consumer ${MODE}: expected version ${EXPECTED_VERSION}, program printed:\n${last_output}")
endif()
message(STATUS "consumer ${MODE}: ${last_output}")
