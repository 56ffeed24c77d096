# Every dependency comes from Debian's packages or the CUDA toolkit; nothing
# is downloaded. See ../shared/DEPENDENCIES.md for how each one is found.

find_package(absl CONFIG REQUIRED)
find_package(Threads REQUIRED)
# Protobuf before gRPC: gRPC's config expects the protobuf targets.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
# Gloo (Debian, 0.5): the plain `gloo` target; no TCP store, see DEPENDENCIES.md.
find_package(Gloo CONFIG REQUIRED)
find_package(RocksDB CONFIG REQUIRED)

# OpenBLAS ships a config that sets variables, not targets.
find_package(OpenBLAS CONFIG REQUIRED)
if(NOT TARGET recps::blas)
  add_library(recps::blas INTERFACE IMPORTED)
  set_target_properties(recps::blas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()

if(RECPS_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
  include(GoogleTest)
endif()
if(RECPS_BUILD_BENCHMARKS)
  find_package(benchmark CONFIG REQUIRED)
endif()

# CUDA: built wherever nvcc is present, unless RECPS_CUDA=OFF.
set(RECPS_HAVE_CUDA OFF)
if(RECPS_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES "80;90")
    endif()
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    # A CUDA tree without NCCL would build GPU workers that cannot allreduce,
    # and its NCCL tests would only skip: refuse it here.
    if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
      message(FATAL_ERROR "CUDA was found but NCCL was not (looked for nccl.h "
                          "and libnccl near ${CUDAToolkit_LIBRARY_DIR}); install "
                          "NCCL or build a CPU-only tree with -DRECPS_CUDA=OFF.")
    endif()
    if(NOT TARGET NCCL::nccl)
      add_library(NCCL::nccl UNKNOWN IMPORTED)
      set_target_properties(NCCL::nccl PROPERTIES
        IMPORTED_LOCATION "${NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
    endif()
    set(RECPS_HAVE_CUDA ON)
  endif()
endif()
if(RECPS_REQUIRE_CUDA AND NOT RECPS_HAVE_CUDA)
  message(FATAL_ERROR "RECPS_REQUIRE_CUDA is set but no CUDA compiler was "
                      "found (looked for /usr/local/cuda/bin/nvcc).")
endif()
