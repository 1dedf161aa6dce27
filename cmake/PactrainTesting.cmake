# Helpers that turn one test source file into one executable and its ctest registrations.

include_guard(GLOBAL)

set(PACTRAIN_TEST_TIMEOUT 120 CACHE STRING "Timeout in seconds of each pactrain test")
set(PACTRAIN_MPI_TEST_RANKS 1 2 4 CACHE STRING
  "Rank counts each MPI test runs on (a list; each count is one ctest test)")

# Extra mpiexec flags. Open MPI refuses to run as root and to start more ranks than cores
# unless told to; both are normal on CI machines and containers. Decided once, when the cache
# entry is created.
if(NOT DEFINED CACHE{PACTRAIN_MPIEXEC_FLAGS})
  set(_pactrain_default_mpiexec_flags "")
  if(MPIEXEC_EXECUTABLE)
    execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version
      OUTPUT_VARIABLE _pactrain_mpiexec_version ERROR_VARIABLE _pactrain_mpiexec_version
      RESULT_VARIABLE _pactrain_mpiexec_rc TIMEOUT 30)
    if(_pactrain_mpiexec_version MATCHES "Open MPI|OpenRTE|open-mpi")
      set(_pactrain_default_mpiexec_flags --allow-run-as-root --oversubscribe)
    endif()
    unset(_pactrain_mpiexec_version)
    unset(_pactrain_mpiexec_rc)
  endif()
  set(PACTRAIN_MPIEXEC_FLAGS "${_pactrain_default_mpiexec_flags}" CACHE STRING
    "Flags passed to mpiexec for pactrain's MPI tests (a list), before MPIEXEC_PREFLAGS")
  unset(_pactrain_default_mpiexec_flags)
endif()

# Environment of every MPI test.
#  - OMP_NUM_THREADS=1: LibTorch's intra-op threads would oversubscribe the cores (torch tests).
#  - mpi_yield_when_idle: oversubscribed ranks that busy-poll make small collectives ~200x
#    slower; yielding keeps the tests fast on machines with fewer cores than ranks.
#  - btl self,vader with single_copy_mechanism none: shared memory only, without the
#    cross-memory-attach path that fails where ptrace is restricted (containers).
#  - PACTRAIN_MPI_ALGORITHM_WARNING=0: the tests' small collectives over shared memory do not
#    care which allreduce algorithm Open MPI picks; the warning is for training runs.
set(PACTRAIN_MPI_TEST_ENVIRONMENT
  OMP_NUM_THREADS=1
  PACTRAIN_MPI_ALGORITHM_WARNING=0
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_btl=self,vader
  OMPI_MCA_btl_vader_single_copy_mechanism=none)

# LeakSanitizer under MPI: Open MPI leaks its own allocations (made in MPI_Init, in libmpi,
# libopen-rte, libopen-pal and libevent) at MPI_Finalize; tests/lsan.supp suppresses leaks whose
# stack passes through those libraries. Those libraries are built without frame pointers, so the
# default fast unwinder stops inside them (often in a component that has since been unloaded)
# and no suppression can match: the MPI tests need the slow, DWARF-based unwinder for malloc.
# Leaks in pactrain's or the tests' own code are still reported.
set(PACTRAIN_LSAN_SUPPRESSIONS "${PROJECT_SOURCE_DIR}/tests/lsan.supp")
set(PACTRAIN_MPI_TEST_LSAN_OPTIONS
  "suppressions=${PACTRAIN_LSAN_SUPPRESSIONS}:print_suppressions=0:fast_unwind_on_malloc=0")

# pactrain_test_stem(<out-var> <source>): "tests/unit/mask_test.cpp" -> "mask_test".
function(pactrain_test_stem out source)
  get_filename_component(stem "${source}" NAME_WE)
  set(${out} "${stem}" PARENT_SCOPE)
endfunction()

# pactrain_test_executable(<target> <stem> <subdir> <source> <libraries>...): a test binary
# <subdir>/<stem> with doctest, the shared helpers in tests/common and the project's flags.
function(pactrain_test_executable target stem subdir source)
  add_executable(${target} "${source}")
  target_link_libraries(${target} PRIVATE ${ARGN} doctest::doctest)
  if(TARGET Eigen3::Eigen)
    target_link_libraries(${target} PRIVATE Eigen3::Eigen)
  endif()
  # Shared test helpers: #include "common/<helper>.hpp".
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/tests")
  pactrain_target_defaults(${target})
  if("pactrain::torch" IN_LIST ARGN)
    pactrain_use_torch_pch(${target})
  endif()
  # Release tests at -O2 (it follows, so it wins over, the configuration's -O3): -O3 makes
  # these template-heavy files compile about 1.6x slower, which matters on 2 cores, and the
  # tests need no more. Examples and benchmarks keep -O3.
  target_compile_options(${target} PRIVATE
    "$<$<AND:$<CONFIG:Release>,$<COMPILE_LANGUAGE:CXX>>:-O2>")
  set_target_properties(${target} PROPERTIES
    OUTPUT_NAME ${stem}
    RUNTIME_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/${subdir}")
endfunction()

# pactrain_doctest_impl(): the static library pactrain_doctest_impl, doctest's implementation
# (tests/common/doctest_impl.cpp), compiled once for every test main.
function(pactrain_doctest_impl)
  if(NOT TARGET pactrain_doctest_impl)
    add_library(pactrain_doctest_impl STATIC "${PROJECT_SOURCE_DIR}/tests/common/doctest_impl.cpp")
    target_link_libraries(pactrain_doctest_impl PUBLIC doctest::doctest)
    pactrain_target_defaults(pactrain_doctest_impl)
  endif()
endfunction()

# pactrain_doctest_main(): the static library pactrain_doctest_main, the unit tests' main()
# (tests/common/doctest_main.cpp) with doctest's implementation, compiled once for all of them.
function(pactrain_doctest_main)
  if(NOT TARGET pactrain_doctest_main)
    pactrain_doctest_impl()
    add_library(pactrain_doctest_main STATIC "${PROJECT_SOURCE_DIR}/tests/common/doctest_main.cpp")
    target_link_libraries(pactrain_doctest_main PUBLIC pactrain_doctest_impl)
    pactrain_target_defaults(pactrain_doctest_main)
  endif()
endfunction()

# pactrain_add_unit_test(<source> [NAME <name>]): a doctest executable pactrain_unit_<name>
# with the shared main (pactrain_doctest_main), registered as ctest test unit.<name>, label
# unit. <name> defaults to the file's stem.
function(pactrain_add_unit_test source)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "NAME" "")
  pactrain_test_stem(stem "${source}")
  if(arg_NAME)
    set(stem ${arg_NAME})
  endif()
  set(target pactrain_unit_${stem})
  pactrain_doctest_main()
  pactrain_test_executable(${target} ${stem} unit "${source}" pactrain::pactrain
    pactrain_doctest_main)

  add_test(NAME unit.${stem} COMMAND ${target})
  set_tests_properties(unit.${stem} PROPERTIES LABELS unit TIMEOUT ${PACTRAIN_TEST_TIMEOUT})
endfunction()

# pactrain_add_mpi_test(<source> [NAME <name>] [LABEL <label>] [RANKS <n>...]): a doctest
# executable pactrain_<label>_<name> linked with the shared MPI-aware doctest main, registered once
# per rank count N in RANKS (default PACTRAIN_MPI_TEST_RANKS) as ctest test <label>.<name>.np<N>.
# <label> defaults to mpi, <name> to the file's stem.
function(pactrain_add_mpi_test source)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "NAME;LABEL" "RANKS;LIBRARIES")
  pactrain_test_stem(stem "${source}")
  if(arg_NAME)
    set(stem ${arg_NAME})
  endif()
  set(label mpi)
  if(arg_LABEL)
    set(label ${arg_LABEL})
  endif()
  set(rank_counts ${PACTRAIN_MPI_TEST_RANKS})
  if(arg_RANKS)
    set(rank_counts ${arg_RANKS})
  endif()
  set(target pactrain_${label}_${stem})
  pactrain_test_executable(${target} ${stem} ${label} "${source}" pactrain_mpi_doctest_main
    pactrain::mpi ${arg_LIBRARIES})

  foreach(ranks IN LISTS rank_counts)
    set(test ${label}.${stem}.np${ranks})
    add_test(NAME ${test}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
              ${PACTRAIN_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS})
    set_tests_properties(${test} PROPERTIES
      LABELS ${label}
      TIMEOUT ${PACTRAIN_TEST_TIMEOUT}
      # ctest -jN then counts every rank, and does not start 4-rank tests side by side on a
      # 2-core machine.
      PROCESSORS ${ranks}
      ENVIRONMENT "${PACTRAIN_MPI_TEST_ENVIRONMENT}")
    if(PACTRAIN_SANITIZE)
      set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT_MODIFICATION
        "LSAN_OPTIONS=string_append::${PACTRAIN_MPI_TEST_LSAN_OPTIONS}")
    endif()
  endforeach()
endfunction()
