# runtime/gpu/gpu.cmake — the HIP and CUDA backends, included by the
# top-level CMakeLists.txt after the runtime libraries (it needs XM_ROOT and
# xm_rt_abi). Each backend is built where its compiler, runtime headers and
# runtime library are found, else skipped with one status line:
#   xm_rt_hip   runtime/hip/backend.c (the C compiler, HIP runtime C API) and
#               runtime/hip/table.hip (hipcc --offload-arch=XM_HIP_ARCH),
#               linked with libamdhip64;
#   xm_rt_cuda  runtime/cuda/backend.c (the C compiler, CUDA runtime API) and
#               runtime/cuda/table.cu (nvcc, sm_XM_CUDA_ARCH), linked with
#               libcudart.
# The device code is compiled by custom commands into objects that go into
# the archive (whole-program device code, no relocatable device code), so
# any host linker links them: they need the vendor runtime library,
# libstdc++ (nvcc's registration code) and libm, which the archives carry.
# XM_HIP_FLAGS / XM_CUDA_FLAGS add flags, e.g. -DXM_G_ONLY=\"<kernel file>\"
# (runtime/gpu/table.cuh) while a kernel file does not compile.
# XM_HIP_LINK_FLAGS / XM_CUDA_LINK_FLAGS: what a program linking the archive
# adds for the vendor runtime (for xmoec compile, CMakeLists.txt); XM_HIPCC
# and XM_NVCC the compilers ("" when not found). And the conformance suite
# on each (tests/backend/test_<name>_backend.c), ctests backend_hip and
# backend_cuda, which skip (exit code 77) where init finds no device.
if(NOT DEFINED XM_ROOT)
  get_filename_component(XM_ROOT ${CMAKE_CURRENT_LIST_DIR}/../.. ABSOLUTE)
endif()

option(XM_GPU_HIP "Build the HIP backend when hipcc is found" ON)
option(XM_GPU_CUDA "Build the CUDA backend when nvcc is found" ON)
set(XM_HIP_ARCH "gfx90a" CACHE STRING
    "AMD targets of the HIP kernels (hipcc --offload-arch; a list for several)")
set(XM_CUDA_ARCH "90" CACHE STRING
    "NVIDIA targets of the CUDA kernels (nvcc -arch=sm_<arch>; a list for several)")
set(XM_HIP_FLAGS "" CACHE STRING "Extra hipcc flags for runtime/hip/table.hip")
set(XM_CUDA_FLAGS "" CACHE STRING "Extra nvcc flags for runtime/cuda/table.cu")
# The conformance entries the GPU ctests run (empty: all of them).
set(XM_GPU_ENTRIES "" CACHE STRING
    "Conformance entries of backend_hip and backend_cuda (empty: all)")

set(XM_GPU_OUT ${CMAKE_CURRENT_BINARY_DIR}/xm_gpu)
file(MAKE_DIRECTORY ${XM_GPU_OUT})

# The conformance executable of backend `name` (hip, cuda) and its ctest.
function(xm_gpu_conformance name)
  add_executable(test_${name}_backend ${XM_ROOT}/tests/backend/test_${name}_backend.c
                 ${XM_ROOT}/tests/backend/conformance.c ${XM_ROOT}/tests/backend/reference.c)
  target_link_libraries(test_${name}_backend PRIVATE xm_rt_${name} m)
  set_target_properties(test_${name}_backend PROPERTIES LINKER_LANGUAGE CXX)
  add_test(NAME backend_${name} COMMAND test_${name}_backend ${XM_GPU_ENTRIES})
  set_tests_properties(backend_${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
                       ENVIRONMENT "XM_SOURCE_DIR=${XM_ROOT};XM_BINARY_DIR=${CMAKE_BINARY_DIR}"
                       LABELS "unit;gpu")
endfunction()

# ---- HIP ----------------------------------------------------------------------
set(xm_hip_why "")
if(NOT XM_GPU_HIP)
  set(xm_hip_why "XM_GPU_HIP is OFF")
else()
  find_program(XM_HIPCC hipcc HINTS $ENV{ROCM_PATH}/bin $ENV{HIP_PATH}/bin /opt/rocm/bin)
  if(NOT XM_HIPCC)
    set(xm_hip_why "hipcc not found")
  else()
    find_path(XM_HIP_INCLUDE_DIR hip/hip_runtime_api.h
              HINTS $ENV{ROCM_PATH}/include $ENV{HIP_PATH}/include /opt/rocm/include)
    find_library(XM_HIP_LIBRARY amdhip64 HINTS $ENV{ROCM_PATH}/lib $ENV{HIP_PATH}/lib /opt/rocm/lib)
    if(NOT XM_HIP_INCLUDE_DIR)
      set(xm_hip_why "hipcc found but not hip/hip_runtime_api.h")
    elseif(NOT XM_HIP_LIBRARY)
      set(xm_hip_why "hipcc found but not libamdhip64")
    endif()
  endif()
endif()

if(xm_hip_why)
  message(STATUS "GPU: ${xm_hip_why}: the HIP backend is not built")
  if(NOT XM_HIPCC)
    set(XM_HIPCC "") # for codegen/build_config.h.in: no hipcc
  endif()
else()
  message(STATUS "GPU: HIP backend with ${XM_HIPCC} for ${XM_HIP_ARCH}, ${XM_HIP_LIBRARY}")
  set(xm_gpu_src ${XM_ROOT}/runtime/hip/table.hip)
  set(xm_gpu_obj ${XM_GPU_OUT}/hip_table.o)
  set(xm_gpu_archs "")
  foreach(a ${XM_HIP_ARCH})
    list(APPEND xm_gpu_archs --offload-arch=${a})
  endforeach()
  separate_arguments(xm_gpu_extra UNIX_COMMAND "${XM_HIP_FLAGS}")
  add_custom_command(
    OUTPUT ${xm_gpu_obj}
    COMMAND ${XM_HIPCC} -x hip -std=c++17 -O2 -fPIC ${xm_gpu_archs} -I${XM_ROOT} ${xm_gpu_extra}
            -MD -MF ${xm_gpu_obj}.d -c ${xm_gpu_src} -o ${xm_gpu_obj}
    DEPENDS ${xm_gpu_src}
    DEPFILE ${xm_gpu_obj}.d
    COMMENT "hipcc runtime/hip/table.hip (${XM_HIP_ARCH})"
    VERBATIM)
  add_library(xm_rt_hip STATIC ${XM_ROOT}/runtime/hip/backend.c ${xm_gpu_obj})
  set_source_files_properties(${xm_gpu_obj} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  target_include_directories(xm_rt_hip PUBLIC ${XM_ROOT})
  target_include_directories(xm_rt_hip SYSTEM PRIVATE ${XM_HIP_INCLUDE_DIR})
  target_compile_definitions(xm_rt_hip PRIVATE __HIP_PLATFORM_AMD__=1)
  target_link_libraries(xm_rt_hip PUBLIC xm_rt_abi ${XM_HIP_LIBRARY} stdc++ m)
  get_filename_component(xm_gpu_dir ${XM_HIP_LIBRARY} DIRECTORY)
  set(XM_HIP_LINK_FLAGS "${XM_HIP_LIBRARY} -Wl,-rpath,${xm_gpu_dir}")
  xm_gpu_conformance(hip)
endif()

# ---- CUDA ---------------------------------------------------------------------
set(xm_cuda_why "")
if(NOT XM_GPU_CUDA)
  set(xm_cuda_why "XM_GPU_CUDA is OFF")
else()
  find_program(XM_NVCC nvcc HINTS $ENV{CUDA_HOME}/bin $ENV{CUDA_PATH}/bin /usr/local/cuda/bin)
  if(NOT XM_NVCC)
    set(xm_cuda_why "nvcc not found")
  else()
    # The toolkit of that nvcc: <root>/bin/nvcc.
    get_filename_component(xm_cuda_root ${XM_NVCC} DIRECTORY)
    get_filename_component(xm_cuda_root ${xm_cuda_root} DIRECTORY)
    find_path(XM_CUDA_INCLUDE_DIR cuda_runtime_api.h
              HINTS ${xm_cuda_root}/include ${xm_cuda_root}/targets/x86_64-linux/include)
    find_library(XM_CUDART_LIBRARY cudart
                 HINTS ${xm_cuda_root}/lib64 ${xm_cuda_root}/lib
                       ${xm_cuda_root}/targets/x86_64-linux/lib)
    if(NOT XM_CUDA_INCLUDE_DIR)
      set(xm_cuda_why "nvcc found but not cuda_runtime_api.h")
    elseif(NOT XM_CUDART_LIBRARY)
      set(xm_cuda_why "nvcc found but not libcudart")
    endif()
  endif()
endif()

if(xm_cuda_why)
  message(STATUS "GPU: ${xm_cuda_why}: the CUDA backend is not built")
  if(NOT XM_NVCC)
    set(XM_NVCC "")
  endif()
else()
  message(STATUS "GPU: CUDA backend with ${XM_NVCC} for sm_${XM_CUDA_ARCH}, ${XM_CUDART_LIBRARY}")
  list(LENGTH XM_CUDA_ARCH xm_gpu_n)
  if(xm_gpu_n EQUAL 1)
    set(xm_gpu_archs -arch=sm_${XM_CUDA_ARCH})
  else()
    set(xm_gpu_archs "")
    foreach(a ${XM_CUDA_ARCH})
      list(APPEND xm_gpu_archs -gencode=arch=compute_${a},code=sm_${a})
    endforeach()
  endif()
  separate_arguments(xm_gpu_extra UNIX_COMMAND "${XM_CUDA_FLAGS}")
  # table.cu twice: the kernel table, and (XM_CUDA_FILL_ONLY) the fill
  # kernel every program needs, so that a program without the table links
  # only the fill.
  set(xm_gpu_src ${XM_ROOT}/runtime/cuda/table.cu)
  set(xm_gpu_objs "")
  foreach(part table fill)
    set(xm_gpu_obj ${XM_GPU_OUT}/cuda_${part}.o)
    set(xm_gpu_def "")
    if(part STREQUAL "fill")
      set(xm_gpu_def -DXM_CUDA_FILL_ONLY=1)
    endif()
    add_custom_command(
      OUTPUT ${xm_gpu_obj}
      COMMAND ${XM_NVCC} -x cu -std=c++17 -O2 -Xcompiler=-fPIC ${xm_gpu_archs} -I${XM_ROOT}
              ${xm_gpu_def} ${xm_gpu_extra} -MD -MF ${xm_gpu_obj}.d -c ${xm_gpu_src}
              -o ${xm_gpu_obj}
      DEPENDS ${xm_gpu_src}
      DEPFILE ${xm_gpu_obj}.d
      COMMENT "nvcc runtime/cuda/table.cu (${part}, sm_${XM_CUDA_ARCH})"
      VERBATIM)
    list(APPEND xm_gpu_objs ${xm_gpu_obj})
  endforeach()
  add_library(xm_rt_cuda STATIC ${XM_ROOT}/runtime/cuda/backend.c ${xm_gpu_objs})
  set_source_files_properties(${xm_gpu_objs} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  target_include_directories(xm_rt_cuda PUBLIC ${XM_ROOT})
  target_include_directories(xm_rt_cuda SYSTEM PRIVATE ${XM_CUDA_INCLUDE_DIR})
  target_link_libraries(xm_rt_cuda PUBLIC xm_rt_abi ${XM_CUDART_LIBRARY} stdc++ m)
  get_filename_component(xm_gpu_dir ${XM_CUDART_LIBRARY} DIRECTORY)
  set(XM_CUDA_LINK_FLAGS "${XM_CUDART_LIBRARY} -Wl,-rpath,${xm_gpu_dir}")
  xm_gpu_conformance(cuda)
endif()
