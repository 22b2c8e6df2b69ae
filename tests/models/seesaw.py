# seesaw.py - fp64 model of the online-softmax bookkeeping of body_ss
# (kernels/gpu/decode.hip, PMLA_WG_PP=2): per pair of KV blocks, warpgroup 0
# owns O[:, :256] and block 2i, warpgroup 1 owns O[:, 256:] and block 2i+1;
# random scores with masked (-inf) entries, odd block counts, empty rows.
# Run: python3 tests/models/seesaw.py   (needs numpy: Debian python3-numpy)
import numpy as np
rng=np.random.default_rng(1)
def ref(S,V):
    m=S.max(1,keepdims=True); P=np.exp2(S-np.where(np.isinf(m),0,m)); l=P.sum(1)
    return (P@V)/np.where(l>0,l,1)[:,None], l
def seesaw(S,V,BN=4):
    R,N=S.shape; nblk=(N+BN-1)//BN; npair=(nblk+1)//2
    Spad=np.full((R,nblk*BN),-np.inf); Spad[:,:N]=S
    Vpad=np.zeros((nblk*BN,V.shape[1])); Vpad[:N]=V
    half=V.shape[1]//2
    oL=np.zeros((R,half)); oR=np.zeros((R,half)); l0=np.zeros(R); l1=np.zeros(R)
    m0=np.full(R,-np.inf); m1=np.full(R,-np.inf)
    use=lambda m: np.where(m==-np.inf,0,m)
    for i in range(npair):
        b0=2*i; has1=b0+1<nblk
        S0=Spad[:,b0*BN:(b0+1)*BN]; V0=Vpad[b0*BN:(b0+1)*BN]
        # wg0
        m_a=np.maximum(m0,S0.max(1)); corr=np.exp2(m0-use(m_a))
        P0=np.exp2(S0-use(m_a)[:,None]); l0=l0*corr+P0.sum(1); oL=oL*corr[:,None]+P0@V0[:,:half]
        # wg1
        mx=Spad[:,(b0+1)*BN:(b0+2)*BN].max(1) if has1 else np.full(R,-np.inf)
        m_b=np.maximum(m_a,mx); c1w=np.exp2(m1-use(m_b)); oR=oR*c1w[:,None]; 
        s1=0
        if has1:
            S1=Spad[:,(b0+1)*BN:(b0+2)*BN]; V1=Vpad[(b0+1)*BN:(b0+2)*BN]
            P1=np.exp2(S1-use(m_b)[:,None]); s1=P1.sum(1)
        l1=l1*c1w+s1
        c1=np.exp2(m_a-use(m_b))
        P0p=P0*c1[:,None]
        oR=oR+P0p@V0[:,half:]
        if has1: oR=oR+P1@V1[:,half:]
        # wg0 continues
        oL=oL*c1[:,None]; l0=l0*c1
        if has1: oL=oL+P1@V1[:,:half]
        m0=m_b; m1=m_b
    l=l0+l1
    return np.hstack([oL,oR])/np.where(l>0,l,1)[:,None], l
worst=0
for trial in range(300):
    R=rng.integers(1,5); N=int(rng.integers(0,40)); D=8
    S=rng.normal(size=(R,N))*rng.uniform(0.1,20)
    mask=rng.random((R,N))<rng.uniform(0,0.9); S[mask]=-np.inf
    V=rng.normal(size=(N,D))
    if N==0:
        o,l=seesaw(np.zeros((R,0)),np.zeros((0,D))); assert np.all(o==0) and np.all(l==0); continue
    a,la=ref(S,V); b,lb=seesaw(S,V,BN=int(rng.integers(1,6)))
    # lse relative check via (m + log l): compare normalised outputs
    err=np.abs(a-b).max(); worst=max(worst,err)
    assert err<1e-9,(trial,err)
print("seesaw model matches the reference; worst |err| =",worst)
