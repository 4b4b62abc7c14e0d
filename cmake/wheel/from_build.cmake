# The wheel of an existing build tree (KILN_WHEEL_FROM, top-level CMakeLists.txt): building
# this project brings that tree's installable files up to date (ninja: a no-op when they are);
# installing it runs that tree's install, stripped, into this prefix, then kiln_wheel_fixup.
# The tree must be a build of this checkout (the wheel takes the Python package from here).
include(${CMAKE_CURRENT_LIST_DIR}/KilnWheel.cmake)
get_filename_component(_from "${KILN_WHEEL_FROM}" ABSOLUTE BASE_DIR "${CMAKE_SOURCE_DIR}")
if(NOT EXISTS "${_from}/CMakeCache.txt")
  message(FATAL_ERROR "KILN_WHEEL_FROM=${KILN_WHEEL_FROM}: no CMakeCache.txt in ${_from}; "
                      "build it first (scripts/build.sh release kiln_installable)")
endif()
load_cache("${_from}" READ_WITH_PREFIX _from_ CMAKE_HOME_DIRECTORY TORCH_LIBRARY
           CMAKE_INSTALL_LIBDIR)
file(REAL_PATH "${_from_CMAKE_HOME_DIRECTORY}" _from_src)
file(REAL_PATH "${CMAKE_SOURCE_DIR}" _this_src)
if(NOT _from_src STREQUAL _this_src)
  message(FATAL_ERROR "KILN_WHEEL_FROM=${_from} is a build of ${_from_src}, not of ${_this_src}")
endif()
# The wheel's layout (pyproject.toml, kiln/_capi.py) has lib/, not lib64/ or lib/<multiarch>.
if(NOT _from_CMAKE_INSTALL_LIBDIR STREQUAL "lib")
  message(FATAL_ERROR "${_from} installs into ${_from_CMAKE_INSTALL_LIBDIR}, not lib: "
                      "configure it with -DCMAKE_INSTALL_LIBDIR=lib")
endif()
if(NOT _from_TORCH_LIBRARY)
  message(FATAL_ERROR "${_from}: no TORCH_LIBRARY in its cache")
endif()
get_filename_component(_from_torch_lib_dir "${_from_TORCH_LIBRARY}" DIRECTORY)

# The name pyproject.toml's build.targets asks for.
add_custom_target(kiln_installable ALL
                  COMMAND ${CMAKE_COMMAND} --build "${_from}" --target kiln_installable
                  USES_TERMINAL)
install(CODE "execute_process(COMMAND \"${CMAKE_COMMAND}\" --install \"${_from}\" --prefix
                                      \"\${CMAKE_INSTALL_PREFIX}\" --strip
                              OUTPUT_QUIET COMMAND_ERROR_IS_FATAL ANY)")
kiln_wheel_fixup("${_from_torch_lib_dir}")
