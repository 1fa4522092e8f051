# `cmake --install`: the dtrain and dtrain-train commands, the C++ libraries with the public headers
# (include/dtrain/, and nothing from src/) and a CMake package (find_package(dtrain): dtrain::kvstore,
# dtrain::collectives, dtrain::train, ...), and the Python package (python/CMakeLists.txt).
include(CMakePackageConfigHelpers)

# Library target -> exported name (dtrain::<name>), in dependency order.
set(dtrain_exported
  dtrain_common common
  dtrain_cuda cuda
  dtrain_auth auth
  dtrain_compression compression
  dtrain_report report
  dtrain_transport transport
  dtrain_optim optim
  dtrain_ps ps
  dtrain_collectives collectives
  dtrain_kvstore kvstore
  dtrain_train_data train_data
  dtrain_train_models train_models
  dtrain_train train)
set(targets)
while(dtrain_exported)
  list(POP_FRONT dtrain_exported target name)
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${name})
  list(APPEND targets ${target})
endwhile()
install(TARGETS ${targets} EXPORT dtrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS dtrain dtrain-train RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

# The public API only: <dtrain/kvstore/kvstore.h>, <dtrain/collectives/collectives.h>,
# <dtrain/train/trainer.h>, ... The libraries under them are installed (a static library's users
# link what it uses) but their headers are not.
install(DIRECTORY include/dtrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

set(config_dir ${CMAKE_INSTALL_LIBDIR}/cmake/dtrain)
install(EXPORT dtrainTargets NAMESPACE dtrain:: DESTINATION ${config_dir})
configure_package_config_file(cmake/dtrainConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dtrainConfig.cmake INSTALL_DESTINATION ${config_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dtrainConfig.cmake ${PROJECT_BINARY_DIR}/dtrainConfigVersion.cmake
  DESTINATION ${config_dir})

# `ninja dtrain_runtime`: only what the rules above install, for a set-up that runs dtrain without
# building its tests (scripts/build.sh run).
add_custom_target(dtrain_runtime)
add_dependencies(dtrain_runtime ${targets} dtrain dtrain-train dtrain_python)
