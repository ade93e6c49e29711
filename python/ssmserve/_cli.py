"""The `ssmserve` console command of the pip package: runs the CLI binary shipped in the package
(ssmserve/bin/ssmserve: serve / generate / bench, as a source build's build/ssmserve)."""
import os
import sys
from pathlib import Path


def binary_path() -> Path:
    """Where the package's CLI binary is (it may be missing in a hand-made install)."""
    return Path(__file__).resolve().parent / "bin" / "ssmserve"


def main() -> None:
    """Replaces this process with the CLI binary, passing the arguments through (signals and exit status as the
    binary's own)."""
    exe = binary_path()
    if not os.access(exe, os.X_OK):
        sys.exit(f"ssmserve: the CLI binary {exe} is missing from this install (reinstall with `pip install .`)")
    os.execv(str(exe), [str(exe), *sys.argv[1:]])


if __name__ == "__main__":
    main()
