# Cross-compiling for 64-bit Arm Linux (aarch64) on a Debian x86-64 host, used by
# scripts/check-arm64.sh. Needs Debian's g++-aarch64-linux-gnu (its libraries live under
# /usr/aarch64-linux-gnu) and, to run the tests, qemu-user-static. The :arm64 builds of the core
# libraries' dependencies (yaml-cpp, GoogleTest) are not installed into the system — an :arm64
# -dev package can replace the host's amd64 one — but unpacked by the script, which passes their
# CMake package folders (yaml-cpp_DIR, GTest_DIR); nlohmann-json is header-only and
# architecture-independent. CMAKE_LIBRARY_ARCHITECTURE keeps CMake's own searches to
# lib/aarch64-linux-gnu folders, so the host's x86-64 libraries (lib/x86_64-linux-gnu) are never found.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Test binaries (and GoogleTest's test discovery) run under user-mode QEMU; -L names the
# cross toolchain's sysroot for the dynamic loader and libc.
find_program(ICECACHE_QEMU_AARCH64 NAMES qemu-aarch64-static qemu-aarch64)
if(ICECACHE_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${ICECACHE_QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
endif()
