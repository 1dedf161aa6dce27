# The ctest check of pactrain's LibTorch examples: the three runs on a slice of the data, then
# the JSON summary must show weights that agree across ranks and pruned runs that send fewer
# bytes per step than the dense one (and, for the language model, that each run predicts the
# held-out text better than a uniform guess).
#
#   cmake -DMPIEXEC=mpiexec "-DMPIEXEC_ARGS=-n;2" -DPROGRAM=<pactrain_torch_cnn>
#         "-DPROGRAM_ARGS=--epochs;1;--train-limit;1024" -DSUMMARY=<file.json>
#         -P examples/common/check_torch_run.cmake
cmake_minimum_required(VERSION 3.25)

file(REMOVE "${SUMMARY}")
execute_process(
  COMMAND "${MPIEXEC}" ${MPIEXEC_ARGS} "${PROGRAM}" ${PROGRAM_ARGS} --summary "${SUMMARY}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} failed (${rc})")
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
  # The language model must have learned something: 8 bits per byte is a uniform guess.
  string(JSON bpb ERROR_VARIABLE no_bpb GET "${json}" ${run} val_bits_per_byte)
  if(NOT no_bpb AND NOT bpb LESS 8)
    message(FATAL_ERROR "${run}: ${bpb} validation bits per byte, no better than a uniform guess")
  endif()
  message(STATUS "${run}: ${bytes} bytes per step, weights agree")
endforeach()
