"""Installed packages that ship data: the embedded corpora and GPT-2's BPE files.

Imported by :mod:`study.data.corpora` and :mod:`study.data.tokenizers`; imports nothing of the study's
data modules, so the data package's imports flow one way (packages -> corpora, tokenizers -> hf -> build).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from study.data import DataError


def package_dir(name: str) -> Path:
    """The folder of installed package ``name``.

    Raises:
        DataError: the package is not installed (the message says how to install it).
    """
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {name!r} is not installed: run `make install` (or pip install -e .)")
    return Path(list(spec.submodule_search_locations)[0])
