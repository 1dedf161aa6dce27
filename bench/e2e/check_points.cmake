# The ctest check of an e2e program's points: one short run per method into DIR, each point
# with weights that agree across ranks, naming the machine it was given (quotes and all), and,
# for the language model, predicting the held-out text better than a uniform guess (8 bits per
# byte); then bench/e2e/report.py must turn the points into a report with their machine, the
# trainer's tables and its target.
#
#   cmake -DMPIEXEC=mpiexec "-DMPIEXEC_ARGS=-n;2" -DPROGRAM=<pactrain_e2e_torch> -DPYTHON=python3
#         -DREPORT=bench/e2e/report.py -DDIR=<dir> "-DMETHODS=dense;ternary;powersgd"
#         "-DPROGRAM_ARGS=lm;--epochs;2;..." -P bench/e2e/check_points.cmake
cmake_minimum_required(VERSION 3.25)

file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
set(trainer "")
set(machine "the \"ctest\" machine")  # quoted in the JSON point
foreach(method IN LISTS METHODS)
  set(point "${DIR}/${method}.json")
  execute_process(
    COMMAND "${MPIEXEC}" ${MPIEXEC_ARGS} "${PROGRAM}" ${PROGRAM_ARGS} --method ${method}
            --machine "${machine}" --out "${point}"
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} --method ${method} failed (${rc})")
  endif()
  file(READ "${point}" json)
  string(JSON agree GET "${json}" weights_agree)
  if(NOT agree)
    message(FATAL_ERROR "${method}: the weights differ across ranks")
  endif()
  string(JSON recorded GET "${json}" machine)
  if(NOT recorded STREQUAL machine)
    message(FATAL_ERROR "${method}: the point names the machine '${recorded}'")
  endif()
  string(JSON trainer GET "${json}" trainer)
  string(JSON metric GET "${json}" metric)
  if(metric STREQUAL "bits_per_byte")
    string(JSON bpb GET "${json}" final_bits_per_byte)
    if(NOT bpb LESS 8)
      message(FATAL_ERROR "${method}: ${bpb} bits per byte, no better than a uniform guess")
    endif()
  endif()
  message(STATUS "${method}: point written, weights agree")
endforeach()

execute_process(
  COMMAND "${PYTHON}" "${REPORT}" --results "${DIR}" --out "${DIR}/report/e2e.md"
          --machine "not this one: every point names its machine"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "report.py failed (${rc})")
endif()
file(READ "${DIR}/report/e2e.md" md)
foreach(expected IN ITEMS "**Machine:** ${machine}\n" "## ${trainer}, 2 ranks"
                          "### unshaped links (target ")
  string(FIND "${md}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the report lacks '${expected}'")
  endif()
endforeach()
