"""A model of the index arithmetic of kernels/gemm.cu, checked on the CPU.

Written because the machines that build crun have no GPU: it replays one
block tile of gemm_tc_kernel (ldmatrix, ldmatrix.trans and mma.m16n8k16 with
the fragment layouts of the PTX ISA) and of sgemm_kernel (the thread to
element map, the transposed A tile) and compares with numpy. It checks the
transcription of the addressing, not the compiled kernel; keep it in step
with gemm.cu. The real kernels are checked by gpu_kernels on a device.
Run: python3 tests/gpu/fragments_sim.py (needs numpy).
"""
import numpy as np
rng = np.random.default_rng(1)
TC_BM, TC_BN, TC_BK, TC_SA, TC_SB = 128, 128, 32, 40, 136
sa = np.zeros((TC_BM, TC_SA)); sb = np.zeros((TC_BK, TC_SB))
A = rng.integers(-3, 4, (TC_BM, TC_BK)).astype(float)
B = rng.integers(-3, 4, (TC_BK, TC_BN)).astype(float)
sa[:, :TC_BK] = A; sb[:, :TC_BN] = B

def ldmatrix_x4(addr_of_lane, trans, mem):
    # addr_of_lane(L) -> (row, col) of the first of 8 elements in mem
    regs = [[None]*4 for _ in range(32)]
    for q in range(4):
        rows = [addr_of_lane(8*q + r) for r in range(8)]
        M = np.array([[mem[r0][c0 + c] for c in range(8)] for (r0, c0) in rows])
        for t in range(32):
            if not trans:
                regs[t][q] = (M[t//4][2*(t%4)], M[t//4][2*(t%4)+1])
            else:
                regs[t][q] = (M[2*(t%4)][t//4], M[2*(t%4)+1][t//4])
    return regs

def mma(acc, a, b):
    # acc[t] = 4 floats; a[t] = 4 regs of 2; b[t] = 2 regs of 2
    Am = np.zeros((16, 16)); Bm = np.zeros((16, 8))
    for t in range(32):
        g, tg = t//4, t%4
        for j in range(2):
            Am[g][tg*2+j] = a[t][0][j]; Am[g+8][tg*2+j] = a[t][1][j]
            Am[g][tg*2+8+j] = a[t][2][j]; Am[g+8][tg*2+8+j] = a[t][3][j]
            Bm[tg*2+j][g] = b[t][0][j]; Bm[tg*2+8+j][g] = b[t][1][j]
    D = Am @ Bm
    for t in range(32):
        g, tg = t//4, t%4
        acc[t][0] += D[g][tg*2]; acc[t][1] += D[g][tg*2+1]
        acc[t][2] += D[g+8][tg*2]; acc[t][3] += D[g+8][tg*2+1]

C = np.full((TC_BM, TC_BN), np.nan)
for warp in range(8):
    wm, wn = (warp//4)*64, (warp%4)*32
    acc = [[[[0.0]*4 for _ in range(32)] for _ in range(4)] for _ in range(4)]
    for ks in range(0, TC_BK, 16):
        af = [ldmatrix_x4(lambda L, mi=mi: (wm + mi*16 + L%16, ks + (L//16)*8), False, sa) for mi in range(4)]
        bf = [None]*4
        for nj in range(2):
            r = ldmatrix_x4(lambda L: (ks + L%16, wn + nj*16 + (L//16)*8), True, sb)
            bf[nj*2] = [(r[t][0], r[t][1]) for t in range(32)]
            bf[nj*2+1] = [(r[t][2], r[t][3]) for t in range(32)]
        for mi in range(4):
            for ni in range(4):
                mma(acc[mi][ni], af[mi], bf[ni])
    for mi in range(4):
        for ni in range(4):
            for lane in range(32):
                for f in range(4):
                    row = wm + mi*16 + lane//4 + (f//2)*8
                    col = wn + ni*8 + (lane%4)*2 + f%2
                    assert np.isnan(C[row][col]), "written twice"
                    C[row][col] = acc[mi][ni][lane][f]
assert not np.isnan(C).any(), "not all written"
assert np.array_equal(C, A @ B), "tensor-core tile wrong"
print("tc tile OK")

# SGEMM: coverage and operand mapping of one 128x128x8 slice.
A = rng.integers(-3, 4, (128, 8)).astype(float); B = rng.integers(-3, 4, (8, 128)).astype(float)
As = np.zeros((8, 132)); Bs = np.zeros((8, 128))
for t in range(256):
    ar, ac = t//2, (t%2)*4
    for i in range(4): As[ac+i][ar] = A[ar][ac+i]
    for i in range(4): Bs[t//32][(t%32)*4+i] = B[t//32][(t%32)*4+i]
C = np.full((128, 128), np.nan)
for t in range(256):
    warp, lane = t//32, t%32
    tm = (warp//2)*32 + (lane//8)*4; tn = (warp%2)*64 + (lane%8)*4
    acc = np.zeros((8, 8))
    for kk in range(8):
        fa = list(As[kk][tm:tm+4]) + list(As[kk][tm+16:tm+20])
        fb = list(Bs[kk][tn:tn+4]) + list(Bs[kk][tn+32:tn+36])
        acc += np.outer(fa, fb)
    for i in range(8):
        row = tm + (i if i < 4 else 12 + i)
        for h in range(2):
            for j in range(4):
                col = tn + h*32 + j
                assert np.isnan(C[row][col]); C[row][col] = acc[i][h*4+j]
assert np.array_equal(C, A @ B), "sgemm tile wrong"
print("sgemm tile OK")

# The tensor-core kernel's cp.async pipeline: which slice sits in which
# buffer, when its group is known complete, and that no buffer is refilled
# while this iteration (or a thread still in the previous one) reads it.
STAGES = 3
for ktiles in range(1, 9):
    buf = [None] * STAGES          # slice held by each buffer
    groups = []                    # groups[g] = slice it carries, or None
    for s in range(STAGES - 1):
        if s < ktiles:
            buf[s] = s
        groups.append(s if s < ktiles else None)
    for kt in range(ktiles):
        cur, nxt = kt % STAGES, kt + STAGES - 1
        done = len(groups) - (STAGES - 2)          # cp.async.wait_group STAGES-2
        assert kt in [g for g in groups[:done] if g is not None], (ktiles, kt)
        assert buf[cur] == kt, (ktiles, kt, buf)
        # after the barrier: slice kt-1's buffer is free, slice kt is not touched
        if nxt < ktiles:
            assert nxt % STAGES != cur and (buf[nxt % STAGES] is None or buf[nxt % STAGES] < kt)
            buf[nxt % STAGES] = nxt
        groups.append(nxt if nxt < ktiles else None)
print("tc pipeline OK")
