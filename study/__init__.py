"""Reproducible study of nonlinear query projections in GPT attention (arXiv 2603.13381).

Stages: ``study.prepare`` -> ``study.tune`` -> ``study.test_runs`` -> ``study.compare``; see README.md.

Importing ``study`` pins PyTorch's CPU kernels to AVX2 before torch is imported (study/config/numerics.py), so a
run's losses are the same floats on any x86-64 CPU; ``STUDY_NUMERICS=native`` turns the pin off.
"""
from study.config.numerics import pin_cpu_numerics

pin_cpu_numerics()
