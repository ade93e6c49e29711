# Numpy emulation of mma.sync m16n8k16 fragments: checks gemv_slot_paired's lane / column / row mapping and the
# partner shuffle against plain dot products (ragged K, M up to 8 in passes of 4). Run: python3 tools/emulate_mma_paired.py
import numpy as np
rng=np.random.default_rng(0)
def mma(D,Aregs,Bregs):
    A=np.zeros((16,16)); B=np.zeros((16,8))
    for lane in range(32):
        g,t=lane>>2,lane&3
        a0,a1,a2,a3=Aregs[lane]; b0,b1=Bregs[lane]
        A[g,2*t:2*t+2]=a0; A[g+8,2*t:2*t+2]=a1; A[g,2*t+8:2*t+10]=a2; A[g+8,2*t+8:2*t+10]=a3
        B[2*t:2*t+2,g]=b0; B[2*t+8:2*t+10,g]=b1
    C=A@B
    for lane in range(32):
        g,t=lane>>2,lane&3
        D[lane][0]+=C[g,2*t]; D[lane][1]+=C[g,2*t+1]; D[lane][2]+=C[g+8,2*t]; D[lane][3]+=C[g+8,2*t+1]
def act_pos(e): return (e & ~6) | ((e & 2) << 1) | ((e & 4) >> 1)
def run(K,nr,M,c0,c1):
    W=rng.standard_normal((nr,K)); X=rng.standard_normal((M,K))
    Xs=np.zeros((M,K))
    for m in range(M):
        for e in range(K): Xs[m,act_pos(e)]=X[m,e]
    cf=min(c1,K//32)
    def load16(arr,row,unit):
        base=unit*8
        v=np.zeros(8)
        n=max(0,min(8,K-base)); v[:n]=arr[row,base:base+n]
        return [v[0:2],v[2:4],v[4:6],v[6:8]]
    zero=[np.zeros(2)]*4
    out=np.full((M,nr),np.nan)
    for m0 in range(0,M,4):
        a0=[[0.0]*4 for _ in range(32)]; b0=[[0.0]*4 for _ in range(32)]; a1=[[0.0]*4 for _ in range(32)]; b1=[[0.0]*4 for _ in range(32)]
        def step(accA,accB,cbase,whole):
            Ar=[];Br1=[];Br2=[]
            for lane in range(32):
                g,t=lane>>2,lane&3; j,q=g>>2,g&3
                xon=m0+q<M
                cc=cbase+j
                on = True if whole else (cc<c1 and (cc<cf or 32*cc+8*t<K))
                w=load16(W,min(q,nr-1),4*cc+t) if on else zero
                x=load16(Xs,m0+q if xon else 0,4*cc+t) if (on and xon) else zero
                Ar.append((x[0],x[1],x[2],x[3])); Br1.append((w[0],w[1])); Br2.append((w[2],w[3]))
            mma(accA,Ar,Br1); mma(accB,Ar,Br2)
        c=c0
        while c+3<cf:
            step(a0,b0,c,True); step(a1,b1,c+2,True); c+=4
        while c<c1:
            step(a0,b0,c,False); c+=2
        v=[[ (a0[l][e]+a1[l][e])+(b0[l][2+e]+b1[l][2+e]) for e in range(2)] for l in range(32)]
        for lane in range(32):
            g,t=lane>>2,lane&3
            for e in range(2):
                odd = v[lane+18][e] if lane+18<32 else v[lane][e]
                r=2*t+e
                if g<4 and t<2 and m0+g<M and r<nr: out[m0+g,r]=v[lane][e]+odd
    ref=np.zeros((M,nr))
    for m in range(M):
        for r in range(nr):
            ref[m,r]=sum(X[m,32*c:min(32*c+32,K)]@W[r,32*c:min(32*c+32,K)] for c in range(c0,c1))
    return np.max(np.abs(out-ref))
for K,nr,M,c0,c1 in [(5120,4,1,0,40),(5120,4,3,40,80),(5120,3,5,120,160),(3208,4,8,90,101),(3208,2,2,99,101),(424,1,1,10,14),(424,4,4,12,14),(5120,4,1,0,7),(5120,4,2,3,8),(5120,4,1,159,160)]:
    print(K,nr,M,c0,c1, run(K,nr,M,c0,c1))
