# sparsebit_add_plugin(NAME SOURCES src... [LIBRARIES lib...] [VERSION x.y.z] [TESTS test.cpp...])
#
# Builds a Sparsebit plugin: a shared object named sparsebit_<NAME>.so with hidden visibility,
# linked against the SDK library (libsparsebit_sdk) and the shared LibTorch only, placed where the host finds it
# (the build's plugin folder, installed to <libdir>/sparsebit/plugins). The same function serves
# in-tree plugins and out-of-tree ones built with find_package(Sparsebit). After linking it checks
# that the module exports the entry point (SPARSEBIT_PLUGIN). The sources see the plugin's version
# as SPARSEBIT_PLUGIN_VERSION: VERSION, else the enclosing project's version, else 0.0.0.
#
# TESTS are the plugin's own tests, kept in its folder. Inside Sparsebit's tree
# (SPARSEBIT_PLUGIN_TESTS_IN_HOST set) they join Sparsebit's GoogleTest binary, which loads the
# built plugins through the registry. Out of tree each file becomes a program of its own, linked
# with the plugin's sources, the SDK and LibTorch (a non-zero exit is a failure), run by ctest as
# <NAME>.<file name>. Both see SPARSEBIT_PLUGIN_FILE, the built plugin's path, which the SDK's test
# kit opens (sparsebit/sdk/testing.h), so a test written against the kit builds in either place.
set(_SPARSEBIT_CMAKE_DIR "${CMAKE_CURRENT_LIST_DIR}")
function(sparsebit_add_plugin name)
  cmake_parse_arguments(ARG "" "VERSION" "SOURCES;LIBRARIES;TESTS" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "sparsebit_add_plugin(${name}): SOURCES is required")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  # The SDK alone: a call into the core (QuantModel, prune(), the registry) fails to link.
  if(TARGET sparsebit_sdk)
    target_link_libraries(${name} PRIVATE sparsebit_sdk)
  else()
    target_link_libraries(${name} PRIVATE Sparsebit::sdk)
  endif()
  target_link_libraries(${name} PRIVATE torch ${ARG_LIBRARIES})
  if(NOT ARG_VERSION)
    set(ARG_VERSION "${PROJECT_VERSION}")
  endif()
  if(NOT ARG_VERSION)
    set(ARG_VERSION "0.0.0")  # neither given: sources that name their version keep working
  endif()
  target_compile_definitions(${name} PRIVATE SPARSEBIT_PLUGIN_VERSION="${ARG_VERSION}")
  if(TARGET sparsebit_pch)
    target_precompile_headers(${name} REUSE_FROM sparsebit_pch)
  endif()
  if(NOT DEFINED SPARSEBIT_PLUGIN_OUTPUT_DIR)
    set(SPARSEBIT_PLUGIN_OUTPUT_DIR ${CMAKE_BINARY_DIR}/plugins)
  endif()
  if(NOT DEFINED SPARSEBIT_PLUGIN_SUBDIR)
    include(GNUInstallDirs)
    set(SPARSEBIT_PLUGIN_SUBDIR ${CMAKE_INSTALL_LIBDIR}/sparsebit/plugins)
  endif()
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    OUTPUT_NAME "sparsebit_${name}"
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${SPARSEBIT_PLUGIN_OUTPUT_DIR}
    # plugins/ -> sparsebit/ -> lib/, where libsparsebit_sdk.so lives
    INSTALL_RPATH "$ORIGIN/../..")
  # Unresolved symbols are an error at link time, not a refusal at load time.
  target_link_options(${name} PRIVATE "LINKER:--no-undefined")
  find_program(SPARSEBIT_NM NAMES ${CMAKE_NM} nm)
  add_custom_command(TARGET ${name} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DPLUGIN=$<TARGET_FILE:${name}> -DNM=${SPARSEBIT_NM}
            -P ${_SPARSEBIT_CMAKE_DIR}/CheckPluginEntry.cmake
    VERBATIM)
  install(TARGETS ${name} LIBRARY DESTINATION ${SPARSEBIT_PLUGIN_SUBDIR})
  # The sidecar the host reads to apply [plugins] enable/disable before opening the library
  # (loading runs its constructors): the name given to SPARSEBIT_PLUGIN in the sources.
  set(_plugin_name "")
  foreach(_src IN LISTS ARG_SOURCES)
    get_filename_component(_abs "${_src}" ABSOLUTE)
    if(EXISTS "${_abs}")
      file(STRINGS "${_abs}" _lines REGEX "^SPARSEBIT_PLUGIN\\(\"[^\"]+\"")
      if(_lines)
        list(GET _lines 0 _line)
        string(REGEX REPLACE "^SPARSEBIT_PLUGIN\\(\"([^\"]+)\".*" "\\1" _plugin_name "${_line}")
      endif()
    endif()
  endforeach()
  if(_plugin_name)
    set(_sidecar "${SPARSEBIT_PLUGIN_OUTPUT_DIR}/sparsebit_${name}.plugin")
    file(WRITE "${_sidecar}" "${_plugin_name}\n")
    install(FILES "${_sidecar}" DESTINATION ${SPARSEBIT_PLUGIN_SUBDIR})
  endif()
  set_property(GLOBAL APPEND PROPERTY SPARSEBIT_PLUGIN_TARGETS ${name})
  _sparsebit_plugin_tests(${name})
endfunction()

macro(_sparsebit_plugin_tests name)
  foreach(_test IN LISTS ARG_TESTS)
    get_filename_component(_test_abs "${_test}" ABSOLUTE)
    if(SPARSEBIT_PLUGIN_TESTS_IN_HOST)
      set_property(GLOBAL APPEND PROPERTY SPARSEBIT_PLUGIN_TEST_SOURCES "${_test_abs}")
      set_property(GLOBAL APPEND PROPERTY SPARSEBIT_PLUGIN_TEST_TARGETS "${name}")
    else()
      get_filename_component(_test_name "${_test}" NAME_WE)
      set(_exe ${name}_${_test_name})
      set(_plugin_sources "")
      foreach(_src IN LISTS ARG_SOURCES)
        get_filename_component(_src_abs "${_src}" ABSOLUTE)
        list(APPEND _plugin_sources "${_src_abs}")
      endforeach()
      add_executable(${_exe} "${_test_abs}" ${_plugin_sources})
      if(TARGET sparsebit_sdk)
        target_link_libraries(${_exe} PRIVATE sparsebit_sdk)
      else()
        target_link_libraries(${_exe} PRIVATE Sparsebit::sdk)
      endif()
      target_link_libraries(${_exe} PRIVATE torch ${ARG_LIBRARIES})
      # The library under test (Note [Plugin test kit] in sparsebit/sdk/testing.h).
      target_compile_definitions(${_exe} PRIVATE SPARSEBIT_PLUGIN_VERSION="${ARG_VERSION}"
        SPARSEBIT_PLUGIN_FILE="$<TARGET_FILE:${name}>")
      add_dependencies(${_exe} ${name})
      add_test(NAME ${name}.${_test_name} COMMAND ${_exe})
    endif()
  endforeach()
endmacro()
