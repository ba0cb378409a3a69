// Reports what a cubin was built for, and uses all of its dynamic shared memory: the tests
// check the arch-specific (sm_90a) path and the opt-in above 48 KB with it.
extern "C" __global__ void arch_probe(int* out, int shmem_words) {
  extern __shared__ int smem[];
  for (int i = threadIdx.x; i < shmem_words; i += blockDim.x) smem[i] = i;
  __syncthreads();
  if (threadIdx.x == 0) {
    out[0] = __CUDA_ARCH__;
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
    out[1] = 1;
#else
    out[1] = 0;
#endif
    out[2] = shmem_words > 0 ? smem[shmem_words - 1] : -1;
  }
}
