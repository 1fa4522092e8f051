# LibTorch, taken from the torch of the Python that dtrain's package is built for, as one INTERFACE
# target: dtrain_torch (includes, libraries, ABI define). The C++ front end (src/train) and the
# extension (python/) link it, so both always match the torch that `import dtrain` will meet.
#
# Why not find_package(Torch): the PyPI wheel's CMake package is its CUDA build's, which needs the
# CUDA toolkit, cuDNN and friends at configure time (and fails without nvcc), while Debian's torch
# has none under the Python package. The four libraries named here are what torch's own
# cpp_extension links, and the layout (<torch>/include, <torch>/lib) is the same in both.
#
# Nothing here is cached: the same build folder may be reconfigured for another interpreter (a
# venv with torch 2.x after Debian's 1.13), and a cached path would link the old torch.
# Without a torch in Python, find_package(Torch) (libtorch-dev's) is the fallback, for C++ users.

function(_dtrain_query_python_torch out_var)
  set(script [=[
import os, torch
print(torch.__version__)
print(os.path.dirname(torch.__file__))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
]=])
  execute_process(COMMAND "${Python_EXECUTABLE}" -c "${script}"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    # pip's build isolation hides the environment's site-packages behind PYTHONPATH and
    # PYTHONNOUSERSITE; the interpreter is still the target environment's, so ask without them.
    execute_process(
      COMMAND "${CMAKE_COMMAND}" -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
        "${Python_EXECUTABLE}" -c "${script}"
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
  endif()
  if(rc EQUAL 0)
    string(REPLACE "\n" ";" out "${out}")
    set(${out_var} "${out}" PARENT_SCOPE)
  else()
    set(${out_var} "" PARENT_SCOPE)
  endif()
endfunction()

_dtrain_query_python_torch(_dtrain_torch_facts)
add_library(dtrain_torch INTERFACE)

if(_dtrain_torch_facts)
  list(GET _dtrain_torch_facts 0 DTRAIN_TORCH_VERSION)
  list(GET _dtrain_torch_facts 1 DTRAIN_TORCH_DIR)
  list(GET _dtrain_torch_facts 2 _dtrain_torch_abi)
  if(NOT _dtrain_torch_abi EQUAL 1)
    message(FATAL_ERROR
      "torch ${DTRAIN_TORCH_VERSION} at ${DTRAIN_TORCH_DIR} uses the pre-C++11 std::string ABI; "
      "dtrain links Debian's C++ libraries and needs a CXX11-ABI torch (PyPI's 2.7 or later, or "
      "Debian's python3-torch)")
  endif()
  set(_lib "${DTRAIN_TORCH_DIR}/lib")
  set(DTRAIN_TORCH_PYTHON_LIBRARY "${_lib}/libtorch_python.so")
  foreach(file IN ITEMS "${_lib}/libc10.so" "${_lib}/libtorch_cpu.so" "${_lib}/libtorch.so"
                        "${DTRAIN_TORCH_PYTHON_LIBRARY}")
    if(NOT EXISTS "${file}")
      message(FATAL_ERROR "torch ${DTRAIN_TORCH_VERSION} at ${DTRAIN_TORCH_DIR} has no ${file}")
    endif()
  endforeach()
  # SYSTEM: torch's own headers are not held to dtrain's warning flags. They come before
  # /usr/include, where libtorch-dev may have put another version's headers.
  target_include_directories(dtrain_torch SYSTEM INTERFACE
    "${DTRAIN_TORCH_DIR}/include" "${DTRAIN_TORCH_DIR}/include/torch/csrc/api/include")
  target_compile_definitions(dtrain_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
  # Debian's libgloo comes first: PyPI's libtorch_cpu exports a Gloo of its own (other version,
  # same symbols), and the library listed first wins the dynamic linker's lookup, for dtrain's
  # Gloo calls and for libgloo's calls into itself alike.
  # libtorch.so is kept even by linkers that drop unreferenced libraries (Ubuntu's --as-needed):
  # in a CUDA build it is what loads libtorch_cuda, whose kernels register themselves when loaded.
  target_link_libraries(dtrain_torch INTERFACE gloo
    "-Wl,--push-state,--no-as-needed" "${_lib}/libtorch.so" "-Wl,--pop-state"
    "${_lib}/libtorch_cpu.so" "${_lib}/libc10.so" Threads::Threads)
  message(STATUS "LibTorch: torch ${DTRAIN_TORCH_VERSION} of ${Python_EXECUTABLE} (${DTRAIN_TORCH_DIR})")
else()
  find_package(Torch REQUIRED)
  set(DTRAIN_TORCH_VERSION "${Torch_VERSION}")
  set(DTRAIN_TORCH_DIR "")
  find_library(DTRAIN_TORCH_PYTHON_LIBRARY torch_python HINTS "${TORCH_INSTALL_PREFIX}/lib")
  target_link_libraries(dtrain_torch INTERFACE ${TORCH_LIBRARIES})
  message(STATUS "LibTorch: find_package(Torch) in ${Torch_DIR} (${Python_EXECUTABLE} has no torch)")
endif()
