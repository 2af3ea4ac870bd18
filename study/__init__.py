"""Reproducible study of nonlinear query projections in GPT attention (arXiv 2603.13381).

Stages: ``study.prepare`` -> ``study.train`` -> ``study.compare``; see README.md.
"""
