"""python -m kiln: the paths of the installed wheel, else the `kiln` command itself.

    python -m kiln --cmake-prefix   # CMAKE_PREFIX_PATH for find_package(Kiln) and find_package(Torch)
    python -m kiln --prefix         # the install prefix: bin/kiln, lib/libkiln.so.1, include/kiln, ...
    python -m kiln --library        # libkiln, as kiln.load() finds it
    python -m kiln run pipeline.toml   # anything else: the same as `kiln run pipeline.toml`
"""

import importlib.util
import os
import sys

from . import _cli


def torch_cmake_prefix():
    """torch.utils.cmake_prefix_path without importing torch (seconds): <torch>/share/cmake."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "share", "cmake")


def main(argv):
    prefix = _cli.PACKAGE_DIR
    if argv[:1] == ["--prefix"]:
        print(prefix)
    elif argv[:1] == ["--cmake-prefix"]:
        torch = torch_cmake_prefix()
        print(";".join([prefix] + ([torch] if torch else [])))
    elif argv[:1] == ["--library"]:
        from . import _capi
        print(_capi.default_path())
    else:
        _cli.main()


if __name__ == "__main__":
    main(sys.argv[1:])
