# libtorch comes from the PyPI torch wheel: ask that Python where its CMake config is.
if(SDXL_PYTHON AND NOT EXISTS "${SDXL_PYTHON}")
  # A bare name such as "python3" (the gpu preset): look it up on PATH.
  get_filename_component(_sdxl_py_name "${SDXL_PYTHON}" NAME)
  find_program(_sdxl_py_found NAMES ${_sdxl_py_name} REQUIRED)
  set(SDXL_PYTHON ${_sdxl_py_found})
endif()
if(NOT SDXL_PYTHON)
  if(EXISTS ${CMAKE_SOURCE_DIR}/.venv/bin/python)
    set(SDXL_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
  else()
    find_program(SDXL_PYTHON NAMES python3 REQUIRED)
  endif()
endif()
execute_process(
  COMMAND ${SDXL_PYTHON} -c "import torch, os; print(torch.utils.cmake_prefix_path); print(os.path.join(os.path.dirname(torch.__file__), 'lib')); print(torch.__version__)"
  OUTPUT_VARIABLE _sdxl_torch_out RESULT_VARIABLE _sdxl_torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _sdxl_torch_rc EQUAL 0)
  message(FATAL_ERROR "Cannot import torch with ${SDXL_PYTHON}. Run scripts/setup.sh (it creates .venv with torch==2.11.0) or pass -DSDXL_PYTHON=/path/to/python.")
endif()
string(REPLACE "\n" ";" _sdxl_torch_out "${_sdxl_torch_out}")
list(GET _sdxl_torch_out 0 _sdxl_torch_prefix)
list(GET _sdxl_torch_out 1 SDXL_TORCH_LIB_DIR)
list(GET _sdxl_torch_out 2 SDXL_TORCH_VERSION)
message(STATUS "sdxl: torch ${SDXL_TORCH_VERSION} from ${SDXL_PYTHON}")
list(APPEND CMAKE_PREFIX_PATH ${_sdxl_torch_prefix})
# The CUDA wheel's config looks for the CUDA toolkit; nothing here compiles CUDA code.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
# Without an arch list torch's config compiles and runs a CUDA probe, which
# fails on a machine without a GPU; nothing here compiles CUDA code anyway.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT DEFINED TORCH_CUDA_ARCH_LIST)
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "CUDA archs for torch's config (no CUDA code is compiled)")
endif()
find_package(Torch REQUIRED)
# TorchConfig exports TORCH_LIBRARIES and flags rather than one clean target.
add_library(torch_iface INTERFACE)
target_link_libraries(torch_iface INTERFACE ${TORCH_LIBRARIES})
target_compile_options(torch_iface INTERFACE ${TORCH_CXX_FLAGS})
if(NOT TARGET torch)
  message(FATAL_ERROR "find_package(Torch) did not define target torch")
endif()
