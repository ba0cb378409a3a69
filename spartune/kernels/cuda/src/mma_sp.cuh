// Sparse tensor-core building blocks shared by the 2:4 and V:N:M templates.
#pragma once

namespace spartune {

// One warp-wide 2:4 sparse MMA: d (16x8, f32) += A (16x32, 2:4) x B (32x8), with sparsity
// selector 0. Every operand is in the registers the PTX ISA gives mma.sp m16n8k32 f16/bf16:
// a = the lane's 8 compressed A halves, b = its 8 B halves, meta = its metadata word (the host
// builds a and meta in this order: spartune/kernels/cuda/sparse_mma.py).
template <bool kBf16>
__device__ __forceinline__ void mma_sp_m16n8k32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[4],
                                                unsigned meta) {
  if constexpr (kBf16) {
    asm volatile(
        "mma.sp.sync.aligned.m16n8k32.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(meta));
  } else {
    asm volatile(
        "mma.sp.sync.aligned.m16n8k32.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9, %10, %11}, {%0, %1, %2, %3}, %12, 0x0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(b[2]), "r"(b[3]), "r"(meta));
  }
}

}  // namespace spartune
