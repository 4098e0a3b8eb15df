"""Write the tokenizer golden file for tests/unit/test_clip_tokenizer.cpp: for each
test string and BOTH SDXL tokenizers, transformers' CLIPTokenizer ids without
special tokens (`encode(text, add_special_tokens=False)`) and the 77 ids of
`tokenizer(text, padding="max_length", max_length=77, truncation=True)`.

    PYTHONPATH=tests python -m reference.gen_tokenizer_goldens --tokenizer-dir DIR1 --tokenizer-2-dir DIR2 --out FILE.json

DIR1 is a CLIP tokenizer directory with pad token "<|endoftext|>", DIR2 one with
pad token "!" (scripts/export/clip_vocab.py writes both). Local files only.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

MAX_LENGTH = 77


def fixed_strings() -> list[str]:
    s: list[str] = [
        # basics
        "",
        " ",
        "   \t\n  ",
        "a",
        "A",
        "hello world",
        "Hello World",
        "HELLO WORLD",
        "hElLo WoRlD",
        "a photo of a cat",
        "A photograph of an astronaut riding a horse",
        "the quick brown fox jumps over the lazy dog",
        "supercalifragilisticexpialidocious",
        "antidisestablishmentarianism",
        "pneumonoultramicroscopicsilicovolcanoconiosis",
        "xqzvbnmlkjh",
        "photorealistic, 8k, ultra-detailed, octane render",
        "cyberpunk cityscape at night, neon lights, rain",
        # prompt syntax
        "(masterpiece:1.2), [bad]",
        "(masterpiece:1.2), (best quality), ((ultra detailed)), [[blurry]], {hires}",
        "((((extremely detailed))))",
        "(cat:0.5) AND (dog:1.5)",
        "a cat BREAK a dog",
        "portrait of a woman, (freckles:1.3), [smile:frown:0.5], <lora:add_detail:0.8>",
        "score_9, score_8_up, score_7_up, source_anime",
        "embedding:easynegative, lowres, bad anatomy, bad hands, text, error",
        "masterpiece,best quality,1girl,solo,long hair,looking at viewer",
        "(red:1.1)(green:0.9)(blue)",
        "[cat|dog] in a [forest|desert]",
        "a \\(escaped\\) parenthesis",
        "weights like 1.05, 0.95, 1e-3 and -2",
        # contractions
        "it's",
        "It's",
        "IT'S",
        "don't won't can't",
        "we're you've I'm they'll he'd",
        "WE'RE YOU'VE I'M THEY'LL HE'D",
        "'s 't 're 've 'm 'll 'd",
        "''s '''s ''''t",
        "rock'n'roll o'clock",
        "the dog's bone, the dogs' bones",
        "\u2019s curly apostrophe: it\u2019s",
        "'",
        "''",
        "'x",
        "'S",
        # numbers
        "0",
        "123",
        "1234567890",
        "3.14159",
        "1,000,000",
        "2024-01-01",
        "12:30pm",
        "4k 8k 16k",
        "1920x1080",
        "v1.5 sd_xl_base_1.0",
        "#ff00aa",
        "\u00bd \u00b2 \u00b3 \u2153 \u2460 \u2461 \u216b",
        "\u0661\u0662\u0663 \u0967\u0968\u0969",
        "\uff11\uff12\uff13 full-width digits",
        "\U0001d7d8\U0001d7d9 math digits",
        # punctuation
        "!",
        "!!",
        "!!!",
        "hello!",
        "hello!!",
        "wow!!! really?!",
        "!hello",
        "a!b!c",
        "...",
        "?!?!",
        "---",
        "a,b;c:d.e",
        "\"quoted\"",
        "@user #hashtag $100 50% ^_^ &*",
        "<html><body>hi</body></html>",
        "email@example.com",
        "https://example.com/path?q=1&r=2",
        "C:\\Users\\name\\file.txt",
        "~`|\\{}[]<>",
        "_underscore_ and -dash-",
        "\u00bfqu\u00e9? \u00a1s\u00ed!",
        "\u201cfancy quotes\u201d \u2018single\u2019 \u00abguillemets\u00bb",
        "em\u2014dash en\u2013dash \u2026 ellipsis",
        "\u00a9 \u00ae \u2122 \u00a7 \u00b6 \u2020",
        "\u2190\u2192\u2191\u2193 \u2605\u2606 \u2665",
        # HTML entities (kept literally: no ftfy/html unescape in transformers 5)
        "&amp;",
        "Tom &amp; Jerry",
        "&lt;tag&gt; &quot;q&quot; &#39;a&#39; &nbsp;",
        "&#x1F600; &#128512;",
        "fish &amp;amp; chips",
        # whitespace
        "a  b",
        "a\tb",
        "a\nb",
        "a\r\nb",
        "a \t \n b",
        "\n\nleading newlines",
        "trailing spaces   ",
        "   leading spaces",
        "a\u00a0b",
        "a\u3000b",
        "a\u2003b\u2009c",
        "a\u200bb",
        "a\u0085b",
        "a\u2028b\u2029c",
        "a\x0bb\x0cc",
        "a\x1cb\x1fc",
        "tab\there",
        "multiple\n\nparagraphs\n\nhere",
        "a\u180eb",
        "a\u202fb\u205fc",
        "a\x00b",
        "\x07bell",
        # accents, composed and decomposed
        "caf\u00e9",
        "cafe\u0301",
        "CAF\u00c9",
        "CAFE\u0301",
        "na\u00efve r\u00e9sum\u00e9",
        "nai\u0308ve re\u0301sume\u0301",
        "\u00c5ngstr\u00f6m \u212b",
        "A\u030angstro\u0308m",
        "\u2126 ohm vs \u03a9 omega",
        "\u1e69 s-dot-dot",
        "s\u0323\u0307 s\u0307\u0323",
        "q\u0307\u0323 q\u0323\u0307",
        "e\u0301\u0301",
        "\u0301 leading combining mark",
        "a\u0334\u0301\u0345",
        "\u1e9e \u00df stra\u00dfe STRASSE",
        "\u00e6sir \u00c6SIR \u0153uvre \u0152UVRE",
        "\u0130stanbul \u0131s\u0131k",
        "I\u0307",
        "\u01c5 \u01c4 \u01c6 dz digraphs",
        "\ufb01 \ufb02 ligatures",
        "\u00e5\u00e4\u00f6 \u00c5\u00c4\u00d6",
        "\u010d\u0161\u017e \u010c\u0160\u017d",
        "\u0142\u00f3d\u017a \u0141\u00d3D\u0179",
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
        "Tie\u0302\u0301ng Vie\u0323\u0302t",
        "\u0958 \u0915\u093c",
        "\U00011935\U00011930 dives akuru",
        # other scripts
        "\u03b1\u03b2\u03b3 \u0391\u0392\u0393",
        "\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 \u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03cd\u03c2",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
        "\u041c\u041e\u0421\u041a\u0412\u0410 \u043c\u043e\u0441\u043a\u0432\u0430",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
        "\u05e9\u05c1\u05b8\u05dc\u05d5\u05b9\u05dd",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "\u10d2\u10d0\u10db\u10d0\u10e0\u10ef\u10dd\u10d1\u10d0",
        "\u0532\u0561\u0580\u0587",
        "\u1c89\ua7cb\ua7dc new capitals",
        "\U00010d50\U00010d51 garay",
        "\U0001d400\U0001d401 \U0001d41a math bold",
        "\uff21\uff22\uff23 \uff41\uff42\uff43 full-width",
        "\U00010400\U00010428 deseret",
        "\U0001e900\U0001e922 adlam",
        # Chinese, Japanese, Korean
        "\u4f60\u597d\uff0c\u4e16\u754c",
        "\u4e00\u53ea\u53ef\u7231\u7684\u732b\u54aa\u5750\u5728\u7a97\u53f0\u4e0a",
        "\u6c34\u58a8\u753b\uff0c\u5c71\u6c34\uff0c\u9ad8\u6e05",
        "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
        "\u3053\u3093\u306b\u3061\u306f\u4e16\u754c",
        "\u30ab\u30bf\u30ab\u30ca \uff76\uff80\uff76\uff85",
        "\u304b\u3099 \u30cf\u309a",
        "\u6771\u4eac\u30bf\u30ef\u30fc\u306e\u591c\u666f\u3001\u7f8e\u3057\u3044",
        "\uc548\ub155\ud558\uc138\uc694",
        "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
        "\u1100\u1161\u11a8 conjoining jamo",
        "\u1112\u1161\u11ab\u1100\u1173\u11af",
        "\u3131\u314f compatibility jamo",
        "mixed English \u548c\u4e2d\u6587 and \u65e5\u672c\u8a9e and \ud55c\uad6d\uc5b4",
        "\U00020000\U0002a6d6 CJK extension",
        # emoji
        "\U0001f600",
        "\U0001f600\U0001f603\U0001f604",
        "I love it \u2764\ufe0f",
        "\U0001f44d\U0001f3fd thumbs up",
        "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family",
        "\U0001f469\u200d\U0001f4bb coder",
        "\U0001f3f3\ufe0f\u200d\U0001f308 rainbow flag",
        "\U0001f1ef\U0001f1f5 \U0001f1fa\U0001f1f8 flags",
        "\U0001f431\U0001f436\U0001f98a",
        "cat\U0001f431dog\U0001f436",
        "\u263a \u263a\ufe0f \u263a\ufe0e",
        "1\ufe0f\u20e3 keycap",
        "\U0001faf6\U0001f3fb new emoji",
        # special tokens and look-alikes
        "<|startoftext|>",
        "<|endoftext|>",
        "a <|endoftext|> b",
        "a<|endoftext|>b",
        "<|startoftext|>hello<|endoftext|>",
        "<|endoftext|><|endoftext|>",
        "<|ENDOFTEXT|>",
        "<|EndOfText|> x",
        "<|StartOfText|>",
        "<| endoftext |>",
        "<|endoftext",
        "endoftext|>",
        "<|||>",
        "<|>",
        "caf\u00e9<|endoftext|>\u0301",
        "!<|endoftext|>!",
        "</w>",
        "hello</w>world",
        # unusual characters
        "\ufffd replacement",
        "\ue000 private use",
        "\U0010ffff max code point",
        "\u00ad soft hyphen",
        "zero\u200dwidth\u200cjoiners",
        "\ufeffBOM at start",
        "\u2028line separator",
    ]
    # long prompts (more than 75 tokens)
    s.append(
        "masterpiece, best quality, ultra-detailed, illustration, 1girl, solo, long flowing silver hair, "
        "glowing blue eyes, intricate armor with gold filigree, standing on a cliff overlooking a vast "
        "fantasy kingdom at sunset, dramatic clouds, volumetric lighting, god rays, lens flare, depth of "
        "field, bokeh, highly detailed background, castles, waterfalls, floating islands, dragons in the "
        "distance, cinematic composition, artstation trending, by greg rutkowski and alphonse mucha"
    )
    s.append(" ".join(["word"] * 100))
    s.append(" ".join(str(i) for i in range(60)))
    s.append("!" * 200)
    s.append("a, " * 80)
    s.append("\u732b" * 100)
    s.append("\U0001f600" * 40)
    s.append("(" * 90 + "x" + ")" * 90)
    s.append("x" * 300)
    s.append(" ".join(["photo"] * 74))
    s.append(" ".join(["photo"] * 75))
    s.append(" ".join(["photo"] * 76))
    s.append(" ".join(["photo"] * 74) + " <|endoftext|>")
    return s


def random_strings(count: int, seed: int) -> list[str]:
    """Seeded mixtures of the characters above and random code points."""
    rng = random.Random(seed)
    pool = list("abcXYZ019 '!?.,:;()[]<>|\"&-_\t\n") + [
        "'s", "'LL", "<|endoftext|>", "<|ENDOFTEXT|>", "&amp;", "\u3000", "\u00a0", "\u200b",
        "\u00e9", "e\u0301", "\u0130", "\u03a3", "\u0301", "\u0323", "\u0308", "\u1100", "\u1161",
        "\u11a8", "\uac00", "\u4e00", "\u3042", "\u3099", "\uff21", "\u2460", "\U0001f600", "\u200d",
        "\U0001f469", "\ufe0f", "\U0001f3fd", "\ua7cb", "\U00011935", "\U00011930", "\u1ac1", "\u0898",
    ]
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randrange(1, 25)):
            r = rng.random()
            if r < 0.1:
                c = rng.randrange(0x110000)
                parts.append(chr(c) if not 0xD800 <= c <= 0xDFFF else "\ufffd")
            elif r < 0.2:
                parts.append(chr(rng.randrange(0x80, 0x3000)))
            else:
                parts.append(rng.choice(pool))
        out.append("".join(parts))
    return out


def tokenizer_entry(tok, text: str) -> dict:
    ids = tok.encode(text, add_special_tokens=False)
    padded = tok(text, padding="max_length", max_length=MAX_LENGTH, truncation=True).input_ids
    assert len(padded) == MAX_LENGTH, (text, len(padded))
    return {"ids": list(ids), "padded": list(padded)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-dir", required=True, help='CLIP tokenizer directory, pad token "<|endoftext|>"')
    ap.add_argument("--tokenizer-2-dir", required=True, help='CLIP tokenizer directory, pad token "!"')
    ap.add_argument("--out", required=True, help="golden JSON file to write")
    ap.add_argument("--random-count", type=int, default=80, help="extra seeded random strings")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    import tokenizers
    import transformers
    from transformers import CLIPTokenizer

    toks = {
        "tokenizer": CLIPTokenizer.from_pretrained(args.tokenizer_dir, local_files_only=True),
        "tokenizer_2": CLIPTokenizer.from_pretrained(args.tokenizer_2_dir, local_files_only=True),
    }
    transformers.logging.set_verbosity_error()  # "sequence longer than 77" warnings are expected
    strings = fixed_strings() + random_strings(args.random_count, args.seed)
    cases = [{"text": text, **{name: tokenizer_entry(tok, text) for name, tok in toks.items()}} for text in strings]
    golden = {
        "generated_by": "tests/reference/gen_tokenizer_goldens.py",
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "max_length": MAX_LENGTH,
        "tokenizers": {
            name: {
                "pad_token": tok.pad_token,
                "pad_id": tok.pad_token_id,
                "bos_id": tok.bos_token_id,
                "eos_id": tok.eos_token_id,
                "vocab_size": len(tok.get_vocab()),
            }
            for name, tok in toks.items()
        },
        "cases": cases,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(cases)} strings x 2 tokenizers")


if __name__ == "__main__":
    main()
