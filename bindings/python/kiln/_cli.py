"""The `kiln` command of the wheel (pyproject.toml's console script): runs the `kiln` executable
installed in this package, bin/kiln, with the same arguments.

The process becomes that executable (os.execv), so signals, exit status, stdin and the terminal
are the executable's own, as if it had been started directly; it finds libtorch and its built-in
plugins from its own path.
"""

import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def executable():
    """Path of the `kiln` executable inside the installed package."""
    return os.path.join(PACKAGE_DIR, "bin", "kiln")


def main():
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.exit(f"kiln: no executable at {exe}: this copy of the kiln package is not an installed "
                 "wheel (pip install kiln-train, or build one: docs/install.md)")
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
