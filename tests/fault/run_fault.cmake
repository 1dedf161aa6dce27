# Runs one fault test: tests/fault/fault_main on several ranks in one mode, timed.
#
#   cmake -DMODE=control|sigkill|throw -DCOMMAND=<mpiexec|-n|4|...|fault_main|mode>
#         [-DLIMIT=<seconds, 30>] -P run_fault.cmake
#
# COMMAND is the whole mpiexec command line, "|"-separated. control: the job must exit 0.
# sigkill and throw: the job must end with a nonzero status. Either way it must end within
# LIMIT seconds (a job still running then is killed, with its ranks, and fails the test), and
# its output must show that the program got where the mode says. Registered by
# tests/CMakeLists.txt as ctest tests fault.<mode>.
cmake_minimum_required(VERSION 3.25)

foreach(var MODE COMMAND)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_fault.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED LIMIT)
  set(LIMIT 30)
endif()

# control: rank 0's summary; sigkill: the victim's last words; throw: the guard's
# "<name>: <what>" line.
if(MODE STREQUAL "control")
  set(expect "fault_main: [0-9]+ ranks, [0-9]+ steps of [0-9]+ buckets, 0 entries wrong")
elseif(MODE STREQUAL "sigkill")
  set(expect "fault_main: rank [0-9]+ sends itself SIGKILL")
elseif(MODE STREQUAL "throw")
  set(expect "fault_main: rank [0-9]+ failed outside pactrain")
else()
  message(FATAL_ERROR "run_fault.cmake: MODE must be control, sigkill or throw, not '${MODE}'")
endif()

string(REPLACE "|" ";" command "${COMMAND}")
string(TIMESTAMP start "%s%f")  # microseconds since the epoch
execute_process(COMMAND ${command}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out TIMEOUT ${LIMIT})
string(TIMESTAMP end "%s%f")
math(EXPR ms "(${end} - ${start}) / 1000")
math(EXPR whole "${ms} / 1000")
math(EXPR tenths "${ms} % 1000 / 100")
set(took "${whole}.${tenths} s")

if(NOT rc MATCHES "^-?[0-9]+$")  # a message such as "Process terminated due to timeout"
  message(FATAL_ERROR "fault.${MODE}: the job did not end within ${LIMIT} s (${rc}):\n${out}")
endif()
if(MODE STREQUAL "control" AND NOT rc EQUAL 0)
  message(FATAL_ERROR "fault.${MODE}: the job failed with status ${rc} after ${took}:\n${out}")
endif()
if(NOT MODE STREQUAL "control" AND rc EQUAL 0)
  message(FATAL_ERROR "fault.${MODE}: the job exited 0 after ${took}:\n${out}")
endif()
if(NOT out MATCHES "${expect}")
  message(FATAL_ERROR
    "fault.${MODE}: status ${rc} after ${took}, but no line matches '${expect}':\n${out}")
endif()
message(STATUS "fault.${MODE}: the job ended with status ${rc} after ${took} (limit ${LIMIT} s)")
