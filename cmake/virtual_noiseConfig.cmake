# CMake package config for C++ consumers of the virtual_noise operators:
#   find_package(virtual_noise REQUIRED)
#   target_link_libraries(app PRIVATE virtual_noise::ops)
# Point CMAKE_PREFIX_PATH at both torch.utils.cmake_prefix_path and
# virtual_noise.cmake_prefix_path (python -m virtual_noise cmake-prefix-path).
include(CMakeFindDependencyMacro)
find_dependency(Torch)

get_filename_component(_vn_root "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET virtual_noise::ops)
  add_library(virtual_noise::ops SHARED IMPORTED)
  set_target_properties(virtual_noise::ops PROPERTIES
    IMPORTED_LOCATION "${_vn_root}/lib/libvirtual_noise_ops.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_vn_root}/include"
    INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES}"
    # The operators register themselves when the library loads; keep it linked
    # even if a program only calls them through TorchScript or the dispatcher.
    INTERFACE_LINK_OPTIONS "LINKER:--no-as-needed")
endif()
set(virtual_noise_FOUND TRUE)
unset(_vn_root)
