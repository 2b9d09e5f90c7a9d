"""`mechopd` command: thin parsing around library calls. Bad input -> one line on stderr, exit code 2."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from mechopd.core.threads import configure

configure()  # OMP_WAIT_POLICY=PASSIVE unless set: before anything below imports torch (libgomp reads it at load)

from mechopd.cli.common import COMMANDS  # noqa: E402
from mechopd.core.errors import MechopdError  # noqa: E402

# The verb modules, imported in this order: each registers its verbs (`common.command`), and that order is
# `mechopd --help`'s.
for _module in ("train_cmd", "eval_cmd", "probe_cmd", "study_cmd", "fetch_cmd"):
    importlib.import_module(f"mechopd.cli.{_module}")


def make_parser() -> argparse.ArgumentParser:
    """The `mechopd` parser: one subcommand per verb of the command table (`mechopd.cli.common.COMMANDS`), in its
    order (the modules' import order, then each module's)."""
    parser = argparse.ArgumentParser(prog="mechopd", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name, verb in COMMANDS.items():
        verb.args(sub.add_parser(name, help=verb.help.replace("%", "%%"), description=verb.help))  # help: %-formatted
    _show_task_options(parser)
    return parser


def _show_task_options(parser: argparse.ArgumentParser) -> None:
    """Every verb that takes ``--option`` lists each task's options under its ``--help`` (from the registry)."""
    from mechopd.tasks.base import task_options_help

    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for verb in getattr(action, "choices", {}).values():
            if "--option" in verb._option_string_actions:
                verb.epilog = task_options_help().replace("%", "%%")
                verb.formatter_class = argparse.RawDescriptionHelpFormatter
            _show_task_options(verb)


def main(argv: list[str] | None = None) -> int:
    code = _main(argv)
    if "torch.distributed" in sys.modules:  # a torchrun rank ends here (`train.dist.exit_rank`); elsewhere a no-op
        from mechopd.train.dist import exit_rank

        exit_rank(code)
    return code


def _main(argv: list[str] | None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a = make_parser().parse_args(argv)
    try:
        return COMMANDS[a.cmd].run(a)
    except MechopdError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk / quota in any verb: one line (every writer is atomic: nothing older is lost)
        from mechopd.core.runcheck import disk_error

        if disk_error(e) is None:
            raise
        print(f"error: {disk_error(e)}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # Python < 3.13's "Symlink loop from '...'" of Path.resolve, wherever a path resolves
        if not str(e).startswith("Symlink loop"):
            raise
        where = str(e).removeprefix("Symlink loop from ")
        print(f"error: {where} is a symbolic link loop; remove the link or pass another path", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
