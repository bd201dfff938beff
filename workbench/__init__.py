"""The workbench: installing as the machine's pip is configured (``uv``), the commit subjects CI
holds (``subjects``) and the timing of one revision's first hour against another's (``timing``).

Standard library only: they run before the project's environment exists.
"""
