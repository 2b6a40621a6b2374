# Installs headers, the static archives and a CMake package so that another C++ program can
# `find_package(lowbit)` and link `lowbit::lowbit` without Python.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
install(DIRECTORY include/lowbit DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(_targets lowbit lowbit_core lowbit_dist lowbit_quant lowbit_kv lowbit_kernels_cpu lowbit_kernels_registry lowbit_ops lowbit_model lowbit_engine)
if(LOWBIT_WITH_CUDA)
  list(APPEND _targets lowbit_cuda_common lowbit_kernels_sm80 lowbit_kernels_sm90)
  if(LOWBIT_WITH_CUBLASLT)
    list(APPEND _targets lowbit_kernels_cublaslt)
  endif()
endif()
install(TARGETS ${_targets} EXPORT lowbitTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT lowbitTargets NAMESPACE lowbit:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lowbit)
configure_package_config_file(cmake/lowbitConfig.cmake.in ${CMAKE_BINARY_DIR}/lowbitConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lowbit)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/lowbitConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/lowbitConfig.cmake ${CMAKE_BINARY_DIR}/lowbitConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lowbit)
