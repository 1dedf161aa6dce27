# Settings shared by the Fashion-MNIST example (examples/fmnist) and its tests.

include_guard(GLOBAL)

# PACTRAIN_FMNIST_ARCH_FLAGS: instruction-set flags for code that runs the example's MLP.
# Eigen picks its kernels at compile time: AVX2 + FMA make the MLP about twice as fast as the
# SSE2 baseline. The default uses them when the compiler takes them and the CPU that
# configures has them; set it to "" for a binary that runs on any x86-64.
if(NOT DEFINED CACHE{PACTRAIN_FMNIST_ARCH_FLAGS})
  set(_pactrain_fmnist_arch "")
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64"
     AND NOT CMAKE_CROSSCOMPILING)
    include(CheckCXXSourceRuns)
    set(CMAKE_REQUIRED_FLAGS "-mavx2 -mfma")
    check_cxx_source_runs([=[
      int main() {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 0 : 1;
      }]=] PACTRAIN_FMNIST_HOST_HAS_AVX2_FMA)
    unset(CMAKE_REQUIRED_FLAGS)
    if(PACTRAIN_FMNIST_HOST_HAS_AVX2_FMA)
      set(_pactrain_fmnist_arch -mavx2 -mfma)
    endif()
  endif()
  set(PACTRAIN_FMNIST_ARCH_FLAGS "${_pactrain_fmnist_arch}" CACHE STRING
    "Instruction-set flags for pactrain_fmnist and its MLP test (a list; empty for a portable binary)")
  unset(_pactrain_fmnist_arch)
endif()
