"""Megatron-LM arguments -> model + Strategy (the inverse of export/megatron.py, with
its flag table ``FLAG``).

Input: an argument file (flags one per line or on one line) or a bash launch script.
Handled: ``\\`` continuations, ``#`` comments, ``;`` between statements, ``NAME=value``
/ ``export NAME=value`` assignments (quoted values, bash arrays ``NAME=( ... )`` on one
line or several) expanded where ``$NAME`` / ``${NAME}`` / ``${NAME[@]}`` /
``${NAME:-default}`` / ``${NAME:=default}`` appear, ``$(( ))`` integer arithmetic with
spaces and variables (interop.arith: + - * / % **, no eval), ``--flag=value``, and the
torchrun / python launcher around ``pretrain_gpt.py`` (tests/test_check.py holds the
words to what bash itself passes). Not run: ``if``/``case``/loops, functions and
``$( )`` command substitution; the script is read top to bottom, so a variable assigned
twice takes its last value, with a warning. The words are parsed with argparse
(``parse_known_args``): unknown flags are ignored and listed.

Mapping (Megatron-LM defaults where a flag is absent): tp / pp / cp / ep / etp <- the
parallel sizes (1); dp = gpus / (tp pp cp), gpus <- ``--gpus`` or torchrun
``--nproc_per_node`` x ``--nnodes``; vpp <- ``--num-virtual-stages-per-pipeline-rank``
or L / (pp ``--num-layers-per-virtual-pipeline-stage``); sp <- ``--sequence-parallel``;
zero <- 1 with ``--use-distributed-optimizer``, 3 with ``--use-torch-fsdp2``, else 0;
mbs <- ``--micro-batch-size`` (1); gbs <- ``--global-batch-size`` (mbs dp); seq <-
``--seq-length``; recompute <- ``--recompute-granularity`` (``--recompute-activations``
= selective), ``--recompute-method block --recompute-num-layers N`` -> the first N layers
of each chunk, ``uniform`` -> every layer; uneven layers <- ``--decoder-first/last-
pipeline-num-layers`` or ``--pipeline-model-parallel-layout``; schedule interleaved when
vpp > 1; engine megatron.

Architecture from the flags when ``--num-layers``, ``--hidden-size``,
``--num-attention-heads`` and ``--vocab-size`` are all there (``--swiglu``: llama MLP,
``--ffn-hidden-size`` default as Megatron-LM: 4h, or int(8h/3) rounded down to 64 with
SwiGLU; ``--num-query-groups`` with ``--group-query-attention``; embeddings tied unless
``--untie-embeddings-and-output-weights``); otherwise ``-m MODEL``.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

from ndplan.catalog.model import model_from_config
from ndplan.errors import NdplanError, warn
from ndplan.export import megatron as X
from ndplan.interop import arith
from ndplan.interop.base import CheckInput, positive, resolve_model, world_dp
from ndplan.interop.textedit import REMOVE
from ndplan.points import default_schedule

FLAG, SWITCHES = X.FLAG, X.SWITCHES
MODEL_FLAGS = {"hidden": "--hidden-size", "heads": "--num-attention-heads", "ffn": "--ffn-hidden-size",
               "groups": "--num-query-groups", "vocab": "--vocab-size", "positions": "--max-position-embeddings"}
MODEL_SWITCHES = {"gqa": "--group-query-attention", "swiglu": "--swiglu",
                  "untie": "--untie-embeddings-and-output-weights", "recompute_activations": "--recompute-activations"}
LAUNCHER = {"nproc": ("--nproc_per_node", "--nproc-per-node"), "nnodes": ("--nnodes",)}
_INT = {"layers", "tp", "pp", "cp", "ep", "etp", "layers_per_vstage", "vstages_per_rank", "first_layers",
        "last_layers", "mbs", "gbs", "seq", "recompute_num_layers"}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a flag without its value as one NdplanError (argparse would
    print its usage and exit)."""

    def error(self, message: str):
        raise NdplanError("FILE", "Megatron-LM arguments", message, "give every flag its value")


def parser() -> argparse.ArgumentParser:
    p = _Parser(allow_abbrev=False, add_help=False)
    for name, flag in FLAG.items():
        if name in SWITCHES:
            p.add_argument(flag, dest=name, action="store_true")
        else:
            p.add_argument(flag, dest=name, type=str)
    for name, flag in MODEL_FLAGS.items():
        p.add_argument(flag, dest=name, type=str)
    for name, flag in MODEL_SWITCHES.items():
        p.add_argument(flag, dest=name, action="store_true")
    for name, flags in LAUNCHER.items():
        p.add_argument(*flags, dest=name, type=str)
    return p


# --------------------------------------------------------------------------- words

_VAR = re.compile(r"\$\{(\w+)(?:\[@\])?(?:(:?[-=])([^}]*))?\}|\$(\w+)")
"""``${NAME}``, ``${NAME[@]}``, ``${NAME:-default}`` / ``${NAME:=default}`` (and without
the colon), ``$NAME``."""
_ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_]\w*)=(.*)$")


def _substitute(word: str, env: dict, line: int) -> str:
    """Variables replaced from the script's assignments; an unset one with a default
    takes the default (``:=`` also assigns it); other unset ones stay as written."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(4)
        if name in env and not (m.group(2) and m.group(2).startswith(":") and env[name][0] == ""):
            return env[name][0]
        if m.group(2) is not None:
            default = m.group(3)
            if m.group(2).endswith("="):
                env[name] = (default, line)
            return default
        return m.group(0)
    return _VAR.sub(sub, word)


def _arith(text: str, env: dict, line: int) -> str:
    """``$(( ))`` integer arithmetic evaluated (interop.arith; no eval); ``line`` is 0-based."""
    if "$((" not in text:
        return text
    try:
        return arith.expand(text, lambda name: env[name][0] if name in env else None)
    except NdplanError as e:
        raise NdplanError(e.field, e.value, f"{e.problem} (line {line + 1})", e.fix) from None


def _expand(word: str, env: dict, line: int) -> str:
    """Arithmetic evaluated, then variables substituted."""
    return _substitute(_arith(word, env, line), env, line)


def _statements(line: str) -> list[str]:
    """A shell line split at ``;`` outside quotes (comments removed first)."""
    code, _ = _split_comment(line)
    out, cur, quote = [], "", None
    for ch in code:
        if quote:
            quote = None if ch == quote else quote
        elif ch in ("'", '"'):
            quote = ch
        elif ch == ";":
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return out + [cur]


def words(text: str) -> list[tuple[str, int]]:
    """(word, 0-based line) of the script after variable expansion; a word that comes
    from a variable carries the line of its assignment.

    The script is read top to bottom without running it: ``if``/``case``/loops are not
    evaluated, so a variable assigned twice takes its last value (a warning says so)."""
    env: dict[str, tuple[str, int]] = {}
    out: list[tuple[str, int]] = []
    array: str | None = None
    reassigned: list[str] = []

    def add_array_word(tok: str, i: int) -> None:
        nonlocal array
        close = tok.endswith(")")
        tok = tok[:-1] if close else tok
        if tok:
            w = _expand(tok, env, i)
            env[array] = ((env[array][0] + " " + w).strip(), env[array][1])
            out.append((w, i))
        if close:
            array = None

    for i, raw in enumerate(text.splitlines()):
        line = raw.rstrip()
        if line.endswith("\\"):
            line = line[:-1]
        for stmt in _statements(line):
            stmt = _arith(stmt, env, i)  # before splitting: $(( 16 * N )) holds spaces
            try:
                toks = shlex.split(stmt, comments=True)
            except ValueError:
                toks = stmt.split()
            for tok in toks:
                if array is not None:
                    add_array_word(tok, i)
                    continue
                m = _ASSIGN.match(tok)
                if m and not tok.startswith("-"):
                    name, val = m.groups()
                    if val.startswith("("):  # NAME=( ... ), on one line or several
                        array, env[name] = name, ("", i)
                        add_array_word(val[1:], i) if val[1:] else None
                        continue
                    val = _expand(val, env, i)
                    if name in env and env[name][0] != val and env[name][0] and name not in reassigned:
                        reassigned.append(name)
                        warn(name, val, f"assigned again on line {i + 1} (first on line {env[name][1] + 1}); "
                             "ndplan reads the script without running if/else or loops, so the last value counts",
                             "check that it is the one your launch uses")
                    env[name] = (val, i)
                    if "--" in val:  # ARGS="--num-layers 32 ...": its flags sit on this line
                        out += [(w, i) for w in val.split()]
                    continue
                if tok in ("export", "then", "else", "fi", "do", "done", "if"):
                    continue
                m = _VAR.fullmatch(tok)
                name = m and (m.group(1) or m.group(4))
                if name and name in env and " " in env[name][0]:
                    continue  # $ARGS: its words were recorded at the assignment
                out.append((_expand(tok, env, i), i))
    return out


def locate(text: str) -> dict[str, int]:
    """Known flag -> 0-based line of its last occurrence."""
    known = set(FLAG.values()) | set(MODEL_FLAGS.values()) | set(MODEL_SWITCHES.values())
    out = {}
    for w, i in words(text):
        flag = w.split("=", 1)[0]
        if flag in known:
            out[flag] = i
    return out


# --------------------------------------------------------------------------- model, strategy

def _int(args, name: str, flag: str, default=None):
    v = getattr(args, name)
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise NdplanError(flag, v, "not an integer", "set the variable it uses in the script, or write the number") from None
    return positive(flag, n, "the Megatron-LM arguments")


def _model(args, name: str):
    L, h = _int(args, "layers", FLAG["layers"]), _int(args, "hidden", MODEL_FLAGS["hidden"])
    a, V = _int(args, "heads", MODEL_FLAGS["heads"]), _int(args, "vocab", MODEL_FLAGS["vocab"])
    if None in (L, h, a, V):
        return None
    ffn_default = (int(8 * h / 3) // 64) * 64 if args.swiglu else 4 * h  # Megatron-LM arguments.py
    cfg = {"model_type": "llama" if args.swiglu else "gpt", "hidden_size": h, "num_hidden_layers": L,
           "num_attention_heads": a, "intermediate_size": _int(args, "ffn", MODEL_FLAGS["ffn"], ffn_default),
           "vocab_size": V, "num_key_value_heads": _int(args, "groups", MODEL_FLAGS["groups"], a) if args.gqa else a,
           "tie_word_embeddings": not args.untie,
           "max_position_embeddings": _int(args, "positions", MODEL_FLAGS["positions"], 0) or 0}
    return model_from_config(cfg, name, f"Megatron-LM flags in {name}")


def _layers(args, L: int, pp: int, vpp: int):
    first, last = _int(args, "first_layers", FLAG["first_layers"]), _int(args, "last_layers", FLAG["last_layers"])
    if args.layout:
        groups = args.layout.split("|")
        return tuple(g.count("t") for g in groups)
    if first is None and last is None:
        return None
    first = first if first is not None else (L - (last or 0)) // pp
    last = last if last is not None else (L - first) // pp
    rest = L - first - last
    if pp < 2 or (pp > 2 and rest % (pp - 2)) or (pp == 2 and rest):
        raise NdplanError(FLAG["first_layers"], first, f"with last={last} the other {rest} layers do not split "
                          f"evenly over {pp - 2} middle stages", "change the first/last stage layer counts")
    return (first,) + (rest // (pp - 2),) * (pp - 2) + (last,) if pp > 2 else (first, last)


def _recompute(args, notes: list) -> dict:
    gran = args.recompute_granularity or ("selective" if args.recompute_activations else None)
    if gran is None:
        return {"recompute": "none"}
    if gran not in ("full", "selective"):
        raise NdplanError(FLAG["recompute_granularity"], gran, "unknown granularity", "give full or selective")
    if gran == "selective":
        return {"recompute": "selective"}
    n = _int(args, "recompute_num_layers", FLAG["recompute_num_layers"], 1)
    if args.recompute_method == "block":
        return {"recompute": "full", "recompute_layers": n}
    if n > 1:
        notes.append(f"uniform recompute in groups of {n} layers estimated as full recompute of every layer")
    return {"recompute": "full"}


def read(path: Path, text: str, *, model=None, gpus=None, seq=None, gbs=None) -> CheckInput:
    args, unknown = parser().parse_known_args([w for w, _ in words(text)])
    if not any(getattr(args, n) is not None and getattr(args, n) is not False for n in FLAG):
        raise NdplanError("FILE", path.name, "no Megatron-LM parallel/batch flag found (e.g. "
                          "--tensor-model-parallel-size)", "give a Megatron launch script, or --format for another framework")
    notes: list[str] = []
    spec, origin = resolve_model(model, _model(args, path.name), f"flags in {path.name}",
                                 f"{path.name} lacks --num-layers/--hidden-size/--num-attention-heads/--vocab-size")
    tp, pp, cp = (_int(args, n, FLAG[n], 1) for n in ("tp", "pp", "cp"))
    launched = _int(args, "nproc", "--nproc_per_node") * _int(args, "nnodes", "--nnodes", 1) if args.nproc else None
    if gpus is None and launched is not None:
        gpus, gsrc = launched, "torchrun --nproc_per_node x --nnodes"
    else:
        gsrc = "--gpus"
        if launched is not None and launched != gpus:
            notes.append(f"--gpus {gpus} replaces the script's torchrun count ({launched}); dp follows it")
    gpus, dp = world_dp(gpus, tp, pp, cp, "Megatron-LM parallel sizes", path.name)
    L = spec.num_hidden_layers
    vpp = _int(args, "vstages_per_rank", FLAG["vstages_per_rank"])
    per_v = _int(args, "layers_per_vstage", FLAG["layers_per_vstage"])
    if vpp is None and per_v is not None:
        if L % (pp * per_v):
            raise NdplanError(FLAG["layers_per_vstage"], per_v, f"pp*{per_v} does not divide num_layers={L}",
                              "change it or --pipeline-model-parallel-size")
        vpp = L // (pp * per_v)
    vpp = vpp or 1
    mbs = _int(args, "mbs", FLAG["mbs"], 1)
    seq_ = seq if seq is not None else _int(args, "seq", FLAG["seq"])
    if seq_ is None:
        raise NdplanError(FLAG["seq"], None, f"missing in {path.name}; add it or give --seq")
    kw = dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=_int(args, "ep", FLAG["ep"], 1), etp=_int(args, "etp", FLAG["etp"], 1),
              vpp=vpp, mbs=mbs, gbs=gbs or _int(args, "gbs", FLAG["gbs"], mbs * dp), seq=seq_,
              zero=3 if args.fsdp2 else 1 if args.distributed_optimizer else 0, sp=bool(args.sp) or tp == 1,
              schedule=default_schedule(vpp), engine="megatron",
              offload_optimizer=bool(args.offload_optimizer), layers_per_stage=_layers(args, L, pp, vpp))
    kw |= _recompute(args, notes)
    from ndplan.strategy import Strategy
    strat = Strategy(**kw)
    strat.check(spec, gpus)
    loc = locate(text)
    org = {f: f"line {loc[FLAG[f]] + 1}: {FLAG[f]}" if FLAG[f] in loc else "Megatron-LM default"
           for f in ("tp", "pp", "cp", "mbs", "gbs", "seq", "sp")}
    org |= {"gpus": gsrc, "dp": "gpus / (tp*pp*cp)", "zero": "--use-distributed-optimizer / --use-torch-fsdp2",
            "recompute": "--recompute-* flags"}
    if seq is not None:
        org["seq"] = "--seq"
    return CheckInput(path=path, fmt="megatron", text=text, model=spec, model_origin=origin, strategy=strat,
                      gpus=gpus, origin=org, lines={k: v + 1 for k, v in loc.items()},
                      unknown=tuple(u for u in unknown if u.startswith("--")), notes=tuple(notes))


# --------------------------------------------------------------------------- edits

fields = X.fields


def _flag_re(flag: str, switch: bool) -> re.Pattern:
    val = "" if switch else r"(?:=|[ \t]+)(\"[^\"]*\"|'[^']*'|[^\s\\;)\"']+)"
    return re.compile(r"(?<![\w-])" + re.escape(flag) + val + r"(?![\w-])")


def edit(text: str, changes: dict) -> str:
    """Set, add (after the last known flag) or remove flags; ``True`` adds a switch."""
    lines = text.splitlines()
    for flag, value in changes.items():
        loc = locate("\n".join(lines))
        switch = value is True or (value is REMOVE and flag in {FLAG[s] for s in SWITCHES})
        if flag in loc:
            i = loc[flag]
            rx = _flag_re(flag, switch)
            if value is REMOVE:
                new = rx.sub("", lines[i], count=1)
                if new.strip() in ("", "\\"):
                    if not lines[i].rstrip().endswith("\\") and i > 0 and lines[i - 1].rstrip().endswith("\\"):
                        lines[i - 1] = lines[i - 1].rstrip()[:-1].rstrip()
                    del lines[i]
                else:
                    indent = re.match(r"[ \t]*", new).group(0)  # keep the line's indentation
                    lines[i] = indent + re.sub(r"[ \t]{2,}", " ", new[len(indent):])
            elif not switch:
                m = rx.search(lines[i])
                lines[i] = lines[i][:m.start(1)] + shlex.quote(str(value)) + lines[i][m.end(1):]
            continue
        if value is REMOVE:
            continue
        _add(lines, loc, flag if value is True else f"{flag} {shlex.quote(str(value))}")
    return "\n".join(lines) + ("\n" if text.endswith("\n") else "")


_LAUNCHER = re.compile(r"(?:^|\s)(?:torchrun|python3?|srun|deepspeed|mpirun)\s|pretrain_\w+\.py")
"""A line that runs a command (its flags are arguments of that line, not of the next)."""


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: a ``#`` outside quotes, at the start or after
    blank space, starts a comment (bash's rule)."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k].rstrip(), line[k:]
    return line, ""


def _add(lines: list[str], loc: dict, words_: str) -> None:
    i = max(loc.values()) if loc else len(lines) - 1
    line, comment = _split_comment(lines[i].rstrip())
    tail = f"  {comment}" if comment else ""  # the words go before a trailing comment
    indent = re.match(r"\s*", line).group(0) or ("    " if "\\" in "".join(lines) else "")
    if _ASSIGN.match(line.strip()) and line.endswith(("'", '"')):  # ARGS="... --flag v"
        lines[i] = line[:-1] + f" {words_}" + line[-1] + tail
    elif line.endswith(")"):  # last word of an array
        lines[i] = line[:-1].rstrip() + f" {words_} )" + tail
    elif line.endswith("\\"):
        lines.insert(i + 1, f"{indent}{words_} \\")
    elif comment or (_LAUNCHER.search(line) and not any(x.rstrip().endswith("\\") for x in lines)):
        lines[i] = f"{line} {words_}{tail}"  # on the command's own line ("\\" cannot follow a comment)
    elif any(x.rstrip().endswith("\\") for x in lines):  # last line of a continued command
        lines[i] = line + " \\"
        lines.insert(i + 1, f"{indent}{words_}")
    else:  # argument file: one flag per line
        lines.insert(i + 1, f"{indent}{words_}")
