# Header-only C++ dependencies: fmt, spdlog, CLI11, nlohmann/json, stb_image_write, stb_image.
# From Debian's packages (libfmt-dev, libspdlog-dev, libcli11-dev, nlohmann-json3-dev,
# libstb-dev) or, on a machine without them (the GPU machine), from a carried folder
# made by scripts/gather_deps.sh and named with -DSDXL_DEPS_DIR.
#
# The torch wheel ships its own fmt headers under torch/include/fmt. Which fmt a
# translation unit gets must not depend on include order, so fmt and spdlog are
# reached through a folder of our own that is searched before torch's.
add_library(sdxl_thirdparty INTERFACE)
if(SDXL_DEPS_DIR)
  set(_sdxl_dep_inc ${SDXL_DEPS_DIR}/include)
  foreach(_h fmt/format.h spdlog/spdlog.h CLI/CLI.hpp nlohmann/json.hpp stb/stb_image_write.h stb/stb_image.h)
    if(NOT EXISTS ${_sdxl_dep_inc}/${_h})
      message(FATAL_ERROR "SDXL_DEPS_DIR=${SDXL_DEPS_DIR} lacks include/${_h}; run scripts/gather_deps.sh")
    endif()
  endforeach()
else()
  set(_sdxl_dep_inc ${CMAKE_BINARY_DIR}/sdxl-deps-include)
  file(MAKE_DIRECTORY ${_sdxl_dep_inc})
  foreach(_d fmt spdlog)
    if(NOT EXISTS /usr/include/${_d})
      message(FATAL_ERROR "/usr/include/${_d} missing: run scripts/setup.sh (apt-get install libfmt-dev libspdlog-dev)")
    endif()
    file(CREATE_LINK /usr/include/${_d} ${_sdxl_dep_inc}/${_d} SYMBOLIC)
  endforeach()
  foreach(_h CLI/CLI.hpp nlohmann/json.hpp stb/stb_image_write.h stb/stb_image.h)
    if(NOT EXISTS /usr/include/${_h})
      message(FATAL_ERROR "/usr/include/${_h} missing: run scripts/setup.sh")
    endif()
  endforeach()
endif()
if(SDXL_DEPS_DIR)
  # Carried headers only: fmt and spdlog compile into each user (the GPU machine has the cores).
  target_compile_definitions(sdxl_thirdparty INTERFACE FMT_HEADER_ONLY SPDLOG_HEADER_ONLY SPDLOG_FMT_EXTERNAL)
else()
  # Debian's compiled spdlog and fmt: header-only spdlog costs seconds in every file on 2 cores.
  find_package(fmt REQUIRED)
  find_package(spdlog REQUIRED)
  target_link_libraries(sdxl_thirdparty INTERFACE spdlog::spdlog fmt::fmt)
endif()
# BEFORE + SYSTEM: searched ahead of torch's -isystem folders, no warnings from them.
target_include_directories(sdxl_thirdparty SYSTEM BEFORE INTERFACE ${_sdxl_dep_inc})
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
target_link_libraries(sdxl_thirdparty INTERFACE Threads::Threads ZLIB::ZLIB)
