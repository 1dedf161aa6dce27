# Build settings for pactrain's own tests, examples and benchmarks. They travel through the
# non-installed INTERFACE target pactrain_project_options, which those targets link PRIVATE:
# consumers of pactrain::pactrain never see these flags.

include_guard(GLOBAL)

add_library(pactrain_project_options INTERFACE)

if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  # Host flags apply to C++ sources only; nvcc-compiled sources get theirs below.
  target_compile_options(pactrain_project_options INTERFACE
    "$<$<COMPILE_LANGUAGE:CXX>:-Wall;-Wextra;-Wpedantic>"
    # Results that must match bit for bit across builds and translation units: no implicit
    # fused multiply-adds.
    "$<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>")
  if(PACTRAIN_WERROR)
    target_compile_options(pactrain_project_options INTERFACE "$<$<COMPILE_LANGUAGE:CXX>:-Werror>")
  endif()
  if(PACTRAIN_SANITIZE)
    set(_pactrain_sanitize_flags
      -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
    target_compile_options(pactrain_project_options INTERFACE
      "$<$<COMPILE_LANGUAGE:CXX>:${_pactrain_sanitize_flags}>")
    target_link_options(pactrain_project_options INTERFACE
      "$<$<LINK_LANGUAGE:CXX>:${_pactrain_sanitize_flags}>")
    unset(_pactrain_sanitize_flags)
  endif()
elseif(MSVC)
  target_compile_options(pactrain_project_options INTERFACE /W4 /permissive-)
  if(PACTRAIN_WERROR)
    target_compile_options(pactrain_project_options INTERFACE /WX)
  endif()
  if(PACTRAIN_SANITIZE)
    message(WARNING "PACTRAIN_SANITIZE is only implemented for GCC and Clang")
  endif()
endif()

# nvcc-compiled sources: nvcc's own warnings, and the host compiler's through -Xcompiler
# (-Wpedantic is left out: nvcc's generated host code uses GCC line directives).
if(PACTRAIN_ENABLE_CUDA)
  target_compile_options(pactrain_project_options INTERFACE
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-ffp-contract=off>")
  if(PACTRAIN_WERROR)
    target_compile_options(pactrain_project_options INTERFACE
      "$<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings;-Xcompiler=-Werror>")
  endif()
endif()

# pactrain_target_defaults(<target>): applies the settings above to one of pactrain's own
# targets.
function(pactrain_target_defaults target)
  target_link_libraries(${target} PRIVATE pactrain_project_options)
endfunction()

# pactrain_use_torch_pch(<target>): <target>, which links pactrain::torch, reuses one
# precompiled <torch/torch.h>. Parsing LibTorch's headers is most of the 30-40 s each such
# translation unit costs on 2 cores; GCC takes the header built at -O3 in the tests' -O2
# builds too, and a translation unit whose options do not fit it compiles without it.
function(pactrain_use_torch_pch target)
  if(NOT TARGET pactrain_torch_pch)
    add_library(pactrain_torch_pch OBJECT "${PROJECT_SOURCE_DIR}/cmake/torch_pch.cpp")
    target_link_libraries(pactrain_torch_pch PRIVATE pactrain::mpi pactrain::torch)
    pactrain_target_defaults(pactrain_torch_pch)
    target_precompile_headers(pactrain_torch_pch PRIVATE <torch/torch.h>)
  endif()
  target_precompile_headers(${target} REUSE_FROM pactrain_torch_pch)
endfunction()

# pactrain_add_program(<target> SOURCES <file>... [MPI] [TORCH_PCH] [LIBRARIES <lib>...]): an
# example or benchmark executable written to the current binary directory; TORCH_PCH for a
# LibTorch program whose options fit the shared precompiled header (pactrain_use_torch_pch).
# It is skipped (and <target>_ADDED set to FALSE in the caller) when a source does not exist
# yet or when it needs MPI and PACTRAIN_WITH_MPI is OFF, so the tree builds at every stage.
function(pactrain_add_program target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "MPI;TORCH_PCH" "" "SOURCES;LIBRARIES")
  set(${target}_ADDED FALSE PARENT_SCOPE)
  foreach(source IN LISTS arg_SOURCES)
    if(NOT EXISTS "${CMAKE_CURRENT_SOURCE_DIR}/${source}")
      return()
    endif()
  endforeach()
  if(arg_MPI AND NOT PACTRAIN_WITH_MPI)
    message(STATUS "pactrain: ${target} skipped (needs MPI)")
    return()
  endif()
  add_executable(${target} ${arg_SOURCES})
  if(arg_MPI)
    target_link_libraries(${target} PRIVATE pactrain::mpi)
  else()
    target_link_libraries(${target} PRIVATE pactrain::pactrain)
  endif()
  target_link_libraries(${target} PRIVATE ${arg_LIBRARIES})
  pactrain_target_defaults(${target})
  if(arg_TORCH_PCH)
    pactrain_use_torch_pch(${target})
  endif()
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}")
  set(${target}_ADDED TRUE PARENT_SCOPE)
endfunction()
