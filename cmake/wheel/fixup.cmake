# Install-time script (kiln_wheel_fixup): the install under CMAKE_INSTALL_PREFIX, which is
# site-packages/kiln in a wheel, becomes the wheel's layout.
#
# 1. RUNPATHs relative to the wheel: every entry naming torch's venv
#    (<site-packages>/torch/lib, <site-packages>/nvidia/cu13/lib) becomes the same folder from the
#    file's own folder, $ORIGIN/<up to site-packages>/torch/lib, so the installed wheel uses the
#    torch wheel beside it, wherever that venv is. Kiln's own $ORIGIN entries stay. An absolute
#    entry outside torch's site-packages is an error: no machine but this one would have it.
# 2. One libkiln file: a wheel cannot hold symbolic links (each would become a copy), so
#    lib/libkiln.so.1 (the soname, what the loader looks for) is the file itself; the link-time
#    name libkiln.so and the full version go, and the CMake export (Kiln::kiln) and kiln.pc
#    (-l:libkiln.so.1) name libkiln.so.1 instead.
#
# Input: KILN_WHEEL_TORCH_LIB_DIR, the torch/lib folder the files were linked against.
cmake_minimum_required(VERSION 3.25)

set(_prefix "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}")
get_filename_component(_wheel_site "${_prefix}/.." ABSOLUTE)
get_filename_component(_torch_site "${KILN_WHEEL_TORCH_LIB_DIR}/../.." REALPATH)

# ---- 2. one libkiln file ----
set(_lib "${_prefix}/lib")
if(IS_SYMLINK "${_lib}/libkiln.so")
  file(REMOVE "${_lib}/libkiln.so")
endif()
if(IS_SYMLINK "${_lib}/libkiln.so.1")
  file(REAL_PATH "${_lib}/libkiln.so.1" _real)
  get_filename_component(_real_name "${_real}" NAME)
  file(REMOVE "${_lib}/libkiln.so.1")
  file(RENAME "${_real}" "${_lib}/libkiln.so.1")
  file(GLOB _exports "${_lib}/cmake/Kiln/KilnTargets-*.cmake")
  foreach(_file ${_exports})
    file(READ "${_file}" _text)
    string(REPLACE "/lib/${_real_name}\"" "/lib/libkiln.so.1\"" _text "${_text}")
    file(WRITE "${_file}" "${_text}")
  endforeach()
endif()
if(NOT EXISTS "${_lib}/libkiln.so.1" OR IS_SYMLINK "${_lib}/libkiln.so.1")
  message(FATAL_ERROR "wheel: no lib/libkiln.so.1 file under ${_prefix}")
endif()
set(_pc "${_lib}/pkgconfig/kiln.pc")
if(EXISTS "${_pc}")
  file(READ "${_pc}" _text)
  string(REPLACE " -lkiln" " -l:libkiln.so.1" _text "${_text}")
  file(WRITE "${_pc}" "${_text}")
endif()

# ---- 1. RUNPATHs relative to the wheel ----
file(GLOB_RECURSE _files LIST_DIRECTORIES false "${_prefix}/*")
set(_elves 0)
foreach(_file ${_files})
  if(IS_SYMLINK "${_file}")
    continue()
  endif()
  file(READ "${_file}" _magic LIMIT 4 HEX)
  if(NOT _magic STREQUAL "7f454c46")
    continue()
  endif()
  math(EXPR _elves "${_elves} + 1")
  file(READ_ELF "${_file}" RUNPATH _runpath RPATH _rpath)
  if(_rpath)
    message(FATAL_ERROR "wheel: ${_file} has DT_RPATH ${_rpath}; Kiln links with DT_RUNPATH")
  endif()
  string(REPLACE ":" ";" _entries "${_runpath}")
  get_filename_component(_dir "${_file}" DIRECTORY)
  file(RELATIVE_PATH _up "${_dir}" "${_wheel_site}")
  string(REGEX REPLACE "/$" "" _up "${_up}")
  set(_new "")
  foreach(_entry ${_entries})
    if(_entry MATCHES "^\\$ORIGIN")
      list(APPEND _new "${_entry}")
    elseif(IS_ABSOLUTE "${_entry}")
      get_filename_component(_real "${_entry}" REALPATH)
      file(RELATIVE_PATH _in_site "${_torch_site}" "${_real}")
      if(_in_site MATCHES "^\\.\\." OR IS_ABSOLUTE "${_in_site}")
        message(FATAL_ERROR "wheel: ${_file}: RUNPATH entry ${_entry} is outside torch's "
                            "site-packages ${_torch_site}")
      endif()
      list(APPEND _new "$ORIGIN/${_up}/${_in_site}")
    else()
      message(FATAL_ERROR "wheel: ${_file}: RUNPATH entry '${_entry}' is neither absolute nor "
                          "$ORIGIN-relative")
    endif()
  endforeach()
  list(REMOVE_DUPLICATES _new)
  string(JOIN ":" _new_runpath ${_new})
  if(NOT _new_runpath STREQUAL _runpath)
    file(RPATH_SET FILE "${_file}" NEW_RPATH "${_new_runpath}")
  endif()
endforeach()
if(_elves LESS 3)
  message(FATAL_ERROR "wheel: only ${_elves} ELF files under ${_prefix}")
endif()
message(STATUS "wheel: ${_elves} ELF files find torch relative to ${_wheel_site}")
