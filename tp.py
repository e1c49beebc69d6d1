import time, numpy as np, sys
sys.path.insert(0,'tests')
from crown_cli.model_io import load_model
from crown_cli.images import load_images
from crown_cli.activations import forward
from crown_cli.methods.exact import min_distortion
x,y=load_images(None)
for name in ["mnist_2x20.h5","mnist_3x20.h5"]:
    m=load_model("models/"+name)
    for i in range(4):
        f=forward(m.weights,m.biases,"relu",x[i]); c=int(np.argmax(f)); t=int(np.argsort(f)[-2])
        for norm in ["inf","1"]:
            t0=time.time(); r=min_distortion(m.weights,m.biases,x[i],c,[t],norm,timeout=60)
            print(name,i,norm,r.eps,r.status,r.solves,r.dual_bound,"%.2fs"%(time.time()-t0), flush=True)
