# The ABI lock: sdk/abi.lock records kAbiVersion and, for every SDK version of that ABI, a SHA-256
# of the public SDK headers with comments and all whitespace removed (the surface a plugin
# compiles against: every class layout, virtual and signature). A change to those headers must
# come with a new SDK version: a new minor version when it only adds (Note [Capabilities] in
# sparsebit/sdk/quantizer.h), a new kAbiVersion and major version when it breaks plugins.
#
#   cmake -DSOURCE_DIR=<repo> -P cmake/AbiLock.cmake              checks (the sdk.abi_lock test)
#   cmake -DSOURCE_DIR=<repo> -DUPDATE=ON -P cmake/AbiLock.cmake  records the headers under the
#                                   SDK version in version.h; refuses when that version already
#                                   has other headers recorded (bump it first)
#   cmake -DSOURCE_DIR=<repo> -DRELEASED=<dir> -P cmake/AbiLock.cmake
#                                   checks that <dir>/sparsebit/sdk holds the headers the lock
#                                   records for the version they declare, of this ABI
cmake_minimum_required(VERSION 3.22)
get_filename_component(SOURCE_DIR "${SOURCE_DIR}" ABSOLUTE)  # globs need an absolute folder
set(_lock "${SOURCE_DIR}/sdk/abi.lock")

# The surface hash and the versions declared by the headers in `dir`.
function(read_headers dir out_hash out_abi out_version)
  file(GLOB _headers RELATIVE "${dir}" "${dir}/*.h")
  list(SORT _headers)
  set(_surface "")
  foreach(_h IN LISTS _headers)
    file(READ "${dir}/${_h}" _text)
    string(REGEX REPLACE "\\\\\n" "" _text "${_text}")  # line continuations (macros)
    string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" " " _text "${_text}")  # block comments
    string(REGEX REPLACE "//[^\n]*" " " _text "${_text}")                   # line comments
    string(REGEX REPLACE "[ \t\r\n]+" "" _text "${_text}")  # all of it: formatting is no change
    string(APPEND _surface "== ${_h}\n${_text}\n")
  endforeach()
  string(SHA256 _hash "${_surface}")
  file(READ "${dir}/version.h" _version_h)
  foreach(_name AbiVersion SdkVersionMajor SdkVersionMinor)
    if(NOT _version_h MATCHES "k${_name} = ([0-9]+)")
      message(FATAL_ERROR "${dir}/version.h: no 'k${_name} = N' found")
    endif()
    set(_${_name} "${CMAKE_MATCH_1}")
  endforeach()
  set(${out_hash} "${_hash}" PARENT_SCOPE)
  set(${out_abi} "${_AbiVersion}" PARENT_SCOPE)
  set(${out_version} "${_SdkVersionMajor}.${_SdkVersionMinor}" PARENT_SCOPE)
endfunction()

read_headers("${SOURCE_DIR}/sdk/include/sparsebit/sdk" _hash _abi _version)

set(_locked_abi "")
set(_versions "")  # "1.0=<hash>;1.1=<hash>"
if(EXISTS "${_lock}")
  file(STRINGS "${_lock}" _lines)
  foreach(_l IN LISTS _lines)
    if(_l MATCHES "^abi_version = ([0-9]+)$")
      set(_locked_abi "${CMAKE_MATCH_1}")
    elseif(_l MATCHES "^sdk ([0-9]+\\.[0-9]+) = ([0-9a-f]+)$")
      list(APPEND _versions "${CMAKE_MATCH_1}=${CMAKE_MATCH_2}")
    endif()
  endforeach()
endif()
# The hash the lock records for SDK `version`, or "".
function(recorded version out)
  set(_found "")
  foreach(_v IN LISTS _versions)
    if(_v MATCHES "^${version}=(.*)$")
      set(_found "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out} "${_found}" PARENT_SCOPE)
endfunction()

if(RELEASED)
  get_filename_component(RELEASED "${RELEASED}" ABSOLUTE)
  read_headers("${RELEASED}/sparsebit/sdk" _rhash _rabi _rversion)
  recorded("${_rversion}" _rlocked)
  if(NOT _rabi STREQUAL _abi)
    message(FATAL_ERROR "${RELEASED}: headers of ABI ${_rabi}, this SDK is ABI ${_abi}: keep the last release of "
                        "this major version there")
  endif()
  if(NOT _rlocked)
    message(FATAL_ERROR "${RELEASED}: SDK ${_rversion} is not recorded in sdk/abi.lock")
  endif()
  if(NOT _rhash STREQUAL _rlocked)
    message(FATAL_ERROR "${RELEASED}: these are not the headers sdk/abi.lock records for SDK ${_rversion}")
  endif()
  message(STATUS "${RELEASED} holds the released headers of SDK ${_rversion}")
  return()
endif()

recorded("${_version}" _locked_hash)
if(UPDATE)
  if(_hash STREQUAL _locked_hash)
    message(STATUS "sdk/abi.lock is up to date (SDK ${_version}, ABI ${_abi})")
    return()
  endif()
  if(_locked_hash)
    message(FATAL_ERROR "the SDK headers changed but the SDK version is still ${_version}: bump kSdkVersionMinor in "
                        "sdk/include/sparsebit/sdk/version.h for an addition, or kAbiVersion and "
                        "kSdkVersionMajor for a change that breaks plugins (docs/PLUGINS.md, Stability)")
  endif()
  if(_locked_abi AND _abi LESS _locked_abi)
    message(FATAL_ERROR "kAbiVersion ${_abi} is below the locked ${_locked_abi}")
  endif()
  string(CONCAT _text "# Written by cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake; checked by the sdk.abi_lock test.\n"
            "# Per SDK version of this ABI, a hash of sdk/include/sparsebit/sdk/*.h without comments and\n"
            "# whitespace: a change to those headers needs a new SDK version (docs/PLUGINS.md, Stability).\n"
            "abi_version = ${_abi}\n")
  if(_locked_abi STREQUAL _abi)
    foreach(_v IN LISTS _versions)
      string(REPLACE "=" " = " _v "${_v}")
      string(APPEND _text "sdk ${_v}\n")
    endforeach()
  endif()
  string(APPEND _text "sdk ${_version} = ${_hash}\n")
  file(WRITE "${_lock}" "${_text}")
  message(STATUS "sdk/abi.lock: SDK ${_version} (ABI ${_abi}), headers ${_hash}")
  return()
endif()

if(NOT _versions)
  message(FATAL_ERROR "sdk/abi.lock is missing or unreadable: run cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
if(NOT _abi STREQUAL _locked_abi)
  message(FATAL_ERROR "version.h says kAbiVersion = ${_abi}, sdk/abi.lock says ${_locked_abi}: "
                      "run cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
if(NOT _locked_hash)
  message(FATAL_ERROR "SDK ${_version} is not recorded in sdk/abi.lock: run "
                      "cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
if(NOT _hash STREQUAL _locked_hash)
  message(FATAL_ERROR "the public SDK headers (sdk/include/sparsebit/sdk) changed since sdk/abi.lock recorded SDK "
                      "${_version}. A plugin built before would load and call the wrong code. Bump "
                      "kSdkVersionMinor in version.h for an addition (or kAbiVersion and kSdkVersionMajor for a "
                      "breaking change) and run cmake -DSOURCE_DIR=. -DUPDATE=ON -P cmake/AbiLock.cmake")
endif()
message(STATUS "SDK headers match sdk/abi.lock (SDK ${_version}, ABI ${_abi})")
