"""Python reference of the A1111 (stable-diffusion-webui) prompt rules that
src/text/prompt_parser.cpp and src/text/prompt_chunks.cpp implement, and the
writer of their golden file.

Ported from stable-diffusion-webui:
  modules/prompt_parser.py   parse_prompt_attention (re_attention, re_break)
  modules/sd_hijack_clip.py  tokenize_line (75-token chunks, comma backtrack 20,
                             BREAK), empty_chunk, process_tokens (ids after the
                             first end token become the pad id)
Deviations from A1111, all of them places where A1111 would raise or produce a
non-finite weight (the C++ side must never throw on a prompt):
  * a weight that float() rejects (":1.2.3)", ":.)") or whose magnitude exceeds
    the float32 range is kept as literal text, like a weight outside any "(";
  * a product of weights beyond the float32 range is clamped to +-FLT_MAX.
Warnings (A1111 has none) name the code-point position and what was odd.

    PYTHONPATH=tests python -m reference.prompt_reference --tokenizer-dir D1 --tokenizer-2-dir D2 --out FILE.json

D1 is a CLIP tokenizer directory with pad token "<|endoftext|>", D2 one with pad
token "!" (scripts/export/clip_vocab.py writes both). Local files only.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

CHUNK_LENGTH = 75
COMMA_PADDING_BACKTRACK = 20  # A1111 opts.comma_padding_backtrack default
FLT_MAX = 3.4028234663852886e38

# A1111's regexes, verbatim.
re_attention = re.compile(
    r"""
\\\(|
\\\)|
\\\[|
\\]|
\\\\|
\\|
\(|
\[|
:\s*([+-]?[.\d]+)\s*\)|
\)|
]|
[^\\()\[\]:]+|
:
""",
    re.X,
)

re_break = re.compile(r"\s*\bBREAK\b\s*", re.S)

ROUND_MULTIPLIER = 1.1
SQUARE_MULTIPLIER = 1 / 1.1


def _shown(s: str) -> str:
    return s if len(s) <= 24 else s[:20] + "..."


def _parse_weight(s: str) -> float | None:
    """float(s) as A1111 calls it, or None where that raises or leaves the float32 range."""
    try:
        v = float(s)
    except ValueError:
        return None
    return v if abs(v) <= FLT_MAX else None


def parse_prompt_attention_ex(text: str) -> tuple[list[list], list[tuple[int, str]]]:
    """A1111's parse_prompt_attention plus warnings.

    Returns ([[text, weight], ...] exactly as A1111, BREAK as ["BREAK", -1]) and
    [(position, message), ...] sorted by position (code points, 0-based).
    """
    res: list[list] = []
    break_positions: dict[int, int] = {}  # res index of a BREAK entry -> position of the word
    round_brackets: list[tuple[int, int]] = []  # (res index, position of "(")
    square_brackets: list[tuple[int, int]] = []
    warnings: list[tuple[int, str]] = []
    clamped_before = False

    def multiply_range(start_position: int, multiplier: float, at: int) -> None:
        nonlocal clamped_before
        clamped = False
        for p in range(start_position, len(res)):
            w = res[p][1] * multiplier
            if abs(w) > FLT_MAX:
                w = FLT_MAX if w > 0 else -FLT_MAX
                clamped = True
            res[p][1] = w
        if clamped and not clamped_before:  # said once per prompt
            warnings.append((at, "emphasis weight exceeds the float range, clamped"))
            clamped_before = True

    def append_text(part_text: str, at: int) -> None:
        parts = re_break.split(part_text)
        if len(parts) > 1:
            starts = [at + bm.start() + bm.group(0).index("BREAK") for bm in re_break.finditer(part_text)]
        for i, part in enumerate(parts):
            if i > 0:
                break_positions[len(res)] = starts[i - 1]
                res.append(["BREAK", -1])
            res.append([part, 1.0])

    for m in re_attention.finditer(text):
        chunk = m.group(0)
        weight = m.group(1)
        at = m.start()

        if chunk.startswith("\\"):
            if chunk == "\\":
                warnings.append((at, "stray '\\' dropped (it escapes only ( ) [ ] \\)"))
            res.append([chunk[1:], 1.0])
        elif chunk == "(":
            round_brackets.append((len(res), at))
        elif chunk == "[":
            square_brackets.append((len(res), at))
        elif weight is not None and round_brackets and _parse_weight(weight) is not None:
            multiply_range(round_brackets.pop()[0], _parse_weight(weight), at)
        elif chunk == ")" and round_brackets:
            multiply_range(round_brackets.pop()[0], ROUND_MULTIPLIER, at)
        elif chunk == "]" and square_brackets:
            multiply_range(square_brackets.pop()[0], SQUARE_MULTIPLIER, at)
        else:
            if weight is not None:
                if not round_brackets:
                    warnings.append((at, f"weight '{_shown(chunk)}' closes no '(' (kept as text)"))
                else:
                    warnings.append((at, f"weight '{_shown(weight)}' is not a usable number (kept as text)"))
            elif chunk == ")":
                warnings.append((at, "unmatched ')' (kept as text)"))
            elif chunk == "]":
                warnings.append((at, "unmatched ']' (kept as text)"))
            append_text(chunk, at)

    for pos, at in round_brackets:
        warnings.append((at, "unclosed '(' (x1.1 applied to the rest)"))
        multiply_range(pos, ROUND_MULTIPLIER, at)

    for pos, at in square_brackets:
        warnings.append((at, "unclosed '[' (/1.1 applied to the rest)"))
        multiply_range(pos, SQUARE_MULTIPLIER, at)

    for index, at in break_positions.items():
        if res[index][1] != -1:
            warnings.append((at, "BREAK inside brackets is read as the word 'BREAK', not a chunk break"))

    if len(res) == 0:
        res = [["", 1.0]]

    # merge runs of identical weights
    i = 0
    while i + 1 < len(res):
        if res[i][1] == res[i + 1][1]:
            res[i][0] += res[i + 1][0]
            res.pop(i + 1)
        else:
            i += 1

    warnings.sort(key=lambda w: w[0])
    return res, warnings


def parse_prompt_attention(text: str) -> list[list]:
    """Exactly A1111's return value (for well-formed prompts)."""
    return parse_prompt_attention_ex(text)[0]


def is_break(fragment: list) -> bool:
    return fragment[0] == "BREAK" and fragment[1] == -1


class Chunker:
    """A1111's FrozenCLIPEmbedderWithCustomWordsBase.tokenize_line for one tokenizer
    (transformers' CLIPTokenizer), without textual-inversion embeddings."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.comma_token = tokenizer.get_vocab().get(",</w>", None)
        self.id_start = tokenizer.bos_token_id
        self.id_end = tokenizer.eos_token_id
        self.id_pad = tokenizer.pad_token_id

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer(texts, truncation=False, add_special_tokens=False)["input_ids"]

    def empty_chunk(self) -> tuple[list[int], list[float]]:
        tokens = [self.id_start] + [self.id_end] * (CHUNK_LENGTH + 1)
        return self._pad_after_end(tokens), [1.0] * (CHUNK_LENGTH + 2)

    def _pad_after_end(self, tokens: list[int]) -> list[int]:
        # process_tokens: SD2/SDXL-bigG pad differs from end; everything after the
        # first end token becomes the pad id.
        if self.id_end != self.id_pad:
            index = tokens.index(self.id_end)
            tokens = tokens[: index + 1] + [self.id_pad] * (len(tokens) - index - 1)
        return tokens

    def tokenize_line(self, line: str) -> tuple[list[tuple[list[int], list[float]]], list[int], int]:
        """(chunks as (ids[77], multipliers[77]), tokens used per chunk, A1111's token_count)."""
        parsed = parse_prompt_attention(line)
        tokenized = self.tokenize([text for text, _ in parsed])

        chunks: list[tuple[list[int], list[float]]] = []
        used: list[int] = []
        tokens_: list[int] = []
        mults_: list[float] = []
        token_count = 0
        last_comma = -1

        def next_chunk(is_last: bool = False) -> None:
            nonlocal token_count, last_comma, tokens_, mults_
            token_count += len(tokens_) if is_last else CHUNK_LENGTH
            used.append(len(tokens_))
            to_add = CHUNK_LENGTH - len(tokens_)
            if to_add > 0:
                tokens_ += [self.id_end] * to_add
                mults_ += [1.0] * to_add
            ids = [self.id_start] + tokens_ + [self.id_end]
            mults = [1.0] + mults_ + [1.0]
            last_comma = -1
            chunks.append((self._pad_after_end(ids), mults))
            tokens_, mults_ = [], []

        for tokens, (text, weight) in zip(tokenized, parsed):
            if text == "BREAK" and weight == -1:
                next_chunk()
                continue

            position = 0
            while position < len(tokens):
                token = tokens[position]

                if token == self.comma_token:
                    last_comma = len(tokens_)
                elif (
                    COMMA_PADDING_BACKTRACK != 0
                    and len(tokens_) == CHUNK_LENGTH
                    and last_comma != -1
                    and len(tokens_) - last_comma <= COMMA_PADDING_BACKTRACK
                ):
                    break_location = last_comma + 1
                    reloc_tokens = tokens_[break_location:]
                    reloc_mults = mults_[break_location:]
                    tokens_ = tokens_[:break_location]
                    mults_ = mults_[:break_location]
                    next_chunk()
                    tokens_ = reloc_tokens
                    mults_ = reloc_mults

                if len(tokens_) == CHUNK_LENGTH:
                    next_chunk()

                tokens_.append(token)
                mults_.append(weight)
                position += 1

        if tokens_ or not chunks:
            next_chunk(is_last=True)

        return chunks, used, token_count


def pad_chunks(chunker: Chunker, chunks: list, count: int) -> list:
    return chunks + [chunker.empty_chunk() for _ in range(count - len(chunks))]


# --- goldens ---------------------------------------------------------------


def _words(n: int, word: str = "cat") -> str:
    return " ".join([word] * n)


def fixed_prompts() -> list[str]:
    p: list[str] = [
        # A1111's doctest examples
        "normal text",
        "an (important) word",
        "(unbalanced",
        "\\(literal\\]",
        "(unnecessary)(parens)",
        "a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
        # weights and nesting
        "(masterpiece:1.2), best quality, [blurry]",
        "(a:1.5) (b:0.5) (c:1) (d:-1) (e:+2) (f:.5) (g:2.)",
        "(spaced : 1.3 ) word",
        "(tab\t:\t0.8\t)",
        "((nested (deep:1.2)) [[twice]])",
        "[[[very small]]]",
        "((((((many))))))",
        "(a [b (c [d] e) f] g)",
        "(same)(same)[other][other]",
        "(red:1.1)(green:0.9)(blue)",
        "(weight with digits ١.٥:١.٥)",
        "(fullwidth:１.２)",
        "(zero:0) and (neg:-0.5)",
        "(x:00001.5000)",
        # escapes
        "a \\(escaped\\) parenthesis and \\[square\\]",
        "back\\\\slash and \\\\(weighted)",
        "a stray \\ backslash and \\n",
        "trailing backslash \\",
        "\\(not weighted:1.2\\)",
        # unbalanced and odd syntax
        "unmatched ) close",
        "unmatched ] close",
        "(open round [open square",
        "[open square (open round",
        "))(([[",
        "(crossed [brackets) here]",
        "weight outside:1.2) parens",
        "(bad number:1.2.3) tail",
        "(dot only:.) tail",
        "(plus only:+) tail",
        "(two colons:1:2)",
        "[a:b:0.5] prompt editing stays text",
        "[cat|dog] alternation stays text",
        "(huge:99999999999999999999999999999999999999999999) tail",
        "((a:10000000000000000000000000000000000000):10000000000000000000000000000000000000)",
        "colon: in text, time 12:30",
        "(only colon:)",
        "()",
        "[]",
        "(:1.2)",
        # BREAK
        "a cat BREAK a dog",
        "BREAK at start",
        "at end BREAK",
        "BREAK",
        "double BREAK BREAK break",
        "a BREAKING news BREAK_not BREAK, yes",
        "aBREAK BREAKb",
        "(weighted BREAK inside) text",
        "(BRE:-1)(AK:-1) merged into a break",
        "line\nBREAK\nline",
        "BREAK BREAK BREAK",
        # Chinese, emoji, other scripts, whitespace
        "一只可爱的猫咪，(坐在窗台上:1.3)，[模糊]",
        "猫BREAK狗 BREAK 鸟",
        "🐱 cat (🐶:1.2) 🎉🎉",
        "👨‍👩‍👧 family, (🏳️‍🌈:0.8)",
        "Привет, (мир:1.1)",
        "",
        " ",
        "   \t\n  ",
        "\u3000ideographic space\u3000BREAK\u3000x",
        "<|endoftext|> inside (the prompt:1.2) tail",
        "wow!! (bang!:1.1)",
    ]

    # Long prompts: one token per word, so positions are known exactly.
    p += [
        _words(74),
        _words(75),
        _words(76),
        _words(150),
        _words(151),
        _words(300),
        _words(320, "dog"),
        _words(75) + " BREAK " + _words(3, "dog"),
        _words(74) + " BREAK BREAK " + _words(3, "dog"),
        "(" + _words(100) + ":1.3) " + _words(60, "dog"),
        "[" + _words(70) + ", " + _words(30, "dog") + "]",
    ]
    # A comma at chunk index k followed by more words: A1111 moves the words after
    # the comma to the next chunk when 75 - k <= 20.
    for k in (50, 54, 55, 56, 60, 73, 74):
        p.append(_words(k) + ", " + _words(40, "dog"))
    p.append(_words(75) + ", " + _words(10, "dog"))  # comma as the 76th token
    p.append(_words(60) + ", " + _words(10, "dog") + ", " + _words(40, "bird"))  # two commas
    p.append(", ".join(["masterpiece", "best quality", "ultra detailed", "8k"] * 20))  # many commas
    p.append(",".join(["tag"] * 200))  # dense commas
    p.append(_words(70) + " (weighted words near the end:1.4), " + _words(20, "dog"))
    p.append(_words(60) + ", " + _words(30, "dog") + " BREAK " + _words(80, "bird"))
    p.append("一只猫，" * 60)
    p.append("🐱" * 200)
    return p


RANDOM_ALPHABET = [
    "cat", "dog", " ", " ", ", ", ",", "(", ")", "[", "]", ":", "1.2", ":0.5)", ":1.2.3)", "\\", "\\(",
    "\\)", "BREAK", " BREAK ", "猫", "🐱", "\t", "-", "+", ".", "!", "<|endoftext|>", "a", "BREAKx",
    "\u3000", "\u00a0", "\u2028", "\x1c", "_", "é", "١", "５", "0", "\n",
]


def random_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.choice([3, 8, 20, 60, 150])
        out.append("".join(rng.choice(RANDOM_ALPHABET) for _ in range(n)))
    return out


def golden_case(prompt: str, chunkers: dict[str, Chunker]) -> dict:
    fragments, warnings = parse_prompt_attention_ex(prompt)
    case = {
        "prompt": prompt,
        "fragments": [[t, w, is_break([t, w])] for t, w in fragments],
        "warnings": [[pos, msg] for pos, msg in warnings],
    }
    for name, chunker in chunkers.items():
        chunks, used, token_count = chunker.tokenize_line(prompt)
        case[name] = {
            "chunks": [{"ids": ids, "multipliers": mults} for ids, mults in chunks],
            "used": used,
            "token_count": token_count,
        }
    return case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-dir", required=True, help='CLIP tokenizer directory, pad token "<|endoftext|>"')
    ap.add_argument("--tokenizer-2-dir", required=True, help='CLIP tokenizer directory, pad token "!"')
    ap.add_argument("--out", required=True, help="golden JSON file to write")
    ap.add_argument("--random-count", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    import transformers
    from transformers import CLIPTokenizer

    transformers.logging.set_verbosity_error()  # "sequence longer than 77" warnings are expected
    chunkers = {
        "tokenizer": Chunker(CLIPTokenizer.from_pretrained(args.tokenizer_dir, local_files_only=True)),
        "tokenizer_2": Chunker(CLIPTokenizer.from_pretrained(args.tokenizer_2_dir, local_files_only=True)),
    }
    prompts = fixed_prompts() + random_prompts(args.random_count, args.seed)
    golden = {
        "source": "tests/reference/prompt_reference.py (A1111 parse_prompt_attention + tokenize_line)",
        "chunk_length": CHUNK_LENGTH,
        "comma_padding_backtrack": COMMA_PADDING_BACKTRACK,
        "empty_chunk": {name: c.empty_chunk()[0] for name, c in chunkers.items()},
        "cases": [golden_case(p, chunkers) for p in prompts],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(prompts)} prompts x 2 tokenizers")


if __name__ == "__main__":
    main()
