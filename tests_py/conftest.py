"""Import torch before lowbit, as users do (DLPack interop is the point): the suite then runs with torch's shared
libraries already in the process, which is how a symbol clash between lowbit's extension and torch was missed
before (docs/gpu_notes.md). Without torch installed the suite runs as before."""
try:
    import torch  # noqa: F401
except ImportError:
    pass
