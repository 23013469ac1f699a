"""refimpl's version (pyproject.toml's): the one thing below every folder that golden files and cluster
fingerprints record. It lives apart from the package top, ``refimpl/__init__.py``, which re-exports it
with the Python API above every folder (tests/test_layout.py).

May import: nothing.
"""

__version__ = "0.1.0"
