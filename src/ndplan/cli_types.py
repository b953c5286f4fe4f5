"""The CLI's option types and its one-line error handling.

* ``Count`` / ``Real``: click parameter types that check a value against ndplan.limits
  while the command line is parsed, so bad numbers fail before any work.
* ``Cli``: the click group; every error -- ndplan's own (NdplanError), click's usage
  errors (unknown option, missing value, bad choice), an unreadable path -- becomes one
  line ``error: <field>=<value>: <what is wrong>; <how to fix>`` on stderr with exit
  code 2; NdplanWarning becomes one ``warning: ...`` line. An unexpected exception is
  a bug: one line, exit 3 (``NDPLAN_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import warnings
from typing import Callable

import click

from ndplan import limits
from ndplan.errors import NdplanError, NdplanWarning, _show

EXIT_BAD_INPUT = 2
EXIT_BUG = 3


def param_field(param: click.Parameter | None) -> str:
    """The name a user typed: the longest option flag, or an argument's metavar."""
    if param is None:
        return "input"
    if isinstance(param, click.Argument):
        return (param.metavar or param.name or "argument").upper()
    return max(param.opts, key=len) if param.opts else str(param.name)


class Count(click.ParamType):
    """An integer in lo..hi (limits.count)."""
    name = "integer"

    def __init__(self, lo: int = 1, hi: int = limits.MAX_DEVICES, what: str = ""):
        self.lo, self.hi, self.what = lo, hi, what

    def convert(self, value, param, ctx):
        field = param_field(param)
        if isinstance(value, str):
            try:
                value = int(value.strip(), 10)
            except ValueError:
                raise NdplanError(field, value, "not an integer",
                                  f"give {self.what or 'a whole number'} in {self.lo}..{self.hi:,}") from None
        return limits.count(field, value, self.lo, self.hi, self.what)


class Real(click.ParamType):
    """A finite number, checked by ``check(field, value) -> float`` (a limits function)."""
    name = "number"

    def __init__(self, check: Callable[[str, float], float]):
        self.check = check

    def convert(self, value, param, ctx):
        field = param_field(param)
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise NdplanError(field, value, "not a number", "give a finite decimal number") from None
        return self.check(field, value)


DEVICES = Count(hi=limits.MAX_DEVICES, what="a device count")
DEGREE = Count(hi=limits.MAX_DEVICES, what="a degree")
SEQ = Count(hi=limits.MAX_SEQ, what="a sequence length in tokens")
BATCH = Count(hi=limits.MAX_BATCH, what="a batch size in sequences")
TOP = Count(lo=0, hi=limits.MAX_TOP, what="a number of candidates")
GIB = Real(limits.gib)
FRACTION = Real(limits.fraction)


def mem_limit_options(fn):
    """``--mem-limit-gib`` and ``--mem-fraction`` (sweep, check): one or neither."""
    fn = click.option("--mem-fraction", type=FRACTION, default=None,
                      help="Per-device memory limit as a fraction of HBM (0 < F <= 1), e.g. 0.9.")(fn)
    return click.option("--mem-limit-gib", type=GIB, default=None,
                        help="Per-device memory limit in GiB, e.g. 72 (default: all HBM). The limit is checked "
                             "against the peak = reserved (allocated tensors x the engine's caching-allocator "
                             "slack: +5.8% megatron/fsdp/hf, +37.3% deepspeed, the medians of published "
                             "allocated/reserved pairs) + the engine reserve (1 GiB CUDA context and NCCL); "
                             "--set allocator_slack_permille=220 takes the upper quartile.")(fn)


def _argv_value(args: list[str], param: click.Parameter | None):
    """What the user wrote for ``param`` (last occurrence), for the error line."""
    if not isinstance(param, click.Option):
        return None
    for i in range(len(args) - 1, -1, -1):
        a = args[i]
        for opt in param.opts:
            if a == opt and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(opt + "="):
                return a[len(opt) + 1:]
    return None


def _command_name(e: click.ClickException) -> str:
    ctx = getattr(e, "ctx", None)
    return ctx.command_path if ctx is not None else "ndplan"


def usage_line(e: click.ClickException, args: list[str]) -> str:
    """One line ``<field>=<value>: <what>; <fix>`` for a click usage error."""
    where = _command_name(e)
    help_hint = f"see `{where} --help`"
    if isinstance(e, click.NoSuchOption):
        close = difflib.get_close_matches(e.option_name, sorted(e.possibilities or ()), n=3)
        fix = (f"did you mean {', '.join(close)}? " if close else "") + help_hint
        return f"option={_show(e.option_name)}: no such option of {where}; {fix}"
    if isinstance(e, click.MissingParameter):
        field = param_field(e.param)
        metavar = e.param.make_metavar(e.ctx) if e.param is not None else ""
        give = metavar if isinstance(e.param, click.Argument) else f"{field} {metavar}"
        return f"{field}=None: required by {where}; give {give.strip()} ({help_hint})"
    if isinstance(e, click.BadOptionUsage):
        if "requires an argument" in e.message:
            return f"{e.option_name}=None: needs a value; write {e.option_name} VALUE ({help_hint})"
        return f"{e.option_name}=None: {e.message.rstrip('.')}; {help_hint}"
    if isinstance(e, click.BadParameter):
        field = param_field(e.param)
        value = _argv_value(args, e.param)
        msg = e.message.rstrip(".")
        path = re.fullmatch(r"(?:File|Directory|Path) '(.*)' is a directory", msg)
        if path:  # click.Path(dir_okay=False)
            return f"{field}={_show(path.group(1))}: is a directory; give the path of a file"
        return f"{field}={_show(value)}: {msg}; {help_hint}"
    msg = e.format_message().rstrip(".")
    m = re.match(r"No such command [\'\"]([^\'\"]*)[\'\"]", msg)
    if m:
        ctx = getattr(e, "ctx", None)
        names = sorted(ctx.command.list_commands(ctx)) if ctx is not None and hasattr(ctx.command, "list_commands") else []
        close = difflib.get_close_matches(m.group(1), names, n=2)
        fix = f"did you mean {', '.join(close)}?" if close else f"choose one of {', '.join(names)}"
        return f"command={_show(m.group(1))}: no such command; {fix}"
    m = re.match(r"Got unexpected extra arguments? \((.*)\)", msg)
    if m:
        return f"argument={_show(m.group(1))}: not expected by {where}; quote values with spaces, {help_hint}"
    return f"input={_show(' '.join(args))}: {msg}; {help_hint}"


class _Warnings:
    """showwarning for one command: distinct warnings, as one line each, held until the
    command ends (so bad input still gets exactly one line: its error)."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        text = " ".join(str(message).split())
        if not issubclass(category, NdplanWarning):  # a library's own warning
            text = f"{category.__name__}: {text}"
        if f"warning: {text}" not in self.lines:
            self.lines.append(f"warning: {text}")

    def flush(self) -> None:
        for ln in self.lines:
            click.echo(ln, err=True)


QUIET_S = 1.0
"""Compiling that ends within this many seconds prints nothing."""


class CompileProgress:
    """Progress on stderr while kernels compile (only then: warm runs print nothing).

    Once compiling has taken ``QUIET_S``, one line says why it waits and where kernels are
    cached (a quick compile, or bad input found before it, prints nothing); then a line
    every ``every_s`` seconds (overwritten in place on a terminal) with the kernels built
    and, in a sweep, the candidate groups evaluated; and a last line with the count."""

    def __init__(self, every_s: float = 5.0):
        self.every_s = every_s
        self.built = 0
        self.announced = False
        self.groups: tuple[int, int] | None = None
        self.start = self.last = 0.0
        self.tty = sys.stderr.isatty()

    def compiled(self) -> None:
        import time

        from ndplan.kernels import cache_dir
        now = time.perf_counter()
        self.built += 1
        if self.built == 1:
            self.start = now
            return
        if not self.announced and now - self.start >= QUIET_S:  # a compile of a second or less stays quiet
            self.announced, self.last = True, now
            where = cache_dir()
            usable = where.is_dir() or (not where.exists() and where.parent.is_dir())
            cached = (f"cached in {where}, later runs skip this" if usable and os.access(
                where if where.exists() else where.parent, os.W_OK) else
                f"not cached: {where} is not a writable folder (set NDPLAN_CACHE_DIR)")
            click.echo(f"compiling kernels (first use of this model and strategy family; {cached}) ...", err=True)
        elif self.announced and now - self.last >= self.every_s:
            self.last = now
            self._line(f"compiling kernels {self.built}{self._groups()} [{now - self.start:.0f} s]")

    def group_done(self, done: int, total: int) -> None:
        self.groups = (done, total)

    def _groups(self) -> str:
        return f", candidate groups {self.groups[0]}/{self.groups[1]}" if self.groups else ""

    def _line(self, text: str) -> None:
        click.echo(("\r" + text) if self.tty else text, err=True, nl=not self.tty)

    def finish(self) -> None:
        """After progress lines: the count, and the time since the first compile."""
        import time
        if self.announced and self.last > self.start:
            self._line(f"compiled {self.built} kernels; {time.perf_counter() - self.start:.0f} s since the first")
            if self.tty:
                click.echo("", err=True)


PROGRESS: CompileProgress | None = None
"""The running command's progress printer (set by Cli.main)."""


class _PipeClosed(Exception):
    """stdout's reader closed the pipe (click would exit 1 on the bare BrokenPipeError,
    which reads as "nothing fits")."""


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
"""glibc mallopt parameters (malloc.h)."""
HEAP_TEMPORARIES_BYTES = 64 << 20
"""Allocations up to this size come from the heap, and freed heap stays for reuse up to 4x it."""


def heap_temporaries() -> None:
    """Serve numpy's kernel temporaries from the heap (glibc only; elsewhere nothing). A kernel
    pass allocates and frees a few hundred arrays of up to 256 KiB (compiled.CHUNK_ROWS float64
    elements); above glibc's default 128 KiB mmap threshold each was a fresh mmap, paid in page
    faults on every pass: DeepSeek-V3 on 131,072 devices took 3.9-4.5 s with the default and
    2.3-2.7 s with these settings, at 177 MB peak either way (benchmarks/README.md). The CLI's
    process only: a library caller keeps its own allocator settings."""
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, HEAP_TEMPORARIES_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, 4 * HEAP_TEMPORARIES_BYTES)
    except (OSError, AttributeError):
        pass


class Cli(click.Group):
    """The ndplan group: one-line errors and warnings for every command. Commands named in
    ``lazy`` (name -> module with ``register(group)``) are imported when first asked for: a
    sweep does not import PPB's or the recipe readers' modules (importing ndplan.cli: 0.57 -> 0.51 s)."""

    lazy: dict[str, str] = {}

    def _load_lazy(self, name: str) -> None:
        module = self.lazy.get(name)
        if module is not None and name not in self.commands:
            import importlib
            importlib.import_module(module).register(self)

    def get_command(self, ctx, cmd_name):
        self._load_lazy(cmd_name)
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise _PipeClosed() from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        global PROGRESS
        from ndplan.kernels import compile_listener
        heap_temporaries()
        argv = list(sys.argv[1:] if args is None else args)
        PROGRESS = CompileProgress()
        held = _Warnings()
        with warnings.catch_warnings(), compile_listener(PROGRESS.compiled):
            warnings.simplefilter("always", NdplanWarning)
            warnings.showwarning = held
            code, line = self._run(argv, prog_name, complete_var, extra)
        PROGRESS.finish()
        from ndplan import kernels
        kernels.flush()  # what this command learned about kernels, before any later kill (atexit does it too)
        if line is not None:
            click.echo(f"error: {' '.join(line.split())}", err=True)
        else:
            held.flush()
        sys.exit(code)

    def _run(self, argv, prog_name, complete_var, extra) -> tuple[int, str | None]:
        """(exit code, error line or None) of one command."""
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except SystemExit as e:  # the command's own exit code (1: does not fit / nothing fits)
            return (0 if e.code is None else e.code if isinstance(e.code, int) else 1), None
        except NdplanError as e:
            return EXIT_BAD_INPUT, str(e)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help())
            return 0, None
        except click.UsageError as e:
            return EXIT_BAD_INPUT, usage_line(e, argv)
        except click.FileError as e:
            return EXIT_BAD_INPUT, f"{_show(e.ui_filename)}: cannot open ({e.message}); check the path"
        except click.ClickException as e:
            return EXIT_BAD_INPUT, f"input={_show(' '.join(argv))}: {e.format_message()}; see `ndplan --help`"
        except click.Abort:
            click.echo("aborted", err=True)
            return 1, None
        except _PipeClosed:  # `ndplan sweep ... | head`: the reader left; not an error of ours
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return 0, None
        except Exception as e:  # noqa: BLE001 - a bug: one line, unless debugging
            if os.environ.get("NDPLAN_DEBUG"):
                raise
            return EXIT_BUG, (f"internal={type(e).__name__}: {' '.join(str(e).split())[:200]}; this is a bug in "
                              "ndplan: please report the command (NDPLAN_DEBUG=1 shows the traceback)")
        return (rv if isinstance(rv, int) and not isinstance(rv, bool) else 0), None
