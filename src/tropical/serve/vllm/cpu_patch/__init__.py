"""The NIXL CPU workarounds, loaded by vLLM processes as ``sitecustomize`` (this folder goes on
their PYTHONPATH); a package only so that installs ship it."""
