# Cross-building smol for 64-bit ARM Linux from x86-64 with Debian's
# g++-aarch64-linux-gnu; the tests run under qemu-user-static:
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#   cmake --build build-arm64 -j && ctest --test-dir build-arm64
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# The target's libraries from the cross toolchain; headers-only packages
# (doctest, CLI11, nlohmann-json, cpp-httplib) from the host's /usr/include.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# Test programs run through qemu (ctest, and the build's own steps).
find_program(SMOL_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(SMOL_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${SMOL_QEMU_AARCH64} -L
                                    /usr/aarch64-linux-gnu)
endif()
# pkg-config sees the target's libraries only (an x86 libcpp-httplib would
# not link: smol-server is then left out, as its CMake says).
set(ENV{PKG_CONFIG_LIBDIR}
    /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
