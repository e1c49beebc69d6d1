import sys, time; sys.path.insert(0,'tests')
import numpy as np
from oracles import random_mlp, mlp_forward
from crown_cli.certify import Certifier
for sizes, seed in [((10,20,20,10),2),((16,12,12,12,10),4),((10,20,20,10),3),((10,20,20,10),5),((10,20,20,10),6),((12,12,12,12,10),4)]:
    w,b=random_mlp(list(sizes),seed); x0=np.random.default_rng(seed+7).standard_normal(sizes[0])
    o=np.argsort(-mlp_forward(w,b,"relu",x0))
    for norm in ["inf","1"]:
        s=[]
        for m in ["crown","fast-lip","op-norm","lp-full","exact"]:
            t=time.time(); r=Certifier(w,b,"relu",norm=norm,method=m).certify(x0,int(o[0]),[int(o[1])]); s.append(f"{m}={r.eps:.4g}({time.time()-t:.2f}s,{r.evaluations})")
        print(sizes,seed,norm," ".join(s),flush=True)
