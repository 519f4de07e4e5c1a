"""Fused kernels for one backend each, imported lazily by the layers that use them.

`talking_heads_pallas`: talking-heads attention as Pallas kernels (JAX backend).
"""
