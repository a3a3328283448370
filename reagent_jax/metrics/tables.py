"""Markdown tables for the summaries printed at the end of runs (eval scores, bench figures)."""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence


def _cell(value: Any, floatfmt: str) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, floatfmt)
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:  # NumPy / JAX scalars
        return _cell(value.item(), floatfmt)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or getattr(getattr(value, "dtype", None), "kind", "") in ("i", "u", "f")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Optional[Sequence[str] | Mapping[str, str]] = None,
                   *, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table, padded so it also reads well as plain text.

    `columns` picks and orders keys (a mapping renames them: key -> header); default: keys in
    first-seen order. Missing values are blank; numeric columns are right-aligned.
    """
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    headers = dict(columns) if isinstance(columns, Mapping) else {c: c for c in columns}
    keys = list(headers)
    if not keys:
        raise ValueError("markdown_table needs at least one column")
    cells = [[_cell(row.get(k), floatfmt) for k in keys] for row in rows]
    numeric = [all(_is_number(row[k]) for row in rows if row.get(k) is not None) and
               any(row.get(k) is not None for row in rows) for k in keys]
    head = [_cell(headers[k], floatfmt) for k in keys]
    widths = [max(3, len(head[j]), *(len(r[j]) for r in cells)) for j in range(len(keys))]

    def line(items: list[str]) -> str:
        padded = [s.rjust(w) if num else s.ljust(w) for s, w, num in zip(items, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if num else "-" * w for w, num in zip(widths, numeric)) + " |"
    return "\n".join([line(head), rule, *(line(r) for r in cells)])
