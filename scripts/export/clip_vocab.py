"""Build a CLIP BPE tokenizer directory (vocab.json + merges.txt) from the merges
file that open-clip-torch ships, exactly as CLIP's simple_tokenizer builds its
vocabulary: 256 byte symbols, the same with '</w>', one entry per merge, then
<|startoftext|> and <|endoftext|> (49408 entries).

Used by the export (export.sdxl_sources) and scripts/fuzz.sh; importable, and runnable
(it imports nothing from the package):
    python scripts/export/clip_vocab.py OUT_DIR [--pad-token '!']
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
from pathlib import Path

VOCAB_SIZE = 49408


def bytes_to_unicode() -> dict[int, str]:
    """CLIP/GPT-2 byte -> printable unicode map (same order as CLIP's)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def open_clip_merges_path() -> Path:
    # find_spec locates the package without importing it (open_clip pulls in timm etc.).
    import importlib.util

    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("open-clip-torch is not installed (pip install -r requirements.txt)")
    p = Path(list(spec.submodule_search_locations)[0]) / "bpe_simple_vocab_16e6.txt.gz"
    if not p.is_file():
        raise FileNotFoundError(f"open_clip merges file not found at {p}")
    return p


def load_merges(path: Path | None = None) -> list[tuple[str, str]]:
    path = path or open_clip_merges_path()
    lines = gzip.open(path).read().decode("utf-8").split("\n")
    lines = lines[1 : 49152 - 256 - 2 + 1]
    return [tuple(line.split()) for line in lines]  # type: ignore[misc]


def build_vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    symbols = list(bytes_to_unicode().values())
    symbols = symbols + [s + "</w>" for s in symbols]
    symbols += ["".join(m) for m in merges]
    symbols += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {s: i for i, s in enumerate(symbols)}
    assert len(vocab) == VOCAB_SIZE, len(vocab)
    return vocab


def write_clip_tokenizer(out_dir: str | Path, pad_token: str = "<|endoftext|>") -> dict:
    """Write vocab.json, merges.txt and a transformers-readable tokenizer config."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    merges = load_merges()
    vocab = build_vocab(merges)
    with open(out / "vocab.json", "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(out / "merges.txt", "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write(f"{a} {b}\n")
    cfg = {
        "tokenizer_class": "CLIPTokenizer",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": pad_token,
        "model_max_length": 77,
        "do_lower_case": True,
    }
    with open(out / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    with open(out / "special_tokens_map.json", "w", encoding="utf-8") as f:
        json.dump({k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")}, f, ensure_ascii=False, indent=1)
    return {"vocab_size": len(vocab), "pad_token": pad_token, "pad_id": vocab[pad_token]}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--pad-token", default="<|endoftext|>")
    a = ap.parse_args()
    print(json.dumps(write_clip_tokenizer(a.out_dir, a.pad_token)))
