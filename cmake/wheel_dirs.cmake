# lowbit_wheel_dirs(<out> <module>...): the folders of the named Python packages (e.g. nvidia.nccl, nvidia.cu13) in
# the Python that builds lowbit, for find_path / find_library hints. The NVIDIA wheels that torch's CUDA builds
# install are namespace packages, so the first entry of __path__ is the folder.
function(lowbit_wheel_dirs out)
  set(_dirs "")
  set(_py "${Python_EXECUTABLE}")
  if(NOT _py)
    find_program(_py NAMES python3 python)
  endif()
  if(_py)
    foreach(_module ${ARGN})
      execute_process(COMMAND "${_py}" -c "import ${_module} as m; print(list(m.__path__)[0])"
                      OUTPUT_VARIABLE _dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
      if(_rc EQUAL 0 AND _dir)
        list(APPEND _dirs "${_dir}")
      endif()
    endforeach()
  endif()
  set(${out} ${_dirs} PARENT_SCOPE)
endfunction()
