"""Benchmark tools: the FLOP/byte model, the GPU timer, the PyTorch comparator, compare and plot commands."""
