"""The opt-in NIXL CPU workaround, loaded by vLLM processes as ``sitecustomize`` (this folder goes
on their PYTHONPATH); a package only so that installs ship it."""
