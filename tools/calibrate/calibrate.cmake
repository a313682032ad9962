# tools/calibrate: xmoec-calibrate, which measures the machine it runs on
# for the cost model (GEMMs, memory bandwidth, call overhead, collectives)
# with the runtime out/train links: the CPU backend and kernels, the
# communicator and the driver's OpenBLAS core choice. Included by the top
# CMakeLists.txt after the runtime's targets exist; its sources are picked
# up by folder like every other tool's.
file(GLOB XM_CALIBRATE_SRCS CONFIGURE_DEPENDS ${XM_ROOT}/tools/calibrate/*.c)
add_executable(xmoec-calibrate ${XM_CALIBRATE_SRCS})
# The triad and the kernels' thread team are OpenMP; cJSON writes the
# profile and reads --shapes.
target_link_libraries(xmoec-calibrate PRIVATE xm_runtime xm_frontend xm_support ${XM_CJSON_LIBS}
                      MPI::MPI_C OpenMP::OpenMP_C PkgConfig::OPENBLAS m)
