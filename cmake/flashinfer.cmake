# FlashInfer's CUDA headers, from the pinned PyPI wheel (flashinfer-python), for CUDA builds.
#
#   ICECACHE_FLASHINFER        AUTO (default): fetch when CUDA is compiled in; a failure (no network,
#                              no pip) is a warning and the build goes on without FlashInfer.
#                              ON: a failure stops the configure. OFF: never.
#   ICECACHE_FLASHINFER_WHEEL  a local copy of the pinned wheel (a machine without network: a GPU
#                              lease); empty: `pip download` into the build tree.
#
# The wheel (~100 MB, a zip) is checked against its SHA-256 and only the headers FlashInfer's
# kernels include are extracted into <build>/_deps/flashinfer-<version>/: flashinfer/data/include
# and the CCCL that FlashInfer ships (flashinfer/data/cccl; 0.7.4 needs a newer libcu++ than CUDA
# 13.0's, e.g. cuda::fast_mod_div). Defines the INTERFACE target icecache_flashinfer (those
# include dirs, as SYSTEM, FlashInfer's CCCL before the toolkit's) when it succeeds. Link it only
# to FlashInfer code: the shipped CCCL must not reach our other kernels.
set(ICECACHE_FLASHINFER "AUTO" CACHE STRING "FlashInfer headers for CUDA builds: AUTO, ON or OFF")
set_property(CACHE ICECACHE_FLASHINFER PROPERTY STRINGS AUTO ON OFF)
set(ICECACHE_FLASHINFER_WHEEL "" CACHE FILEPATH "Local flashinfer-python wheel (empty: pip download)")

set(ICECACHE_FLASHINFER_VERSION 0.7.4)
set(ICECACHE_FLASHINFER_SHA256 a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32)

function(icecache_fetch_flashinfer)
  set(_name flashinfer_python-${ICECACHE_FLASHINFER_VERSION}-py3-none-any.whl)
  set(_root ${CMAKE_BINARY_DIR}/_deps/flashinfer-${ICECACHE_FLASHINFER_VERSION})
  set(_include ${_root}/flashinfer/data/include)
  set(_cccl ${_root}/flashinfer/data/cccl)
  if(NOT EXISTS ${_root}/.extracted)
    set(_wheel ${ICECACHE_FLASHINFER_WHEEL})
    if(NOT _wheel)
      set(_wheel ${CMAKE_BINARY_DIR}/_deps/wheels/${_name})
      if(NOT EXISTS ${_wheel})
        find_package(Python3 COMPONENTS Interpreter QUIET)
        if(NOT Python3_Interpreter_FOUND)
          set(ICECACHE_FLASHINFER_ERROR "no python3 to run pip download" PARENT_SCOPE)
          return()
        endif()
        message(STATUS "icecache: downloading flashinfer-python ${ICECACHE_FLASHINFER_VERSION} (pip)")
        execute_process(
          COMMAND ${Python3_EXECUTABLE} -m pip download --no-deps --only-binary=:all: -q
                  -d ${CMAKE_BINARY_DIR}/_deps/wheels flashinfer-python==${ICECACHE_FLASHINFER_VERSION}
          RESULT_VARIABLE _rc OUTPUT_QUIET ERROR_VARIABLE _err TIMEOUT 600)
        if(NOT _rc EQUAL 0 OR NOT EXISTS ${_wheel})
          string(STRIP "${_err}" _err)
          set(ICECACHE_FLASHINFER_ERROR "pip download failed (${_rc}): ${_err}" PARENT_SCOPE)
          return()
        endif()
      endif()
    endif()
    if(NOT EXISTS ${_wheel})
      set(ICECACHE_FLASHINFER_ERROR "${_wheel} does not exist" PARENT_SCOPE)
      return()
    endif()
    file(SHA256 ${_wheel} _sha)
    if(NOT _sha STREQUAL ICECACHE_FLASHINFER_SHA256)
      set(ICECACHE_FLASHINFER_ERROR "${_wheel}: SHA-256 ${_sha}, expected ${ICECACHE_FLASHINFER_SHA256}" PARENT_SCOPE)
      return()
    endif()
    file(REMOVE_RECURSE ${_root})
    file(ARCHIVE_EXTRACT INPUT ${_wheel} DESTINATION ${_root}
         PATTERNS flashinfer/data/include flashinfer/data/cccl
                  flashinfer_python-${ICECACHE_FLASHINFER_VERSION}.dist-info/licenses/LICENSE)
    if(NOT EXISTS ${_include}/flashinfer/page.cuh)
      set(ICECACHE_FLASHINFER_ERROR "${_wheel}: no flashinfer/data/include/flashinfer/page.cuh" PARENT_SCOPE)
      return()
    endif()
    file(TOUCH ${_root}/.extracted)
  endif()
  add_library(icecache_flashinfer INTERFACE)
  target_include_directories(icecache_flashinfer SYSTEM BEFORE INTERFACE
    ${_cccl}/libcudacxx/include ${_cccl}/cub ${_cccl}/thrust ${_include})
  set(ICECACHE_FLASHINFER_ERROR "" PARENT_SCOPE)
endfunction()

set(ICECACHE_WITH_FLASHINFER OFF)
if(ICECACHE_WITH_CUDA AND NOT ICECACHE_FLASHINFER STREQUAL "OFF")
  icecache_fetch_flashinfer()
  if(TARGET icecache_flashinfer)
    set(ICECACHE_WITH_FLASHINFER ON)
    message(STATUS "icecache: FlashInfer ${ICECACHE_FLASHINFER_VERSION} headers from the pinned wheel")
  elseif(ICECACHE_FLASHINFER STREQUAL "ON")
    message(FATAL_ERROR "icecache: FlashInfer headers unavailable: ${ICECACHE_FLASHINFER_ERROR}")
  else()
    message(WARNING "icecache: building without FlashInfer: ${ICECACHE_FLASHINFER_ERROR}")
  endif()
endif()
