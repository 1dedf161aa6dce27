# Checks that what the documentation tells a reader to run exists: every build target named
# after `--target`, every `-DPACTRAIN_<OPTION>=` of a cmake line, every script path
# (scripts/, bench/, examples/, tests/, cmake/, .ci/ ending in .sh, .py or .cmake) and every
# program path under build/ (a last component starting with "pactrain", no extension).
#
#   cmake -DSOURCE_DIR=<repository root> -DBUILD_DIR=<build tree> -DTARGETS=<file>
#         "-DABSENT=<feature;...>" -P cmake/check_commands.cmake
#
# TARGETS names a file listing this build's targets and cache variables, one per line (the
# top-level CMakeLists.txt writes it). A target or program whose name contains a feature in
# ABSENT (torch, cuda: not configured in this build) is passed over. The documents read are the
# hand-written ones: README.md, docs/**/*.md, bench/**/README.md and examples/**/README.md.
# Each problem is printed as "<file>:<line>: ..."; any problem fails the script.
cmake_minimum_required(VERSION 3.25)

foreach(var IN ITEMS SOURCE_DIR BUILD_DIR TARGETS)
  if(NOT ${var})
    message(FATAL_ERROR "check_commands: pass -D${var}=...")
  endif()
endforeach()

file(STRINGS "${TARGETS}" known)
file(GLOB_RECURSE docs RELATIVE "${SOURCE_DIR}" "${SOURCE_DIR}/docs/*.md"
  "${SOURCE_DIR}/bench/*README.md" "${SOURCE_DIR}/examples/*README.md")
list(PREPEND docs README.md)

# Whether `name` belongs to a feature this build leaves out.
function(_absent name out)
  set(${out} FALSE PARENT_SCOPE)
  foreach(feature IN LISTS ABSENT)
    if(name MATCHES "${feature}")
      set(${out} TRUE PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

set(problems 0)
set(checked 0)
foreach(doc IN LISTS docs)
  file(STRINGS "${SOURCE_DIR}/${doc}" lines)
  set(n 0)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    set(where "${doc}:${n}")
    string(REGEX MATCHALL "--target[ =][A-Za-z0-9_.+-]+" targets "${line}")
    foreach(t IN LISTS targets)
      string(REGEX REPLACE "^--target[ =]" "" t "${t}")
      _absent("${t}" skip)
      math(EXPR checked "${checked} + 1")
      if(NOT skip AND NOT t IN_LIST known)
        message("${where}: no build target '${t}'")
        math(EXPR problems "${problems} + 1")
      endif()
    endforeach()
    string(REGEX MATCHALL "-D(PACTRAIN_[A-Z0-9_]+)=" options "${line}")
    foreach(o IN LISTS options)
      string(REGEX REPLACE "^-D(.*)=$" "\\1" o "${o}")
      math(EXPR checked "${checked} + 1")
      if(NOT o IN_LIST known)
        message("${where}: no cache variable '${o}'")
        math(EXPR problems "${problems} + 1")
      endif()
    endforeach()
    string(REGEX MATCHALL "(^|[ `(\[])(\\.ci|scripts|bench|examples|tests|cmake)/[A-Za-z0-9_./-]+\\.(sh|py|cmake)" scripts
           "${line}")
    foreach(s IN LISTS scripts)
      string(REGEX REPLACE "^[ `(\[]" "" s "${s}")
      math(EXPR checked "${checked} + 1")
      if(NOT EXISTS "${SOURCE_DIR}/${s}")
        message("${where}: no file '${s}'")
        math(EXPR problems "${problems} + 1")
      endif()
    endforeach()
    string(REGEX MATCHALL "(^|[ `(])build/([A-Za-z0-9_.-]+/)*pactrain[A-Za-z0-9_-]*([ `)]|$)" programs
           "${line}")
    foreach(p IN LISTS programs)
      string(REGEX REPLACE "^[ `(]?build/" "" p "${p}")
      string(REGEX REPLACE "[ `)]$" "" p "${p}")
      _absent("${p}" skip)
      math(EXPR checked "${checked} + 1")
      if(NOT skip AND NOT EXISTS "${BUILD_DIR}/${p}")
        message("${where}: no program 'build/${p}' after the build")
        math(EXPR problems "${problems} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()

list(LENGTH docs ndocs)
if(problems GREATER 0)
  message(FATAL_ERROR "check_commands: ${problems} of ${checked} commands in ${ndocs} documents "
                      "name what does not exist")
endif()
message(STATUS "check_commands: ${checked} targets, options, scripts and programs in ${ndocs} "
               "documents exist")
