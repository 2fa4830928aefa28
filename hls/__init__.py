"""The HLS kernel sources, importable as `pearl.hls` so an installed wheel carries them (the
FPGA simulation backend compiles them with the host's C++ compiler; see hls/README.md)."""
from importlib import resources
from pathlib import Path


def source_dir() -> Path:
    """The directory holding include/, sumtree/, mlp/, timing.json and the vendor scripts."""
    return Path(str(resources.files(__name__)))
