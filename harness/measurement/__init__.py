"""What a run measures beside its scores: memory sampled while a model generates (`sampler`), memory and speed
against context length (`profiling`), and whether a run fits the machine before it is loaded (`capacity`).

Light by rule (docs/architecture.md, rule 4): the GPU machine, whose Python has torch, psutil and nvidia-ml-py but
not the evaluation stack, imports every module here.
"""
