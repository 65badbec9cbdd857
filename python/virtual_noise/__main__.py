"""Command line: ``python -m virtual_noise <command>`` (also the ``virtual-noise`` script)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="virtual-noise", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print build information as JSON")
    sub.add_parser("cmake-prefix-path", help="print the CMAKE_PREFIX_PATH entry for C++ consumers")
    args = parser.parse_args(argv)

    import virtual_noise

    if args.command == "info":
        print(json.dumps(virtual_noise.build_info(), indent=2))
    elif args.command == "cmake-prefix-path":
        print(virtual_noise.cmake_prefix_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
