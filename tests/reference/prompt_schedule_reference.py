"""Python reference of A1111's prompt editing and alternation ([from:to:when],
[to:when], [from::when], [a|b|c]) that src/text/prompt_schedule.cpp implements,
and the writer of its golden file.

Written from stable-diffusion-webui modules/prompt_parser.py
(get_learned_conditioning_prompt_schedules): the lark grammar below is A1111's,
parsed as A1111 parses it (lark's Earley parser, its dynamic lexer, ambiguities
resolved by lark); the step rule is A1111's current one (a `when` written with
a decimal point is a fraction of the steps, an integer a step number; the hires
pass has its own steps, with an integer counted after the first pass's steps
and a fraction after 1.0). A prompt lark cannot parse is one entry of the whole
prompt as written, as in A1111. Where A1111 raises (a `when` whose step is
infinite: int() of inf) the golden says "error".

    /path/to/python-with-lark -m reference.prompt_schedule_reference --out tests/reference/prompt_schedule_goldens.json

lark is not in requirements.txt: the goldens are committed, and the unit test
(PromptSchedule.Goldens) reads them; rerun this with lark installed when the
corpus (prompt_schedule_corpus.json) changes.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

GRAMMAR = r"""
!start: (prompt | /[][():]/+)*
prompt: (emphasized | scheduled | alternate | plain | WHITESPACE)*
!emphasized: "(" prompt ")"
        | "(" prompt ":" prompt ")"
        | "[" prompt "]"
scheduled: "[" [prompt ":"] prompt ":" [WHITESPACE] NUMBER [WHITESPACE] "]"
alternate: "[" prompt ("|" [prompt])+ "]"
WHITESPACE: /\s+/
plain: /([^\\\[\]():|]|\\.)+/
%import common.SIGNED_NUMBER -> NUMBER
"""

CORPUS = Path(__file__).with_name("prompt_schedule_corpus.json")


class StepOverflow(Exception):
    """A `when` whose step is infinite: A1111's int() raises OverflowError."""


def schedule(parser, prompt: str, base_steps: int, hires_steps: int | None) -> list[list]:
    """[[end_at_step, text], ...] as A1111's get_learned_conditioning_prompt_schedules."""
    import lark

    if hires_steps is None:
        int_offset, flt_offset, steps = 0, 0.0, base_steps
    else:
        int_offset, flt_offset, steps = base_steps, 1.0, hires_steps
    try:
        tree = parser.parse(prompt)
    except lark.exceptions.LarkError:
        return [[steps, prompt]]

    res = {steps}

    class CollectSteps(lark.Visitor):
        def scheduled(self, t):
            s = t.children[-2]
            v = float(s)
            v = (v - flt_offset) * steps if "." in s else v - int_offset
            if math.isinf(v):
                raise StepOverflow(s)
            t.children[-2] = min(steps, int(v))
            if t.children[-2] >= 1:
                res.add(t.children[-2])

        def alternate(self, t):
            res.update(range(1, steps + 1))

    CollectSteps().visit(tree)

    def at_step(step):
        class AtStep(lark.Transformer):
            def scheduled(self, args):
                before, after, _, when, _ = args
                yield before or () if step <= when else after

            def alternate(self, args):
                args = ["" if not arg else arg for arg in args]
                yield args[(step - 1) % len(args)]

            def start(self, args):
                def flatten(x):
                    if isinstance(x, str):
                        yield x
                    else:
                        for gen in x:
                            yield from flatten(gen)

                return "".join(flatten(args))

            def plain(self, args):
                yield args[0].value

            def __default__(self, data, children, meta):
                for child in children:
                    yield child

        return AtStep().transform(tree)

    return [[t, at_step(t)] for t in sorted(res)]


def main() -> None:
    import lark

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    parser = lark.Lark(GRAMMAR)
    cases = []
    for c in json.loads(CORPUS.read_text(encoding="utf-8")):
        hires = c.get("hires_steps")
        case = {"prompt": c["prompt"], "steps": c["steps"], "hires_steps": hires}
        try:
            case["schedule"] = schedule(parser, c["prompt"], c["steps"], hires)
        except StepOverflow:
            case["error"] = True
        cases.append(case)
    Path(a.out).write_text(json.dumps({"lark": lark.__version__, "cases": cases}, ensure_ascii=False, indent=1) + "\n",
                           encoding="utf-8")


if __name__ == "__main__":
    main()
