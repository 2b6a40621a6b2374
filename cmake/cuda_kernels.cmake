# Per-arch-family CUDA static libraries.
#   lowbit_cuda_common : runtime pieces (allocator, streams, simple elementwise kernels), sm80+ real code
#   lowbit_kernels_sm80: mma.sync / cp.async / ldmatrix kernels, runs on sm_80..sm_90
#   lowbit_kernels_sm90: wgmma / TMA kernels, built only for sm_90a
set(_cuda_flags --expt-relaxed-constexpr -lineinfo -Xptxas=-warn-spills)

# Sources are globbed per folder, except generated attention instances (<folder>/instances/): those
# come from the list the generator writes, bounded by LOWBIT_ATTN_ALL_INSTANCES.
function(lowbit_cuda_lib name folder archs)
  file(GLOB_RECURSE _src CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/${folder}/*.cu ${PROJECT_SOURCE_DIR}/${folder}/*.cpp)
  list(FILTER _src EXCLUDE REGEX "/instances/")
  set(_instances_dir ${PROJECT_SOURCE_DIR}/${folder}/instances)
  if(EXISTS ${_instances_dir}/instances.cmake)
    include(${_instances_dir}/instances.cmake)
    set(_instances ${LOWBIT_ATTN_DEFAULT_INSTANCES})
    if(LOWBIT_ATTN_ALL_INSTANCES)
      list(APPEND _instances ${LOWBIT_ATTN_EXTRA_INSTANCES})
    endif()
    list(TRANSFORM _instances PREPEND ${_instances_dir}/)
    list(APPEND _src ${_instances})
  endif()
  if(NOT _src)
    set(_src ${PROJECT_SOURCE_DIR}/cmake/empty.cpp)
  endif()
  add_library(${name} STATIC ${_src})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/cpp>
    $<INSTALL_INTERFACE:include>)
  target_compile_definitions(${name} PUBLIC LOWBIT_WITH_CUDA=1)
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${_cuda_flags}>)
  set_target_properties(${name} PROPERTIES CUDA_ARCHITECTURES "${archs}" CUDA_SEPARABLE_COMPILATION OFF)
  target_link_libraries(${name} PUBLIC lowbit_core CUDA::cudart_static)
endfunction()

lowbit_cuda_lib(lowbit_cuda_common cpp/cuda "${LOWBIT_CUDA_ARCHS_SM80}")
lowbit_cuda_lib(lowbit_kernels_sm80 cpp/kernels/sm80 "${LOWBIT_CUDA_ARCHS_SM80}")
lowbit_cuda_lib(lowbit_kernels_sm90 cpp/kernels/sm90 "90a")
target_link_libraries(lowbit_kernels_sm80 PUBLIC lowbit_quant)
target_link_libraries(lowbit_kernels_sm90 PUBLIC lowbit_quant)


# cuBLASLt (cmake/cublaslt.cmake): host code only, the f16 GEMM's launch.
if(LOWBIT_WITH_CUBLASLT)
  lowbit_cuda_lib(lowbit_kernels_cublaslt cpp/kernels/cublaslt "${LOWBIT_CUDA_ARCHS_SM80}")
  target_include_directories(lowbit_kernels_cublaslt PRIVATE ${LOWBIT_CUBLASLT_INCLUDE_DIR})
  target_compile_definitions(lowbit_kernels_cublaslt PUBLIC LOWBIT_WITH_CUBLASLT=1)
  target_link_libraries(lowbit_kernels_cublaslt PUBLIC lowbit_cuda_common ${LOWBIT_CUBLASLT_LIBRARY})
endif()
