"""Certification methods beyond the linear CROWN engine of :mod:`crown_cli.crown`.

``quad``: CROWN-Quad, quadratic lower bounds of ReLU for 2-layer networks (paper Section 3.3).
"""
