# One precompiled header of the torch headers Kiln uses, shared by every torch-using target so
# the 2-core build parses them once.
add_library(kiln_torch_pch OBJECT ${CMAKE_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(kiln_torch_pch PRIVATE torch)
target_precompile_headers(kiln_torch_pch PRIVATE
  <ATen/core/Tensor.h> <ATen/Functions.h> <torch/nn/module.h> <vector> <string> <memory>)

function(kiln_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM kiln_torch_pch)
  # The PCH is built -fPIC; executables default to -fPIE, which GCC treats as a mismatch.
  target_compile_options(${target} PRIVATE -fPIC)
endfunction()

# Sources whose loops use ATen's parallel_for. It is inline, and opens its OpenMP region only in
# a translation unit compiled with OpenMP: without it every "parallel" loop runs on the calling
# thread while torch's other intra-op threads spin at their barrier. These sources are compiled
# with -fopenmp, so outside the PCH (built without it), and the target links the OpenMP runtime
# by its soname, libgomp.so.1, which libtorch_cpu has already loaded (the wheel's copy): one
# runtime and one thread team in the process, sized by at::set_num_threads.
find_package(OpenMP REQUIRED COMPONENTS CXX)
function(kiln_openmp_sources target)
  set_source_files_properties(${ARGN} TARGET_DIRECTORY ${target} PROPERTIES
                              SKIP_PRECOMPILE_HEADERS ON COMPILE_OPTIONS "${OpenMP_CXX_FLAGS}")
  target_link_libraries(${target} PRIVATE ${OpenMP_CXX_LIB_NAMES})
endfunction()
