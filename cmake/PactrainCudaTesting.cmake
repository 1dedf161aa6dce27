# Helpers that register pactrain's CUDA tests (tests/cuda/). Device tests carry the label gpu
# and exit with 77 when no GPU is found, which ctest reports as skipped; tests that run without
# a GPU (the header fence) carry the label cuda.

include_guard(GLOBAL)
include(PactrainTesting)

# pactrain_thrust_cpu(<target>): builds <target> with the host compiler on Thrust's CPP device
# system, so that device code written as Thrust algorithms over host-device functors runs on
# the CPU (label cuda-host).
function(pactrain_thrust_cpu target)
  target_include_directories(${target} SYSTEM PRIVATE "${PACTRAIN_CCCL_INCLUDE_DIR}")
  target_compile_definitions(${target} PRIVATE THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CPP)
endfunction()

# pactrain_add_gpu_test(<source> [RANKS <n>...] [LIBRARIES <lib>...]): a doctest executable
# pactrain_gpu_<stem> in <build>/tests/cuda, registered as gpu.<stem> (or, with RANKS, once per
# rank count under mpiexec as gpu.<stem>.np<N>), label gpu, skipped on exit code 77. Without
# RANKS it gets its main from pactrain_gpu_doctest_main; with RANKS, LIBRARIES must give one.
function(pactrain_add_gpu_test source)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "RANKS;LIBRARIES")
  pactrain_test_stem(stem "${source}")
  set(target pactrain_gpu_${stem})
  pactrain_test_executable(${target} ${stem} cuda "${source}" pactrain::cuda ${arg_LIBRARIES})
  if(NOT arg_RANKS)
    target_link_libraries(${target} PRIVATE pactrain_gpu_doctest_main)
  endif()
  set(tests)
  if(arg_RANKS)
    foreach(ranks IN LISTS arg_RANKS)
      add_test(NAME gpu.${stem}.np${ranks}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
                ${PACTRAIN_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
                $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS})
      set_tests_properties(gpu.${stem}.np${ranks} PROPERTIES
        PROCESSORS ${ranks} ENVIRONMENT "${PACTRAIN_MPI_TEST_ENVIRONMENT}")
      list(APPEND tests gpu.${stem}.np${ranks})
    endforeach()
  else()
    add_test(NAME gpu.${stem} COMMAND ${target})
    list(APPEND tests gpu.${stem})
  endif()
  set_tests_properties(${tests} PROPERTIES
    LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT ${PACTRAIN_TEST_TIMEOUT})
endfunction()
