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
target_include_directories(_core PRIVATE ${PROJECT_SOURCE_DIR})
# Developers point LOWBIT_DEV_BUILD at this folder to import a build-tree extension.
set_target_properties(_core PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/python_ext)
install(TARGETS _core LIBRARY DESTINATION lowbit)

# Type stubs generated from the compiled module.
nanobind_add_stub(_core_stub MODULE _core OUTPUT ${CMAKE_BINARY_DIR}/python_ext/_core.pyi
                  PYTHON_PATH $<TARGET_FILE_DIR:_core> DEPENDS _core MARKER_FILE ${CMAKE_BINARY_DIR}/python_ext/py.typed)
install(FILES ${CMAKE_BINARY_DIR}/python_ext/_core.pyi ${CMAKE_BINARY_DIR}/python_ext/py.typed DESTINATION lowbit)
