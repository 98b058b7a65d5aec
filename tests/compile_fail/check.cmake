# Runs one compile-fail case: the file must compile without QKV_EXPECT_FAIL
# (so the failure is the intended line's, not a typo's) and fail with it,
# with exactly one error, whose text contains EXPECT (a regex), and with
# EXTENTS (a regex, optional) somewhere in the diagnostic. With QUOTED_IN (a
# file), the error line from "error:" on must be a line of that file (g++ only:
# clang words the line differently).
# Arguments: -DCXX=... -DSOURCE=... -DINCLUDES="a;b" -DEXPECT=... [-DEXTENTS=...] [-DQUOTED_IN=...] [-DPCH=...]
cmake_minimum_required(VERSION 3.25)
set(include_flags "")
foreach(dir IN LISTS INCLUDES)
  list(APPEND include_flags -I${dir})
endforeach()
set(flags -std=c++20 -fsyntax-only ${include_flags})

# -DMAKE_PCH=file: writes file (including <qkv/qkv.hpp>) and its precompiled
# form file.gch, for the cases to include with -DPCH=file.
if(DEFINED MAKE_PCH)
  file(WRITE ${MAKE_PCH} "#include <qkv/qkv.hpp>\n")
  execute_process(COMMAND ${CXX} -std=c++20 -x c++-header ${include_flags} ${MAKE_PCH} -o ${MAKE_PCH}.gch
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the precompiled header does not build:\n${out}")
  endif()
  return()
endif()
if(DEFINED PCH)
  # -Winvalid-pch: a header that cannot be used says so, rather than being parsed slowly.
  list(APPEND flags -include ${PCH} -Winvalid-pch)
endif()

execute_process(COMMAND ${CXX} ${flags} ${SOURCE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the control (without QKV_EXPECT_FAIL) does not compile:\n${out}")
endif()

execute_process(COMMAND ${CXX} ${flags} -DQKV_EXPECT_FAIL ${SOURCE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "compiled, but must not")
endif()
string(REGEX MATCHALL "[^\n]*error:[^\n]*" errors "${out}")
list(LENGTH errors count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected one error, got ${count}:\n${out}")
endif()
if(NOT errors MATCHES "${EXPECT}")
  message(FATAL_ERROR "the error does not say '${EXPECT}':\n${out}")
endif()
if(DEFINED EXTENTS AND NOT out MATCHES "${EXTENTS}")
  message(FATAL_ERROR "the diagnostic does not name the extents '${EXTENTS}':\n${out}")
endif()
if(DEFINED QUOTED_IN)
  # The error line without its place (file:line:column), which goes stale.
  string(REGEX REPLACE "^.*: (error: )" "\\1" said "${errors}")
  file(STRINGS ${QUOTED_IN} quoted REGEX "qkv:")
  if(NOT said IN_LIST quoted)
    message(FATAL_ERROR "${QUOTED_IN} does not quote, on a line of its own, '${said}'")
  endif()
endif()
message(STATUS "ok: ${errors}")
