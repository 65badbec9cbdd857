"""Command line of virtual_noise (``python -m virtual_noise``, or the ``virtual-noise`` script).

  train              the main job: train a network with ES (see train --help)
  info               build information as JSON
  cmake-prefix-path  the CMAKE_PREFIX_PATH entry for C++ consumers
"""

from __future__ import annotations

import argparse
import json
import sys


class _OneLineErrors(argparse.ArgumentParser):
    """Bad options: one line on stderr (no usage block, no traceback), exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineErrors(prog="virtual-noise", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineErrors)
    from .train.cli import add_arguments, run

    train_parser = sub.add_parser("train", help="train a network with ES (the main job)")
    add_arguments(train_parser)
    sub.add_parser("info", help="print build information as JSON")
    sub.add_parser("cmake-prefix-path", help="print the CMAKE_PREFIX_PATH entry for C++ consumers")
    args = parser.parse_args(argv)

    import virtual_noise

    if args.command == "train":
        return run(args, train_parser.error)
    if args.command == "info":
        print(json.dumps(virtual_noise.build_info(), indent=2))
    else:
        print(virtual_noise.cmake_prefix_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
