# cmake --install puts the headers, the kernel library, a CMake package
# (find_package(qkv 0.1) → qkv::qkv, and qkv::mpi where it was built, with a
# version file; qkv::native too) and qkv.pc (its variable mpi: yes or no)
# with qkv-native.pc (qkv and -march=native, for a program's own functors).
include(CMakePackageConfigHelpers)

install(TARGETS qkv qkv_native EXPORT qkvTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(QKV_HAS_MPI)
  install(TARGETS qkv_mpi EXPORT qkvTargets)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/qkv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(QKV_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/qkv)
install(EXPORT qkvTargets NAMESPACE qkv:: DESTINATION ${QKV_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/qkvConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/qkvConfig.cmake INSTALL_DESTINATION ${QKV_CMAKE_DIR})
# 0.x: a new minor version may break the interface.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qkvConfig.cmake ${PROJECT_BINARY_DIR}/qkvConfigVersion.cmake
        DESTINATION ${QKV_CMAKE_DIR})

# qkv.pc finds its prefix from where it lies, so the install can move.
file(RELATIVE_PATH QKV_PC_TO_PREFIX /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
if(QKV_HAS_MPI)
  set(QKV_PC_MPI yes)
else()
  set(QKV_PC_MPI no)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv.pc.in ${PROJECT_BINARY_DIR}/qkv.pc @ONLY)
configure_file(${PROJECT_SOURCE_DIR}/cmake/qkv-native.pc.in ${PROJECT_BINARY_DIR}/qkv-native.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/qkv.pc ${PROJECT_BINARY_DIR}/qkv-native.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
