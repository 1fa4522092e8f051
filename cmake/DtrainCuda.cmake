# CUDA, found automatically: where nvcc is (PATH, CUDACXX or /usr/local/cuda), the CUDA sources are
# compiled (src/cuda) and DTRAIN_WITH_CUDA is ON; elsewhere everything builds without them and
# device arrays are refused with a message saying why. -DDTRAIN_CUDA=OFF turns it off, =ON makes a
# missing toolkit an error.
set(DTRAIN_CUDA AUTO CACHE STRING "Build the CUDA sources: AUTO (where nvcc is found), ON or OFF")
set_property(CACHE DTRAIN_CUDA PROPERTY STRINGS AUTO ON OFF)

set(DTRAIN_WITH_CUDA OFF)
if(NOT DTRAIN_CUDA STREQUAL "OFF")
  if(NOT DEFINED ENV{CUDACXX} AND NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    find_program(_dtrain_nvcc nvcc)
    if(NOT _dtrain_nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc CACHE FILEPATH "CUDA compiler")
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    # The GPUs the seeds' users train on: Ampere (A100) and Hopper (H100/H200), plus PTX of the
    # newest for later ones. A build for one card only: -DCMAKE_CUDA_ARCHITECTURES=native.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80-real 90)
    endif()
    # CMake 3.25 (Debian 12) knows nvcc dialects up to C++17; the .cu files need no more.
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    # Headers of packages in /usr/include (nlohmann-json) must not become -isystem /usr/include for
    # nvcc, which breaks the C library's #include_next; the host compiler searches it anyway.
    list(APPEND CMAKE_CUDA_IMPLICIT_INCLUDE_DIRECTORIES /usr/include)
    find_package(CUDAToolkit REQUIRED)
    set(DTRAIN_WITH_CUDA ON)
    message(STATUS "dtrain: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), "
                   "architectures ${CMAKE_CUDA_ARCHITECTURES}")
  elseif(DTRAIN_CUDA STREQUAL "ON")
    message(FATAL_ERROR "DTRAIN_CUDA=ON but no CUDA compiler (nvcc) was found")
  else()
    message(STATUS "dtrain: no CUDA compiler found; building without CUDA")
  endif()
endif()

# NCCL, for allreduce mode on CUDA tensors (src/collectives/nccl): the CUDA toolkit's, a system
# one, NCCL_HOME's, or the one PyTorch's wheel brings (site-packages/nvidia/nccl, whose library
# has only its versioned name). Without it CUDA tensors are reduced through host memory.
set(DTRAIN_WITH_NCCL OFF)
if(DTRAIN_WITH_CUDA)
  # The wheel's first where torch is a CUDA build: it is the NCCL that torch loads in the process.
  set(_dtrain_nccl_hints)
  if(DTRAIN_TORCH_DIR)
    file(GLOB _dtrain_nccl_hints "${DTRAIN_TORCH_DIR}/../nvidia/nccl" "${DTRAIN_TORCH_DIR}/../nvidia/cu*")
  endif()
  list(APPEND _dtrain_nccl_hints $ENV{NCCL_HOME} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT})
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_dtrain_nccl_hints} ${CUDAToolkit_INCLUDE_DIRS}
            PATH_SUFFIXES include)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_dtrain_nccl_hints}
               ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(DTRAIN_WITH_NCCL ON)
    message(STATUS "dtrain: NCCL ${NCCL_LIBRARY}")
  else()
    message(STATUS "dtrain: NCCL not found; CUDA tensors are reduced through host memory")
  endif()
endif()
