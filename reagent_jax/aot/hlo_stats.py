"""What a compiled program moves and computes, read from its optimised HLO text: collective bytes
by kind, copies of large buffers and matmul FLOPs, each counted as often as it executes.

XLA's `cost_analysis()` counts a loop body once; here every computation's ops are multiplied by
the trip counts of the while loops around it (the layer scan, the micro-batch scan, the
logprob chunks, the decode loop). A loop's trip count is the largest integer constant its
condition compares against (exact for scans; for a while loop that can end early, an upper
bound, which is what a per-call budget needs).

Bytes per collective are the full (unsharded-side) tensor of one device's op: the gathered
result of an all-gather, the operand of a reduce-scatter, the operand of an all-reduce,
all-to-all or collective-permute. Summed over kinds that is the traffic a chip's links carry up
to a factor (n - 1) / n of the group size, the same convention as the minimum each program states.
"""
from __future__ import annotations

import collections
import itertools
import re
from typing import Iterator

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")

_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8,
          "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|c64|c128|f8e\w+)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*")
_CALLS = re.compile(r"\b(?:calls|to_apply|body|branch_computations)=\{?%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_CONST = re.compile(r"constant\((\d+)\)")
_CHANNEL = re.compile(r"\bchannel_id=(\d+)")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_GEMM_TARGETS = ("reagent_sgemm",)  # the CPU kernels' plain GEMMs (kernels/cpu/gemm.py)
_ON_CHIP = re.compile(r"\{[^}]*S\(1\)\}")  # a layout that puts an array in VMEM


def shape_bytes(type_text: str) -> float:
    """Bytes of every array shape in an HLO type (a tuple sums its elements)."""
    total = 0.0
    for dtype, dims in _SHAPE.findall(type_text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES.get(dtype, 1)
    return total


def _split_type(rest: str) -> tuple[str, str, str]:
    """'TYPE op(args), attrs' -> (TYPE, op, 'args), attrs')."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                break
        type_text, tail = rest[:i + 1], rest[i + 1:].lstrip()
    else:
        type_text, _, tail = rest.partition(" ")
    op, _, args = tail.partition("(")
    return type_text, op.strip(), args


_Instr = collections.namedtuple("_Instr", "name type op args")


def parse(hlo: str) -> tuple[dict[str, list[_Instr]], str]:
    """Optimised HLO text -> (computation name -> its instructions, the entry computation's name);
    `collective_bytes` and `large_copies` take the text or this, so a program is read once."""
    return hlo if isinstance(hlo, tuple) else _computations(hlo)


def _computations(hlo: str) -> tuple[dict[str, list[_Instr]], str]:
    comps: dict[str, list[_Instr]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            comps[current] = []
            if line.startswith("ENTRY"):
                entry = current
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            type_text, op, args = _split_type(line[m.end():])
            comps[current].append(_Instr(m.group(1), type_text, op, args))
    return comps, entry


def _trip_count(cond: list[_Instr]) -> int:
    consts = [int(c) for i in cond for c in _CONST.findall(i.op + "(" + i.args)]
    return max(consts) if consts else 1


def _operand_names(args: str) -> list[str]:
    head = args.split(")")[0]
    return re.findall(r"%([\w.\-]+)", head)


def _kind(op: str) -> str | None:
    base = op[:-len("-start")] if op.endswith("-start") else op
    return base if base in KINDS else None


def _walk(comps, entry, into_fusions: bool = True) -> Iterator[tuple[_Instr, int, dict[str, str]]]:
    """(instruction, times it executes, name -> type of its computation) over the call graph;
    without `into_fusions`, the ops inside fusions (no buffers of their own) are left out."""
    seen_stack = set()

    def visit(name, mult):
        if name not in comps or name in seen_stack:
            return
        seen_stack.add(name)
        types = {i.name: i.type for i in comps[name]}
        for ins in comps[name]:
            yield ins, mult, types
            if ins.op == "fusion" and not into_fusions:
                continue
            if ins.op == "while":
                body = re.search(r"body=%([\w.\-]+)", ins.args)
                cond = re.search(r"condition=%([\w.\-]+)", ins.args)
                trips = _trip_count(comps.get(cond.group(1), [])) if cond else 1
                if body:
                    yield from visit(body.group(1), mult * trips)
                continue
            if ins.op in ("all-reduce", "all-reduce-start", "reduce-scatter", "reduce", "sort", "map",
                          "scatter", "select-and-scatter", "reduce-window"):
                continue  # reducer computations hold no collectives
            branches = _BRANCHES.search(ins.args)
            names = (re.findall(r"%([\w.\-]+)", branches.group(1)) if branches else
                     [n for n in _CALLS.findall(ins.args)])
            for callee in names:
                yield from visit(callee, mult)
        seen_stack.discard(name)

    yield from visit(entry, 1)


def collective_bytes(hlo) -> dict[str, float]:
    """Bytes per collective kind (see the module docstring), loops unrolled by their trip counts.
    The TPU compiler writes a reduce-scatter as an all-reduce + dynamic-slice inside an
    `all-reduce-scatter` fusion: counted as the reduce-scatter it is. It also splits one async
    collective into a start fusion, continuation fusions (overlapped with compute, possibly inside
    an inner loop) and a done fusion, each holding a copy of the op with the same `channel_id`:
    such an op is one transfer, counted once at the outermost loop level holding a piece of it."""
    comps, entry = parse(hlo)
    rs_fusions = {name for name in comps if name.startswith("all-reduce-scatter")}
    rs_members = {ins.name for name in rs_fusions for ins in comps[name]}
    transfers: dict[object, tuple[str, float, int]] = {}  # channel (or each op) -> (kind, bytes, executions)
    unnamed = itertools.count()
    for ins, mult, types in _walk(comps, entry):
        kind = _kind(ins.op)
        if kind is None:
            continue
        if kind == "all-reduce" and ins.name in rs_members:
            kind = "reduce-scatter"
        operands = sum(shape_bytes(types.get(n, "")) for n in _operand_names(ins.args))
        result = shape_bytes(ins.type)
        if ins.op.endswith("-start") and kind != "all-reduce":
            result = max(result - operands, 0.0)  # async results carry their operands (and u32 contexts)
        size = result if kind == "all-gather" else max(result, operands)
        channel = _CHANNEL.search(ins.args)
        key = channel.group(1) if channel else next(unnamed)
        if key not in transfers or mult < transfers[key][2]:
            transfers[key] = (kind, size, mult)
    out = {k: 0.0 for k in KINDS}
    for kind, size, mult in transfers.values():
        out[kind] += size * mult
    return out


def link_bytes(by_kind: dict[str, float]) -> float:
    """Bytes over a chip's links implied by `collective_bytes` (ring algorithms, up to the
    (n - 1) / n factor): an all-reduce moves its tensor twice (a reduce-scatter + an all-gather),
    every other kind once."""
    return sum(v * (2.0 if k == "all-reduce" else 1.0) for k, v in by_kind.items())


def large_copies(hlo, min_bytes: float) -> list[tuple[str, float, int]]:
    """(name, bytes, executions) of `copy` ops whose result is at least `min_bytes` (a copy of a
    KV cache or a weight stack shows up here). Copies into or out of on-chip memory (TPU layouts
    marked `S(1)`, VMEM: a `copy-start` type is (destination, source, context)) that keep the
    layout are left out: that is the compiler staging an array that fits there and writing it
    back, not a second copy in HBM (an array of a real model's size never fits). One that
    changes the layout is a relayout, which a real model's array makes in HBM: it counts."""
    comps, entry = parse(hlo)
    out = []
    for ins, mult, types in _walk(comps, entry, into_fusions=False):
        if ins.op not in ("copy", "copy-start"):
            continue
        source = " ".join(types.get(n, "") for n in _operand_names(ins.args))
        staged = _ON_CHIP.search(ins.type) or _ON_CHIP.search(source)
        if not staged or _relayout(ins.type, source):
            size = shape_bytes(ins.type) / (2 if ins.op == "copy-start" else 1)
            if size >= min_bytes:
                out.append((ins.name, size, mult))
    return out


def _relayout(dest: str, source: str) -> bool:
    """Whether a copy between these HLO types (their first arrays) changes the dimension order
    or, where both name one, the tiling; the memory space (`S(1)`) is not layout."""
    def layout(type_text):  # "{4,2,3,1,0:T(8,128)(2,1)S(1)}" -> ("4,2,3,1,0", "T(8,128)(2,1)")
        m = re.search(r"\{([^}:]*):?([^}]*)\}", type_text)
        return (m.group(1), re.sub(r"S\(\d+\)", "", m.group(2))) if m else ("", "")
    (order_d, tiles_d), (order_s, tiles_s) = layout(dest), layout(source)
    return order_d != order_s or bool(tiles_d and tiles_s and tiles_d != tiles_s)


def _dims(type_text: str) -> list[int]:
    m = _SHAPE.search(type_text)
    return [int(d) for d in filter(None, m.group(2).split(","))] if m else []


def _count(dims) -> float:
    n = 1.0
    for d in dims:
        n *= d
    return n


def matmul_flops(hlo) -> float:
    """FLOPs of every `dot` (2 x result elements x contracted size, batch dims included) and of the
    CPU kernels' GEMM custom calls, loops unrolled by their trip counts: what the program executes
    in matmuls, rematerialisation included (compare with a model's analytic FLOPs for HFU / MFU)."""
    comps, entry = parse(hlo)
    total = 0.0
    for ins, mult, types in _walk(comps, entry):
        if ins.op == "dot":
            lhs = _dims(types.get(_operand_names(ins.args)[0], ""))
            contracting = _CONTRACTING.search(ins.args)
            k = _count(lhs[int(i)] for i in filter(None, contracting.group(1).split(","))) if contracting else 1.0
            total += 2.0 * _count(_dims(ins.type)) * k * mult
        elif ins.op == "custom-call" and any(f'custom_call_target="{t}"' in ins.args for t in _GEMM_TARGETS):
            a, b = (_count(_dims(types.get(n, ""))) for n in _operand_names(ins.args)[:2])
            out = _count(_dims(ins.type))
            total += 2.0 * out * (a * b / out) ** 0.5 * mult  # [M, K] x [K, N]: a * b / out = K^2
    return total
