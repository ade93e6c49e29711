# Structured outputs (vLLM's `structured_outputs`, `response_format`): grammar-constrained decoding through xgrammar
# (https://github.com/mlc-ai/xgrammar, Apache-2.0), the library behind vLLM's default structured-output backend.
# Its C++ core is built from the PyPI source archive as a static library `xgrammar` (C++17, no Python bindings).
#
# SSMSERVE_STRUCTURED_OUTPUTS: AUTO (default) builds it when the archive is in .deps/ or can be downloaded, else
# builds ssmserve without structured outputs (requests that ask for them get an error saying so); ON requires it;
# OFF leaves it out. The archive is checked against its SHA-256. Offline machines: put the archive in
# ${CMAKE_SOURCE_DIR}/.deps/ (scripts/install-deps.sh downloads it there).
set(SSMSERVE_STRUCTURED_OUTPUTS "AUTO" CACHE STRING "Structured outputs (xgrammar): AUTO, ON or OFF")
set(SSMSERVE_XGRAMMAR_VERSION 0.2.9)
set(SSMSERVE_XGRAMMAR_SHA256 87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90)
set(SSMSERVE_XGRAMMAR_URL
    "https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${SSMSERVE_XGRAMMAR_VERSION}.tar.gz")

set(SSMSERVE_HAVE_XGRAMMAR OFF)
if(NOT SSMSERVE_STRUCTURED_OUTPUTS STREQUAL "OFF")
  set(xg_archive ${CMAKE_SOURCE_DIR}/.deps/xgrammar-${SSMSERVE_XGRAMMAR_VERSION}.tar.gz)
  if(EXISTS ${xg_archive})
    file(SHA256 ${xg_archive} xg_have)
    if(NOT xg_have STREQUAL SSMSERVE_XGRAMMAR_SHA256)
      file(REMOVE ${xg_archive})
    endif()
  endif()
  if(NOT EXISTS ${xg_archive})
    message(STATUS "structured outputs: downloading xgrammar ${SSMSERVE_XGRAMMAR_VERSION}")
    file(DOWNLOAD ${SSMSERVE_XGRAMMAR_URL} ${xg_archive}.part EXPECTED_HASH SHA256=${SSMSERVE_XGRAMMAR_SHA256}
         STATUS xg_status TLS_VERIFY ON TIMEOUT 120)
    list(GET xg_status 0 xg_code)
    if(xg_code EQUAL 0)
      file(RENAME ${xg_archive}.part ${xg_archive})
    else()
      file(REMOVE ${xg_archive}.part)
    endif()
  endif()
  if(EXISTS ${xg_archive})
    set(xg_root ${CMAKE_BINARY_DIR}/_deps/xgrammar-${SSMSERVE_XGRAMMAR_VERSION})
    if(NOT EXISTS ${xg_root}/include/xgrammar/xgrammar.h)
      file(ARCHIVE_EXTRACT INPUT ${xg_archive} DESTINATION ${CMAKE_BINARY_DIR}/_deps)
    endif()
    file(GLOB_RECURSE xg_srcs ${xg_root}/cpp/*.cc)
    list(FILTER xg_srcs EXCLUDE REGEX "/cpp/tvm_ffi/")  # the Python bindings
    add_library(xgrammar STATIC ${xg_srcs})
    set_target_properties(xgrammar PROPERTIES CXX_STANDARD 17 POSITION_INDEPENDENT_CODE ON)
    target_compile_options(xgrammar PRIVATE -w)  # third-party code: its warnings are not ours to fix
    target_include_directories(xgrammar PUBLIC ${xg_root}/include)
    target_include_directories(xgrammar SYSTEM PUBLIC ${xg_root}/3rdparty/picojson ${xg_root}/3rdparty/dlpack/include)
    target_compile_definitions(xgrammar PUBLIC XGRAMMAR_ENABLE_CPPTRACE=0 XGRAMMAR_ENABLE_INTERNAL_CHECK=0)
    set(SSMSERVE_HAVE_XGRAMMAR ON)
    message(STATUS "structured outputs: ON (xgrammar ${SSMSERVE_XGRAMMAR_VERSION})")
  elseif(SSMSERVE_STRUCTURED_OUTPUTS STREQUAL "ON")
    message(FATAL_ERROR "SSMSERVE_STRUCTURED_OUTPUTS=ON: xgrammar ${SSMSERVE_XGRAMMAR_VERSION} could not be downloaded "
                        "(${xg_status}); put ${SSMSERVE_XGRAMMAR_URL} into ${CMAKE_SOURCE_DIR}/.deps/")
  else()
    message(WARNING "structured outputs: OFF (xgrammar could not be downloaded: ${xg_status}); requests asking for "
                    "structured outputs will get an error. Put the archive into ${CMAKE_SOURCE_DIR}/.deps/ to build them.")
  endif()
else()
  message(STATUS "structured outputs: OFF (SSMSERVE_STRUCTURED_OUTPUTS=OFF)")
endif()
