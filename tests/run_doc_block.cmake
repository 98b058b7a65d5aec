# Builds one program made from a documentation block, runs it, and fails
# when it does. Arguments: -DBUILD=... -DTARGET=... -DEXE=...
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target ${TARGET} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building ${TARGET} failed:\n${out}")
endif()
execute_process(COMMAND ${EXE} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} failed (exit ${rc})")
endif()
