# The ctest check of pactrain_torch_cnn: one epoch of the three runs on a slice of the data,
# then the JSON summary must show weights that agree across ranks and pruned runs that send
# fewer bytes per step than the dense one.
#
#   cmake -DMPIEXEC=mpiexec "-DMPIEXEC_ARGS=-n;2" -DPROGRAM=<pactrain_torch_cnn>
#         -DSUMMARY=<file.json> -P examples/torch_cnn/check_run.cmake
cmake_minimum_required(VERSION 3.25)

file(REMOVE "${SUMMARY}")
execute_process(
  COMMAND "${MPIEXEC}" ${MPIEXEC_ARGS} "${PROGRAM}" --epochs 1 --train-limit 1024
          --test-limit 512 --batch 16 --summary "${SUMMARY}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pactrain_torch_cnn failed (${rc})")
endif()
file(READ "${SUMMARY}" json)
string(JSON dense_bytes GET "${json}" dense bytes_per_step)
foreach(run IN ITEMS dense sparse ternary)
  string(JSON agree GET "${json}" ${run} weights_agree_across_ranks)
  if(NOT agree)
    message(FATAL_ERROR "${run}: the weights differ across ranks")
  endif()
  string(JSON bytes GET "${json}" ${run} bytes_per_step)
  if(NOT run STREQUAL "dense" AND NOT bytes LESS dense_bytes)
    message(FATAL_ERROR "${run} sent ${bytes} bytes per step, dense ${dense_bytes}")
  endif()
  message(STATUS "${run}: ${bytes} bytes per step, weights agree")
endforeach()
