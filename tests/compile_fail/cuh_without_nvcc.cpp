// Must not compile: a .cuh header included by a host compiler stops at its #error ("needs
// nvcc"), instead of failing somewhere inside CUB.
#include <pactrain/cuda/compactor.cuh>

int main() { return 0; }
