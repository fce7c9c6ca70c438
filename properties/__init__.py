"""Hypothesis strategies and properties of the SSD forward kernels."""
