# NCCL for tensor parallelism over GPUs (dist/communicator.h). Optional: without it the build works and
# make_nccl_communicators says TP over GPUs is unavailable. Looked for in LOWBIT_NCCL_ROOT, then in the
# nvidia-nccl-cu13 wheel of the Python that builds lowbit (torch's CUDA wheels install it).
set(LOWBIT_WITH_NCCL OFF)
if(LOWBIT_WITH_CUDA)
  lowbit_wheel_dirs(_wheels nvidia.nccl)
  set(_nccl_hints ${LOWBIT_NCCL_ROOT} $ENV{LOWBIT_NCCL_ROOT} ${_wheels})
  find_path(LOWBIT_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
  find_library(LOWBIT_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)
  if(LOWBIT_NCCL_INCLUDE_DIR AND LOWBIT_NCCL_LIBRARY)
    set(LOWBIT_WITH_NCCL ON)
    get_filename_component(LOWBIT_NCCL_LIBRARY_DIR "${LOWBIT_NCCL_LIBRARY}" DIRECTORY)
  endif()
endif()
message(STATUS "lowbit: NCCL (tensor parallelism over GPUs) ${LOWBIT_WITH_NCCL} ${LOWBIT_NCCL_LIBRARY}")
