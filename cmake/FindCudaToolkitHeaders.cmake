# Locates the CUDA toolkit's headers (cuda.h, nvrtc.h, nvJitLink.h) and library folder.
# Nothing is linked: libcuda, NVRTC and nvJitLink are opened with dlopen at run time.
set(_flashjit_cuda_hints "$ENV{CUDA_HOME}" "$ENV{CUDA_PATH}" /usr/local/cuda)
find_path(FLASHJIT_CUDA_INCLUDE_DIR cuda.h HINTS ${_flashjit_cuda_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
if(NOT FLASHJIT_CUDA_INCLUDE_DIR OR NOT EXISTS "${FLASHJIT_CUDA_INCLUDE_DIR}/nvrtc.h")
  message(FATAL_ERROR
    "flashjit needs the CUDA toolkit (13.x): no cuda.h/nvrtc.h under CUDA_HOME, CUDA_PATH or /usr/local/cuda. "
    "Install the toolkit, or set CUDA_HOME to its root.")
endif()
get_filename_component(_flashjit_cuda_root "${FLASHJIT_CUDA_INCLUDE_DIR}" DIRECTORY)
set(FLASHJIT_CUDA_ROOT "${_flashjit_cuda_root}" CACHE PATH "CUDA toolkit root")
if(EXISTS "${_flashjit_cuda_root}/lib64")
  set(FLASHJIT_CUDA_LIB_DIR "${_flashjit_cuda_root}/lib64" CACHE PATH "CUDA toolkit library folder")
else()
  set(FLASHJIT_CUDA_LIB_DIR "${_flashjit_cuda_root}/lib" CACHE PATH "CUDA toolkit library folder")
endif()
message(STATUS "flashjit: CUDA toolkit at ${FLASHJIT_CUDA_ROOT}")
