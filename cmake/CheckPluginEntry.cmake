# cmake -DPLUGIN=<file> -DNM=<nm> -P CheckPluginEntry.cmake
# Fails the build (and removes the file) when a plugin does not export its entry point, so a
# plugin the host would refuse never gets installed.
execute_process(COMMAND "${NM}" -D --defined-only "${PLUGIN}" OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT symbols MATCHES "sparsebit_plugin_descriptor")
  file(REMOVE "${PLUGIN}")
  message(FATAL_ERROR "${PLUGIN} does not export sparsebit_plugin_descriptor: end one source file of the "
                      "plugin with SPARSEBIT_PLUGIN(\"name\", \"version\", register_function)")
endif()
