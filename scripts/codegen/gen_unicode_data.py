"""Generate src/text/unicode_data.cpp: the Unicode tables the C++ CLIP tokenizer
needs to reproduce transformers' CLIPTokenizer (a `tokenizers` pipeline).

transformers' CLIPTokenizer runs, per text segment between special tokens:
    NFC -> Replace(\\s+, " ") -> Lowercase -> Split(CLIP regex) -> ByteLevel -> BPE
and those steps do NOT share one Unicode version: the regex classes (\\p{L},
\\p{N}, \\s) come from Oniguruma, Lowercase from Rust's char::to_lowercase,
NFC from the unicode-normalization-alignments crate (an older Unicode). Python's
unicodedata is yet another version. So every table is taken from what the
installed `tokenizers` library actually does, probed code point by code point;
Python's unicodedata only proposes candidates (decomposition pairs, combining
classes) that are then confirmed against `tokenizers`.

Run with the project venv (needs `tokenizers`, as installed with transformers):
    .venv/bin/python scripts/codegen/gen_unicode_data.py [--out src/text/unicode_data.cpp]
(--out defaults to the repository's src/text/unicode_data.cpp, wherever it runs from).
"""
from __future__ import annotations

import argparse
import sys
import unicodedata
from pathlib import Path

import tokenizers
from tokenizers import Regex, normalizers, pre_tokenizers

ALL_CPS = [c for c in range(0x110000) if not (0xD800 <= c <= 0xDFFF)]
HANGUL_S_BASE, HANGUL_S_COUNT = 0xAC00, 11172


def regex_class(pattern: str) -> list[int]:
    """Code points a one-character Oniguruma class (as tokenizers builds it) matches."""
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
    text = "".join(chr(c) for c in ALL_CPS)
    out: set[int] = set()
    for piece, _ in split.pre_tokenize_str(text):
        out.update(ord(ch) for ch in piece)
    return sorted(out)


def to_ranges(cps: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for c in cps:
        if ranges and ranges[-1][1] + 1 == c:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    return ranges


def lowercase_tables() -> tuple[list[tuple[int, int, int, int]], list[tuple[int, list[int]]]]:
    """(single-code-point runs as (first, last, stride, delta), multi-code-point mappings)."""
    lower = normalizers.Lowercase()
    singles: list[tuple[int, int]] = []
    multi: list[tuple[int, list[int]]] = []
    for c in ALL_CPS:
        out = lower.normalize_str(chr(c))
        if out == chr(c):
            continue
        if len(out) == 1:
            singles.append((c, ord(out)))
        else:
            multi.append((c, [ord(ch) for ch in out]))
    runs: list[tuple[int, int, int, int]] = []  # first, last, stride, delta
    for c, lc in singles:
        delta = lc - c
        if runs:
            first, last, stride, d = runs[-1]
            if d == delta and (c - last) in (1, 2) and (first == last or c - last == stride):
                runs[-1] = (first, c, c - last, d)
                continue
        runs.append((c, c, 1, delta))
    return runs, multi


def nfc_tables() -> tuple[dict[int, list[int]], dict[int, int], list[tuple[int, int, int]]]:
    """Full canonical decompositions, combining classes and composition pairs, as
    tokenizers' NFD/NFC apply them (Hangul syllables are algorithmic, left out)."""
    nfd = normalizers.NFD()
    nfc = normalizers.NFC()
    decomp: dict[int, list[int]] = {}
    for c in ALL_CPS:
        if HANGUL_S_BASE <= c < HANGUL_S_BASE + HANGUL_S_COUNT:
            continue
        out = nfd.normalize_str(chr(c))
        if out != chr(c):
            decomp[c] = [ord(ch) for ch in out]

    # Combining classes, only for code points that survive decomposition, probed
    # through NFD's canonical ordering: "a F S" becomes "a S F" iff
    # 0 < ccc(S) < ccc(F). One reference mark per class Python knows, kept only if
    # tokenizers agrees it is nonzero; a candidate's class is the unique reference
    # class it swaps with in neither order.
    def reorders(first: int, second: int) -> bool:
        return nfd.normalize_str("a" + chr(first) + chr(second)) == "a" + chr(second) + chr(first)

    py_classes = {c: unicodedata.combining(chr(c)) for c in ALL_CPS if unicodedata.combining(chr(c))}
    refs: dict[int, int] = {}
    for c in sorted(py_classes):
        v = py_classes[c]
        if v in refs or c in decomp:
            continue
        ok = reorders(c, 0x0334) if v > 1 else reorders(0x0345, c)  # U+0334 has class 1, U+0345 class 240
        if ok:
            refs[v] = c

    def probe_class(x: int) -> int:
        swaps = {v: (reorders(x, r), reorders(r, x)) for v, r in refs.items() if r != x}
        if not any(a or b for a, b in swaps.values()):
            return 0
        found = [v for v, (a, b) in swaps.items() if not a and not b]
        if x in refs.values():
            found.append(next(v for v, r in refs.items() if r == x))
        if len(found) != 1:
            sys.exit(f"gen_unicode_data: cannot pin the combining class of U+{x:04X} (candidates {found})")
        return found[0]

    ccc: dict[int, int] = {}
    differ = 0
    for x in sorted((set(py_classes) | set(regex_class(r"\p{M}"))) - set(decomp)):
        v = probe_class(x)
        if v:
            ccc[x] = v
        differ += v != py_classes.get(x, 0)
    print(f"note: {differ} combining classes differ from Python's (tokenizers' NFC uses an older Unicode)")

    # Primary composites: two-code-point canonical decompositions that NFC recomposes.
    comps: list[tuple[int, int, int]] = []
    for c in ALL_CPS:
        if HANGUL_S_BASE <= c < HANGUL_S_BASE + HANGUL_S_COUNT or c not in decomp:
            continue
        d = unicodedata.decomposition(chr(c))
        if not d or d.startswith("<"):
            continue
        parts = [int(p, 16) for p in d.split()]
        if len(parts) != 2:
            continue
        if nfc.normalize_str(chr(parts[0]) + chr(parts[1])) == chr(c):
            comps.append((parts[0], parts[1], c))
    comps.sort()
    return decomp, ccc, comps


def fmt_cp(c: int) -> str:
    return f"0x{c:X}"


def emit(out: Path) -> None:
    letters = to_ranges(regex_class(r"\p{L}"))
    numbers = to_ranges(regex_class(r"\p{N}"))
    spaces = to_ranges(regex_class(r"\s"))
    lower_runs, lower_multi = lowercase_tables()
    decomp, ccc, comps = nfc_tables()
    ccc_runs: list[tuple[int, int, int]] = []
    for c in sorted(ccc):
        if ccc_runs and ccc_runs[-1][1] + 1 == c and ccc_runs[-1][2] == ccc[c]:
            ccc_runs[-1] = (ccc_runs[-1][0], c, ccc[c])
        else:
            ccc_runs.append((c, c, ccc[c]))

    lines: list[str] = []
    w = lines.append
    w("// GENERATED FILE, DO NOT EDIT. Regenerate with:")
    w("//   .venv/bin/python scripts/codegen/gen_unicode_data.py --out src/text/unicode_data.cpp")
    w(f"// Probed from tokenizers {tokenizers.__version__} (Python unicodedata {unicodedata.unidata_version} for candidates).")
    w('#include "text/unicode_data.h"')
    w("")
    w("namespace sdxl::unicode_data {")
    w("namespace {")
    w("")

    def range_array(name: str, ranges: list[tuple[int, int]]) -> None:
        w(f"constexpr Range {name}[] = {{")
        row: list[str] = []
        for a, b in ranges:
            row.append(f"{{{fmt_cp(a)}, {fmt_cp(b)}}},")
            if len(row) == 6:
                w("    " + " ".join(row))
                row = []
        if row:
            w("    " + " ".join(row))
        w("};")
        w("")

    range_array("kLetterData", letters)
    range_array("kNumberData", numbers)
    range_array("kSpaceData", spaces)

    w("constexpr LowerRun kLowerRunData[] = {")
    for a, b, s, d in lower_runs:
        w(f"    {{{fmt_cp(a)}, {fmt_cp(b)}, {s}, {d}}},")
    w("};")
    w("")
    w("constexpr MultiLower kMultiLowerData[] = {")
    for c, seq in lower_multi:
        if len(seq) > 3:
            sys.exit(f"gen_unicode_data: lowercase of U+{c:04X} has {len(seq)} code points")
        padded = seq + [0] * (3 - len(seq))
        w(f"    {{{fmt_cp(c)}, {len(seq)}, {{{', '.join(fmt_cp(x) for x in padded)}}}}},")
    w("};")
    w("")
    w("constexpr CombiningClass kCombiningClassData[] = {")
    for a, b, v in ccc_runs:
        w(f"    {{{fmt_cp(a)}, {fmt_cp(b)}, {v}}},")
    w("};")
    w("")
    # Decompositions: one flat code point array plus (cp, offset, length) index.
    flat: list[int] = []
    index: list[tuple[int, int, int]] = []
    for c in sorted(decomp):
        index.append((c, len(flat), len(decomp[c])))
        flat.extend(decomp[c])
    if len(flat) >= 1 << 16:
        sys.exit("gen_unicode_data: decomposition data exceeds uint16 offsets")
    w("constexpr char32_t kDecompositionCodePoints[] = {")
    for i in range(0, len(flat), 10):
        w("    " + " ".join(f"{fmt_cp(x)}," for x in flat[i : i + 10]))
    w("};")
    w("")
    w("constexpr Decomposition kDecompositionData[] = {")
    row = []
    for c, off, n in index:
        row.append(f"{{{fmt_cp(c)}, {off}, {n}}},")
        if len(row) == 5:
            w("    " + " ".join(row))
            row = []
    if row:
        w("    " + " ".join(row))
    w("};")
    w("")
    w("constexpr Composition kCompositionData[] = {")
    row = []
    for a, b, c in comps:
        row.append(f"{{{fmt_cp(a)}, {fmt_cp(b)}, {fmt_cp(c)}}},")
        if len(row) == 4:
            w("    " + " ".join(row))
            row = []
    if row:
        w("    " + " ".join(row))
    w("};")
    w("")
    w("}  // namespace")
    w("")
    for public, data in [
        ("kLetters", "kLetterData"),
        ("kNumbers", "kNumberData"),
        ("kSpaces", "kSpaceData"),
        ("kLowerRuns", "kLowerRunData"),
        ("kMultiLower", "kMultiLowerData"),
        ("kCombiningClasses", "kCombiningClassData"),
        ("kDecompositions", "kDecompositionData"),
        ("kDecompositionPool", "kDecompositionCodePoints"),
        ("kCompositions", "kCompositionData"),
    ]:
        typ = {
            "kLetters": "Range", "kNumbers": "Range", "kSpaces": "Range", "kLowerRuns": "LowerRun",
            "kMultiLower": "MultiLower", "kCombiningClasses": "CombiningClass",
            "kDecompositions": "Decomposition", "kDecompositionPool": "char32_t", "kCompositions": "Composition",
        }[public]
        w(f"const std::span<const {typ}> {public}({data});")
    w("")
    w("}  // namespace sdxl::unicode_data")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(
        f"wrote {out}: {len(letters)} letter ranges, {len(numbers)} number ranges, {len(spaces)} space ranges, "
        f"{len(lower_runs)} lowercase runs (+{len(lower_multi)} multi), {len(ccc_runs)} ccc runs, "
        f"{len(index)} decompositions, {len(comps)} compositions"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "src/text/unicode_data.cpp"))
    emit(Path(ap.parse_args().out))


if __name__ == "__main__":
    main()
