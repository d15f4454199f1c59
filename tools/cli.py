"""The `ckptd` command: one subcommand per module.

Each module named in COMMANDS provides `add_arguments(parser)` and
`run(args) -> int`; it is imported only when its subcommand runs, so
`ckptd inspect` does not pay for importing torch models.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ckptd.tools.openmp import wait_passively

COMMANDS = {
    "serve": ("ckptd.daemon.serve", "run the HTTP daemon"),
    "generate": ("ckptd.tools.generate", "generate text from a prompt (no daemon)"),
    "make-tiny": ("ckptd.tools.make_tiny_command", "write a tiny random-weight model in HF format"),
    "make-lora": ("ckptd.tools.make_lora", "write a random LoRA adapter (PEFT folder) for a model"),
    "inspect": ("ckptd.tools.inspect_store.command",
                "inspect a cache store or a running daemon's cache"),
    "bench": ("ckptd.tools.bench.command", "benchmark a daemon (and a peer server)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="ckptd", description="persistent prompt-cache daemon")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            parser.print_usage(sys.stderr)
            print(f"ckptd: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        parser.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    wait_passively()            # before the command's module imports torch
    module = importlib.import_module(COMMANDS[name][0])
    cmd = argparse.ArgumentParser(prog=f"ckptd {name}", description=COMMANDS[name][1])
    module.add_arguments(cmd)
    args = cmd.parse_args(rest)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError, RuntimeError) as e:
        # user errors, unreachable servers, failed benchmarks: one line, no traceback
        print(f"ckptd {name}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
