"""Benchmark tools: the FLOP/byte model, the GPU timer, the PyTorch comparator, the compare
and plot commands."""
