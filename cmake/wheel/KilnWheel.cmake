# kiln_wheel_fixup(<torch lib dir>): an install rule, run after every rule declared before it,
# that turns the install under CMAKE_INSTALL_PREFIX (site-packages/kiln in a wheel) into the
# wheel's layout (fixup.cmake): RUNPATHs relative to the wheel, one libkiln file.
function(kiln_wheel_fixup torch_lib_dir)
  set(_script ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/fixup.cmake)
  install(CODE "set(KILN_WHEEL_TORCH_LIB_DIR \"${torch_lib_dir}\")\ninclude(\"${_script}\")")
endfunction()
