# Builds and runs tests/consumer/ against qkv, one way per MODE:
#   package        cmake --install into a fresh prefix, then find_package(qkv 0.1)
#   subdirectory   add_subdirectory of the source tree, from a parent with
#                  no build type and its own xtl target
#   pkg-config     the installed qkv.pc (and qkv-native.pc), with the compiler alone
# Each builds the lecture's example and a program with a functor of its own
# (native.cpp, with qkv::native or qkv-native.pc).
# Arguments: -DMODE=... -DQKV_SOURCE=... -DQKV_BUILD=... -DWORK=... -DCXX=...
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGV}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

set(consumer ${QKV_SOURCE}/tests/consumer)
if(MODE STREQUAL "subdirectory")
  # With no build type and an xtl target of the parent's own: qkv must leave
  # both the parent's cache and xsimd's link to xtl as they are.
  run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK}/build -DCMAKE_CXX_COMPILER=${CXX} -DQKV_SOURCE_DIR=${QKV_SOURCE}
      -DCONSUMER_HAS_XTL=ON)
  file(STRINGS ${WORK}/build/CMakeCache.txt build_type REGEX "^CMAKE_BUILD_TYPE:")
  if(NOT build_type MATCHES "^CMAKE_BUILD_TYPE:[A-Z]*=$")
    message(FATAL_ERROR "qkv as a subdirectory set the parent's ${build_type}")
  endif()
  run(${CMAKE_COMMAND} --build ${WORK}/build -j 2)
  run(${WORK}/build/consumer_native)
  run(${WORK}/build/consumer)
else()
  run(${CMAKE_COMMAND} --install ${QKV_BUILD} --prefix ${WORK}/prefix)
  if(MODE STREQUAL "package")
    run(${CMAKE_COMMAND} -S ${consumer} -B ${WORK}/build -DCMAKE_CXX_COMPILER=${CXX}
        -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_BUILD_TYPE=Release)
    run(${CMAKE_COMMAND} --build ${WORK}/build)
    run(${WORK}/build/consumer_native)
    run(${WORK}/build/consumer)
  else()
    find_program(PKG_CONFIG pkg-config REQUIRED)
    file(GLOB_RECURSE pc ${WORK}/prefix/qkv.pc)
    get_filename_component(pcdir "${pc}" DIRECTORY)
    set(ENV{PKG_CONFIG_PATH} ${pcdir})
    run(${PKG_CONFIG} --variable=mpi qkv)
    string(STRIP "${last_output}" has_mpi)
    if(NOT has_mpi MATCHES "^(yes|no)$")
      message(FATAL_ERROR "qkv.pc's mpi variable is '${has_mpi}', not yes or no")
    endif()
    run(${PKG_CONFIG} --cflags --libs qkv)
    string(STRIP "${last_output}" flags)
    separate_arguments(flags UNIX_COMMAND "${flags}")
    run(${PKG_CONFIG} --cflags --libs qkv-native)
    string(STRIP "${last_output}" native_flags)
    separate_arguments(native_flags UNIX_COMMAND "${native_flags}")
    run(${CXX} -O2 ${consumer}/native.cpp ${native_flags} -o ${WORK}/consumer_native)
    run(${WORK}/consumer_native)
    run(${CXX} -O2 ${consumer}/main.cpp ${flags} -o ${WORK}/consumer)
    run(${WORK}/consumer)
  endif()
endif()
message(STATUS "${MODE}: ${last_output}")
