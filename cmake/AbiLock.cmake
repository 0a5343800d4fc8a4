# The ABI lock: sdk/abi.lock records kAbiVersion and a SHA-256 of the public SDK headers with
# comments and all whitespace removed (the ABI surface: every class layout, virtual and signature a
# plugin compiles against). Any other change to those headers must come with a bump.
#
#   cmake -DSOURCE_DIR=<repo> -P cmake/AbiLock.cmake              checks (the sdk.abi_lock test)
#   cmake -DSOURCE_DIR=<repo> -DUPDATE=ON -P cmake/AbiLock.cmake  rewrites the lock, and refuses
#                                                                  unless kAbiVersion was bumped
cmake_minimum_required(VERSION 3.22)
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)  # globs need an absolute folder
set(_headers_dir "${SOURCE_DIR}/sdk/include/sparsebit/sdk")
set(_lock "${SOURCE_DIR}/sdk/abi.lock")

file(GLOB _headers RELATIVE "${_headers_dir}" "${_headers_dir}/*.h")
list(SORT _headers)
set(_surface "")
foreach(_h IN LISTS _headers)
  file(READ "${_headers_dir}/${_h}" _text)
  string(REGEX REPLACE "\\\\\n" "" _text "${_text}")  # line continuations (macros)
  string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " _text "${_text}")  # block comments
  string(REGEX REPLACE "//[^\n]*" " " _text "${_text}")                   # line comments
  string(REGEX REPLACE "[ \t\r\n]+" "" _text "${_text}")  # all of it: formatting is no change
  string(APPEND _surface "== ${_h}\n${_text}\n")
endforeach()
string(SHA256 _hash "${_surface}")

file(STRINGS "${_headers_dir}/version.h" _abi_line REGEX "kAbiVersion = [0-9]+")
string(REGEX MATCH "kAbiVersion = ([0-9]+)" _ "${_abi_line}")
set(_abi "${CMAKE_MATCH_1}")
if(NOT _abi)
  message(FATAL_ERROR "sdk/include/sparsebit/sdk/version.h: no 'kAbiVersion = N' found")
endif()

set(_locked_abi "")
set(_locked_hash "")
if(EXISTS "${_lock}")
  file(STRINGS "${_lock}" _lines)
  foreach(_l IN LISTS _lines)
    if(_l MATCHES "^abi_version = ([0-9]+)$")
      set(_locked_abi "${CMAKE_MATCH_1}")
    elseif(_l MATCHES "^headers_sha256 = ([0-9a-f]+)$")
      set(_locked_hash "${CMAKE_MATCH_1}")
    endif()
  endforeach()
endif()

if(UPDATE)
  if(_hash STREQUAL _locked_hash)
    message(STATUS "sdk/abi.lock is up to date (ABI ${_abi})")
    return()
  endif()
  if(_locked_abi AND NOT _abi GREATER _locked_abi)
    message(FATAL_ERROR "the SDK headers changed but kAbiVersion is still ${_abi} (locked: ${_locked_abi}): "
                        "bump kAbiVersion in sdk/include/sparsebit/sdk/version.h first")
  endif()
  file(WRITE "${_lock}"
    "# Written by cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake; checked by the sdk.abi_lock test.\n"
    "# The hash covers sdk/include/sparsebit/sdk/*.h without comments and whitespace: change one of\n"
    "# those headers and kAbiVersion must grow with the lock (docs/PLUGINS.md, Stability).\n"
    "abi_version = ${_abi}\n"
    "headers_sha256 = ${_hash}\n")
  message(STATUS "sdk/abi.lock: ABI ${_abi}, headers ${_hash}")
  return()
endif()

if(NOT _locked_hash)
  message(FATAL_ERROR "sdk/abi.lock is missing or unreadable: run cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
if(NOT _hash STREQUAL _locked_hash)
  message(FATAL_ERROR "the public SDK headers (sdk/include/sparsebit/sdk) changed since sdk/abi.lock was written "
                      "(ABI ${_locked_abi}). A plugin built before would load and call the wrong code. Bump "
                      "kAbiVersion in version.h (and the SDK minor version) and run "
                      "cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
if(NOT _abi STREQUAL _locked_abi)
  message(FATAL_ERROR "version.h says kAbiVersion = ${_abi}, sdk/abi.lock says ${_locked_abi}: "
                      "run cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
message(STATUS "SDK headers match sdk/abi.lock (ABI ${_abi})")
