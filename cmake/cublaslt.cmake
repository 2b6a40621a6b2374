# cuBLASLt for the f16 GEMM (cpp/kernels/cublaslt/). Optional: without it the build works and
# the f16 linears stay on lowbit's own kernels (the registry says why). Looked for in LOWBIT_CUBLAS_ROOT, the
# nvidia-cublas wheel of the Python that builds lowbit (torch's CUDA wheels install it: nvidia/cu13/{include,lib}
# for CUDA 13, nvidia/cublas/{include,lib} before), the CUDA toolkit, then the system paths.
set(LOWBIT_WITH_CUBLASLT OFF)
if(LOWBIT_WITH_CUDA AND NOT LOWBIT_CUBLASLT STREQUAL "OFF")
  # The wheel before the toolkit: the same copy torch loads.
  lowbit_wheel_dirs(_wheels nvidia.cu13 nvidia.cublas)
  set(_cublas_hints ${LOWBIT_CUBLAS_ROOT} $ENV{LOWBIT_CUBLAS_ROOT} ${_wheels})
  find_path(LOWBIT_CUBLASLT_INCLUDE_DIR cublasLt.h HINTS ${_cublas_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include NO_DEFAULT_PATH)
  find_path(LOWBIT_CUBLASLT_INCLUDE_DIR cublasLt.h)
  # The wheels ship only the versioned soname (libcublasLt.so.13), no development symlink.
  find_library(LOWBIT_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12
               HINTS ${_cublas_hints} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
  find_library(LOWBIT_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12)
  if(LOWBIT_CUBLASLT_INCLUDE_DIR AND LOWBIT_CUBLASLT_LIBRARY)
    set(LOWBIT_WITH_CUBLASLT ON)
    get_filename_component(LOWBIT_CUBLASLT_LIBRARY_DIR "${LOWBIT_CUBLASLT_LIBRARY}" DIRECTORY)
  elseif(LOWBIT_CUBLASLT STREQUAL "ON")
    message(FATAL_ERROR "LOWBIT_CUBLASLT=ON but cublasLt.h / libcublasLt were not found (set LOWBIT_CUBLAS_ROOT, or "
                        "pip install nvidia-cublas)")
  endif()
endif()
message(STATUS "lowbit: cuBLASLt (the f16 GEMM) ${LOWBIT_WITH_CUBLASLT} ${LOWBIT_CUBLASLT_LIBRARY}")
