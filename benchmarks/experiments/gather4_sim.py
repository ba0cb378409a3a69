import torch, itertools, sys
sys.path.insert(0, ".")
from spartune.formats.nm import VNM
import spartune.kernels.spmm_nm as K

def sim_g4(A, x, ksteps, warps_k, threads):
    """Simulate GATHER 4's fill and lane loads; return per (rowblock, K step) B fragment col 0 as a 32-vector, and check against the old map."""
    KC = 32*ksteps*warps_k
    cols = K.column_offsets(A).reshape(-1)
    map_pitch = A.col_blocks*4; m = A.m; kx = x.shape[0]
    kt = -(-(A.col_blocks*4)//32)
    kt = K.packed(A)[3]
    chunks = -(-kt//(ksteps*warps_k))
    old = K._column_map(A)
    XP = (KC//2 + threads-1)//threads
    for rb in range(A.row_blocks):
        base = rb*map_pitch
        for c in range(chunks):
            xs = [None]*(KC//2)
            for tid in range(threads):
                for q in range(XP):
                    v = tid + q*threads
                    k = c*KC + 2*v
                    if not (v < KC//2): continue
                    two = int(cols[base+k]) | int(cols[base+k+1])<<8 if k < map_pitch else 0xffffffff
                    def col_at(k, off):
                        cc = (k>>2)*m + off
                        return cc if off >= 0 and cc < kx else -1
                    c0 = -1 if two == 0xffffffff else col_at(k, two & 0xff)
                    c1 = -1 if two == 0xffffffff else col_at(k, two >> 8)
                    h0 = float(x[c0]) if c0 >= 0 else 0.0
                    h1 = float(x[c1]) if c1 >= 0 else 0.0
                    w = v % 16
                    idx = (v//16)*16 + (w%4)*4 + w//4
                    assert xs[idx] is None
                    xs[idx] = (h0, h1)
            assert all(e is not None for e in xs)
            for ks in range(ksteps*warps_k):
                if c*ksteps*warps_k + ks >= kt: break
                # lane t<4 loads words ks*16 + 4t .. +3 -> b[r]; PTX: b[r] = (B[8r+2t][g], B[8r+2t+1][g])
                B = [None]*32
                for t in range(4):
                    for r in range(4):
                        lo, hi = xs[ks*16 + 4*t + r]
                        B[8*r+2*t] = lo; B[8*r+2*t+1] = hi
                kglob = (c*ksteps*warps_k + ks)*32
                ref = [float(x[old[rb, kglob+i]]) if old[rb, kglob+i] >= 0 else 0.0 for i in range(32)]
                assert B == ref, (rb, c, ks)
    return True

torch.manual_seed(0)
n = 0
for (v, m, rows, kd) in [(16, 8, 40, 100), (64, 8, 70, 1000), (32, 16, 33, 77), (16, 4, 16, 13), (32, 32, 64, 290), (16, 128, 20, 300), (16, 5, 16, 61)]:
    w = torch.randn(rows, kd)
    # random vnm pattern: pick 4 columns per block, 2 per row
    rb, cb = -(-rows//v), -(-kd//m)
    mask = torch.zeros(rb*v, cb*m, dtype=torch.bool)
    for b in range(rb):
        for g in range(cb):
            kept = torch.randperm(m)[:4]
            for r in range(v):
                two = kept[torch.randperm(4)[:2]]
                mask[b*v+r, g*m+two] = True
    w = w * mask[:rows, :kd]
    A = VNM.from_dense(w, v, m)
    x = torch.randn(kd)
    for ksteps, wk, thr in [(4, 1, 128), (4, 2, 128), (8, 4, 256), (4, 8, 512), (8, 8, 512), (4, 1, 32)]:
        sim_g4(A, x, ksteps, wk, thr); n += 1
    # also check col_of for all k vs old map (GATHER 1/2/3 path)
    old = K._column_map(A); cols = K.column_offsets(A).reshape(A.row_blocks, -1)
    pitch = A.col_blocks*4
    for b in range(A.row_blocks):
        for k in range(old.shape[1] + 64):
            off = int(cols[b, k]) if k < pitch else -1
            c = (k>>2)*m + off
            c = c if off >= 0 and c < kd else -1
            exp = int(old[b, k]) if k < old.shape[1] else -1
            assert c == exp, (b, k, c, exp)
print("ok", n)
