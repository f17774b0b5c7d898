"""The deep probe: a child process of the audited interpreter that imports torch for real.

Owns: running the child with a time limit (`run`), the child itself (`probe_child`: import torch,
initialise CUDA, read `/proc/self/maps`, ask loaded libraries their versions, prove compiled flex),
and comparing what it saw with the static model (`compare`).

May import: the core only (`probe_child` imports nothing of ours: it runs under another interpreter).
"""
