# Helpers for the libFuzzer targets in tests/fuzz (Clang only).

include_guard(GLOBAL)

if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "pactrain's fuzz targets need Clang with libFuzzer (e.g. "
                      "-DCMAKE_CXX_COMPILER=clang++-14); this is ${CMAKE_CXX_COMPILER_ID}")
endif()

set(PACTRAIN_FUZZ_SMOKE_SECONDS 5 CACHE STRING
  "Seconds each fuzz target runs in its ctest smoke test")

# libFuzzer's main, and every report fatal. -O1, as libFuzzer suggests: fast enough to fuzz,
# and it wins over the configuration's level because it comes after it.
set(_pactrain_fuzz_flags
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)

# pactrain_add_fuzz_target(<name>): the libFuzzer executable <name>_fuzz from <name>_fuzz.cpp,
# whose seeds are tests/fuzz/corpus/<name>/, and two ctest tests (label fuzz):
#   fuzz.<name>        runs the target for PACTRAIN_FUZZ_SMOKE_SECONDS over the seeds, saving
#                      what it finds in a fresh <binary dir>/found/<name>/, never in the tree;
#   fuzz.<name>.seeds  checks that the committed seeds are what the target writes today.
function(pactrain_add_fuzz_target name)
  set(target ${name}_fuzz)
  add_executable(${target} "${CMAKE_CURRENT_SOURCE_DIR}/${name}_fuzz.cpp")
  target_link_libraries(${target} PRIVATE pactrain::pactrain)
  pactrain_target_defaults(${target})
  target_compile_options(${target} PRIVATE ${_pactrain_fuzz_flags})
  target_link_options(${target} PRIVATE ${_pactrain_fuzz_flags})

  set(seeds "${CMAKE_CURRENT_SOURCE_DIR}/corpus/${name}")
  set(found "${CMAKE_CURRENT_BINARY_DIR}/found/${name}")
  set(written "${CMAKE_CURRENT_BINARY_DIR}/seeds/${name}")
  add_test(NAME fuzz.${name}
    COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && exec \"$0\" -max_total_time=$2 \
-timeout=10 -print_final_stats=1 \"$1\" \"$3\""
            $<TARGET_FILE:${target}> "${found}" ${PACTRAIN_FUZZ_SMOKE_SECONDS} "${seeds}")
  add_test(NAME fuzz.${name}.seeds
    COMMAND sh -c "rm -rf \"$1\" && mkdir -p \"$1\" && PACTRAIN_FUZZ_WRITE_SEEDS=\"$1\" \"$0\" \
&& diff -r \"$1\" \"$2\""
            $<TARGET_FILE:${target}> "${written}" "${seeds}")
  math(EXPR timeout "${PACTRAIN_FUZZ_SMOKE_SECONDS} + 60")
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT ${timeout})
  set_tests_properties(fuzz.${name}.seeds PROPERTIES LABELS fuzz TIMEOUT 60)
endfunction()
