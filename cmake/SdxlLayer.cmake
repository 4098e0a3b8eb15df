# sdxl_layer(NAME [TORCH] [INCLUDE DIR] SOURCES ... [PUBLIC layers...] [PRIVATE layers...])
# One static library sdxl_NAME for the folder src/NAME. Its include path is
# ${SDXL_LAYER_VIEWS}/NAME, a folder holding the single link NAME -> src/NAME,
# so `#include "NAME/x.h"` works in NAME and in the layers that link it, and
# an include of any other layer fails to compile. TORCH: libtorch headers and
# the shared precompiled header (cmake/torch_pch.h).
# INCLUDE DIR (relative to the source folder): the library publishes only DIR
# (its public headers); its own folder and the third-party headers stay
# private, so a program linking it sees nothing else (the api layer).
set(SDXL_LAYER_VIEWS ${CMAKE_BINARY_DIR}/layers)

function(sdxl_layer_view name)
  set(view ${SDXL_LAYER_VIEWS}/${name})
  file(MAKE_DIRECTORY ${view})
  if(NOT IS_SYMLINK ${view}/${name})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${name} ${view}/${name} SYMBOLIC)
  endif()
endfunction()

set(SDXL_PCH_OWNER "" CACHE INTERNAL "")

function(sdxl_layer name)
  cmake_parse_arguments(L "TORCH" "INCLUDE" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
  set(target sdxl_${name})
  add_library(${target} STATIC ${L_SOURCES})
  sdxl_layer_view(${name})
  if(L_INCLUDE)
    target_include_directories(${target} PUBLIC ${CMAKE_SOURCE_DIR}/${L_INCLUDE} PRIVATE ${SDXL_LAYER_VIEWS}/${name})
    set(thirdparty_scope PRIVATE)
  else()
    target_include_directories(${target} PUBLIC ${SDXL_LAYER_VIEWS}/${name})
    set(thirdparty_scope PUBLIC)
  endif()
  set(pub "")
  set(priv "")
  foreach(dep IN LISTS L_PUBLIC)
    list(APPEND pub sdxl_${dep})
  endforeach()
  foreach(dep IN LISTS L_PRIVATE)
    list(APPEND priv sdxl_${dep})
  endforeach()
  target_link_libraries(${target} PUBLIC ${pub} ${thirdparty_scope} sdxl_thirdparty PRIVATE ${priv} sdxl_warnings)
  if(L_TORCH)
    # Public: the layer's headers may name torch types.
    target_link_libraries(${target} PUBLIC torch_iface)
    if(SDXL_USE_PCH)
      if(SDXL_PCH_OWNER STREQUAL "")
        target_precompile_headers(${target} PRIVATE ${CMAKE_SOURCE_DIR}/cmake/torch_pch.h)
        target_compile_options(${target} PRIVATE -fpch-preprocess)
        set(SDXL_PCH_OWNER ${target} CACHE INTERNAL "")
      else()
        target_precompile_headers(${target} REUSE_FROM ${SDXL_PCH_OWNER})
        target_compile_options(${target} PRIVATE -fpch-preprocess)
      endif()
    endif()
  endif()
endfunction()
