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
