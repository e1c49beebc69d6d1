"""Linear relaxation of ReLU on an interval [l, u] (CROWN, Section 3.1; Fast-Lin for comparison).

For every neuron the relaxation returns slopes and intercepts with
``aL*z + bL <= relu(z) <= aU*z + bU`` for all z in [l, u].
"""
import numpy as np
from numba import njit

EPS = 2.0 ** -52
TINY = 5e-324


@njit(cache=True)
def relu_relaxation(l, u, adaptive):
    """Slopes/intercepts (aU, bU, aL, bL), each of shape l.shape.

    Stable active (l >= 0): identity on both sides. Stable inactive (u <= 0): zero.
    Unstable (l < 0 < u): upper is the chord through (l, 0) and (u, u); lower has slope
    1 if u >= -l else 0 when ``adaptive`` (CROWN-Ada), otherwise the chord's slope (Fast-Lin).
    """
    n = l.shape[0]
    aU = np.zeros(n)
    bU = np.zeros(n)
    aL = np.zeros(n)
    bL = np.zeros(n)
    for i in range(n):
        li = l[i]
        ui = u[i]
        if li >= 0.0:
            aU[i] = 1.0
            aL[i] = 1.0
        elif ui <= 0.0:
            pass
        else:
            # here u - l > 0 strictly, so the chord is well defined even for tiny intervals;
            # the intercept moves up by a few ulps of the terms so that s*z + b >= relu(z)
            # also holds when the line is evaluated in float64 (s*u + b can round below u)
            s = ui / (ui - li)
            aU[i] = s
            b = -s * li
            bU[i] = b + 4.0 * EPS * (s * max(ui, -li) + b) + 4.0 * TINY
            if adaptive:
                aL[i] = 1.0 if ui >= -li else 0.0
            else:
                aL[i] = s
    return aU, bU, aL, bL
