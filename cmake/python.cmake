# The nanobind extension lowbit._core: one binding file per C++ area, no logic in them.
find_package(Python 3.9 COMPONENTS Interpreter Development.Module REQUIRED)
if(NOT nanobind_DIR)
  execute_process(COMMAND "${Python_EXECUTABLE}" -m nanobind --cmake_dir
                  OUTPUT_STRIP_TRAILING_WHITESPACE OUTPUT_VARIABLE nanobind_DIR)
endif()
find_package(nanobind CONFIG REQUIRED)

file(GLOB _bind_src CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/bindings/*.cpp)
nanobind_add_module(_core NB_STATIC STABLE_ABI ${_bind_src})
target_link_libraries(_core PRIVATE lowbit)
# Export nothing but PyInit__core. The extension links static archives (lowbit's areas, nanobind, the static CUDA
# runtime) and, with some toolchains, a static copy of libstdc++. Without this, all of their symbols are exported,
# and libstdc++'s STB_GNU_UNIQUE symbols (locale facet ids, among others) are unified process-wide with those of the
# shared libstdc++ that torch loads: the two C++ runtimes then share half of their state, and formatting the
# message of the first C++ exception segfaulted (docs/gpu_notes.md, "C++ exceptions crashed once torch was loaded").
# tests_py/test_extension_exports.py checks the exported symbol table of the installed extension.
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  target_link_options(_core PRIVATE "LINKER:--exclude-libs,ALL"
                      "LINKER:--version-script=${PROJECT_SOURCE_DIR}/cmake/python_exports.map")
  set_property(TARGET _core APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/python_exports.map)
endif()
target_include_directories(_core PRIVATE ${PROJECT_SOURCE_DIR})
# The shared libraries of the nvidia-* wheels next to lowbit in site-packages (torch loads the same ones):
# libnccl.so.2 from nvidia-nccl-cu13, libcublasLt.so.13 from nvidia-cublas.
set(_rpath "")
set(_build_rpath "")
if(LOWBIT_WITH_NCCL)
  list(APPEND _rpath "$ORIGIN/../nvidia/nccl/lib" "${LOWBIT_NCCL_LIBRARY_DIR}")
  list(APPEND _build_rpath "${LOWBIT_NCCL_LIBRARY_DIR}")
endif()
if(LOWBIT_WITH_CUBLASLT)
  list(APPEND _rpath "$ORIGIN/../nvidia/cu13/lib" "$ORIGIN/../nvidia/cublas/lib" "${LOWBIT_CUBLASLT_LIBRARY_DIR}")
  list(APPEND _build_rpath "${LOWBIT_CUBLASLT_LIBRARY_DIR}")
endif()
if(_rpath)
  set_target_properties(_core PROPERTIES INSTALL_RPATH "${_rpath}" BUILD_RPATH "${_build_rpath}")
endif()
# Developers point LOWBIT_DEV_BUILD at this folder to import a build-tree extension.
set_target_properties(_core PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/python_ext)
install(TARGETS _core LIBRARY DESTINATION lowbit)

# Type stubs generated from the compiled module.
nanobind_add_stub(_core_stub MODULE _core OUTPUT ${CMAKE_BINARY_DIR}/python_ext/_core.pyi
                  PYTHON_PATH $<TARGET_FILE_DIR:_core> DEPENDS _core MARKER_FILE ${CMAKE_BINARY_DIR}/python_ext/py.typed)
install(FILES ${CMAKE_BINARY_DIR}/python_ext/_core.pyi ${CMAKE_BINARY_DIR}/python_ext/py.typed DESTINATION lowbit)
